"""Simulated machines for the launcher tests: Linux network namespaces.

A launcher's rendezvous store (torchrun's) listens on every interface, so even a
one-node launcher run goes into a namespace whose only interface is loopback
(``isolated_node_command``). ``TwoNodes`` gives two namespaces joined by a veth
pair, each with its own hostname, /etc/hosts and /tmp: two hosts on one network
that share only the file system outside /tmp (and the test's working directory).
Everything needs root, ``ip`` (iproute2) and util-linux's ``unshare``.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

# Brings lo up, then becomes argv: the namespace lives as long as argv's processes do.
_LO_UP = 'ip link set lo up && exec "$@"'

# Runs in a node's own mount and UTS namespaces (after ``ip netns exec``): its hostname
# and /etc/hosts, a tmpfs over /tmp, and the paths given before ``--`` bound back from
# the real /tmp if they are under it (the working directory, this Python's venv and
# the project: a checkout under /tmp, as CI's may be, must stay runnable).
_NODE_SCRIPT = """set -e
mount --bind "$1" /etc/hosts
echo "$2" > /proc/sys/kernel/hostname
shift 2
mount --bind /tmp /mnt
mount -t tmpfs tmpfs /tmp
while [ "$1" != -- ]; do
  case "$1" in /tmp/*) mkdir -p "$1" && mount --no-canonicalize --bind "/mnt${1#/tmp}" "$1";; esac
  shift
done
shift
umount -l /mnt
exec "$@"
"""
# What every node needs from the machine's /tmp, besides its working directory.
_SHARED_PATHS = [os.path.realpath(Path(__file__).resolve().parents[2]), os.path.realpath(sys.prefix)]

_instances = itertools.count()

# The torchrun of this Python's environment.
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def isolated_node_command(argv: Sequence[str]) -> list[str]:
    """``argv`` run in a fresh network namespace whose only interface is ``lo`` (up).

    Nothing it listens on is reachable from outside it, even on 0.0.0.0. The file
    system, /tmp and the hostname are the machine's.
    """
    return ["unshare", "--net", "sh", "-c", _LO_UP, "sh", *argv]


@functools.cache
def namespaces_unavailable() -> str | None:
    """Why these helpers cannot run here (a skip reason), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    probe = subprocess.run(isolated_node_command(["true"]), capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --net failed: {probe.stderr.strip()}"
    name = f"ddp-probe-{os.getpid()}"
    added = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if added.returncode != 0:
        return f"ip netns add failed: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], check=True)
    return None


def _netns_pids(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


class TwoNodes:
    """Two simulated hosts, node 0 and node 1, on a network of their own.

    Node ``i`` is the namespace ``name(i)``, host ``hostname(i)`` at ``address(i)`` on
    interface ``interface(i)``. Both hosts' /etc/hosts name both, so hostnames resolve
    the way they do on a cluster (the machine's own hostname resolves to 127.0.0.1,
    which a peer cannot use). The two namespaces see no other network, so every
    instance may use the same addresses (10.77.0.1 and 10.77.0.2) without clashing.
    Send traffic to them only from inside the namespaces: from the machine's own
    namespace that range is routed off the machine.
    """

    def __init__(self) -> None:
        tag = f"{os.getpid()}-{next(_instances)}"
        self._names = [f"ddp-{tag}-node{node}" for node in (0, 1)]
        self._processes: list[subprocess.Popen[Any]] = []
        self._dir = Path(tempfile.mkdtemp(prefix="ddp-nodes-"))
        self._created: list[str] = []

    def name(self, node: int) -> str:
        """The network namespace's name (``ip netns exec NAME ...``)."""
        return self._names[node]

    def address(self, node: int) -> str:
        return f"10.77.0.{node + 1}"

    def interface(self, node: int) -> str:
        """The veth end in this node (the value for ``GLOO_SOCKET_IFNAME``)."""
        return f"veth{node}"

    def hostname(self, node: int) -> str:
        return f"node{node}"

    def __enter__(self) -> TwoNodes:
        try:
            for name in self._names:
                subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
                self._created.append(name)
            # Both ends made straight inside their namespaces: no name in the machine's own.
            subprocess.run(
                ["ip", "link", "add", self.interface(0), "netns", self._names[0], "type", "veth",
                 "peer", "name", self.interface(1), "netns", self._names[1]],
                check=True, capture_output=True,
            )  # fmt: skip
            for node, name in enumerate(self._names):
                inside = ["ip", "-n", name]
                subprocess.run([*inside, "link", "set", "lo", "up"], check=True)
                subprocess.run([*inside, "addr", "add", f"{self.address(node)}/24", "dev", self.interface(node)],
                               check=True)  # fmt: skip
                subprocess.run([*inside, "link", "set", self.interface(node), "up"], check=True)
            hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
            hosts += [f"{self.address(node)} {self.hostname(node)}" for node in (0, 1)]
            (self._dir / "hosts").write_text("\n".join(hosts) + "\n")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def popen(
        self,
        node: int,
        argv: Sequence[str],
        cwd: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        tmp: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` on ``node`` in ``cwd``, with the node's hostname and a private /tmp.

        ``cwd`` stays visible (and shared with the other node) even under /tmp. ``tmp``: a
        folder of the machine's, the node's TMPDIR, visible there too (what the node left in
        it can be read once the node is gone). Extra keyword arguments go to
        ``subprocess.Popen`` (``text=True``, ...).
        """
        cwd = os.path.realpath(cwd)
        visible = {*_SHARED_PATHS, cwd}
        if tmp is not None:
            tmp = os.path.realpath(tmp)
            visible.add(tmp)
            env = {**(os.environ if env is None else env), "TMPDIR": tmp}
        command = ["ip", "netns", "exec", self._names[node],
                   "unshare", "--mount", "--uts", "--propagation", "private",
                   "sh", "-c", _NODE_SCRIPT, "sh", str(self._dir / "hosts"), self.hostname(node),
                   *sorted(visible), "--",
                   *argv]  # fmt: skip
        process = subprocess.Popen(
            command, cwd=cwd, env=None if env is None else dict(env), stdout=stdout, stderr=stderr, **kwargs
        )
        self._processes.append(process)
        return process

    def run(self, node: int, argv: Sequence[str], cwd: str | os.PathLike[str], timeout: float = 60,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run ``argv`` on ``node`` to its end; its output as text."""
        process = self.popen(node, argv, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def torchrun(
        self, argv: Sequence[str], cwd: str | os.PathLike[str], tmp: Sequence[Path] = (), **kwargs: Any
    ) -> list[subprocess.Popen[Any]]:
        """Start one torchrun agent on each node (``--nnodes=2``, 2 processes each, node 0's
        store), each running ``argv`` (a program: ``--no-python``); ``tmp``: each node's TMPDIR,
        if given (``popen``); keyword arguments go to ``popen``. The agents, node 0's first."""
        # Both namespaces are new: nothing listens there, so any port is free; it is drawn,
        # not fixed, as every test here must.
        port = random.randrange(20000, 60000)
        agents = []
        for node in (0, 1):
            torchrun = [TORCHRUN, "--nnodes=2", "--nproc-per-node=2", f"--node-rank={node}",
                        f"--master-addr={self.hostname(0)}", f"--master-port={port}", "--no-python"]  # fmt: skip
            agents.append(self.popen(node, [*torchrun, *argv], cwd, tmp=tmp[node] if tmp else None, **kwargs))
        return agents

    def pids(self) -> list[int]:
        """Every process now in either node (as ``ip netns pids`` sees them)."""
        return [pid for name in self._created for pid in _netns_pids(name)]

    def close(self, timeout: float = 10) -> None:
        """SIGKILL whatever still runs in the nodes, then delete them; check nothing is left."""
        for process in self._processes:
            if process.poll() is None:
                process.kill()  # may not have entered its namespace yet
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {pids} outlived SIGKILL in namespaces {self._created}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)  # a poll interval: the kernel reaps asynchronously
        for process in self._processes:
            process.wait()
        for name in self._created:
            subprocess.run(["ip", "netns", "delete", name], check=True)
        left = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        if stale := left & set(self._created):
            raise RuntimeError(f"namespaces {sorted(stale)} left after delete")
        self._created = []
        shutil.rmtree(self._dir, ignore_errors=True)

"""An MPI group: N ranks of one ``MPI.COMM_WORLD``, started by an MPI launcher.

The ranks of an MPI world must be started by the MPI library's launcher: it
hands each process what ``MPI_Init`` needs (MPICH's ``PMI_FD``, ``PMI_RANK``).
So the controller does not fork them; it runs the launcher, in a session of its
own and told by the kernel to die with the controller, and each process the
launcher starts is a *stand-in* (:mod:`pytest_ddp.rank.mpi_standin`) that forks the
rank.  What the rest of the plugin sees is a :class:`~pytest_ddp.groups.group.RankGroup`:
the same event logs, output files, stack dumps and commands.

- The link between controller and rank is a Unix socket in Linux's abstract
  namespace (no file to leave behind, no network address; a path would not fit
  the 108 bytes of a socket's name under pytest's basetemp); each rank's connection carries its
  commands one way and its wake-up bytes the other, like a forked rank's pipes.
- A rank's end is told by its stand-in (exit status and time of death), or by
  the end of the connection if the stand-in itself was killed.
- The default launcher is MPICH's ``mpiexec.gforker``, installed with MPICH next
  to ``mpiexec``: it starts the processes of one machine and listens on no
  socket.  MPICH's ``mpiexec`` (hydra) listens on every interface for its
  proxies, which a test machine's rules may forbid; ``--ddp-mpi-launcher`` picks
  another launcher (hydra, Open MPI's ``mpirun``).  Without MPICH, ``mpiexec`` on
  PATH is used: Open MPI's gets the options it needs to start a test's world.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import select
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pytest_ddp.common import prctl
from pytest_ddp.common.protocol import parse_exit_message
from pytest_ddp.groups.group import GroupStartError, RankGroup
from pytest_ddp.groups.spawn import RankProcess

# Tried in order, next to this Python (a venv's MPICH from PyPI) and then on PATH.
DEFAULT_LAUNCHERS = ("mpiexec.gforker", "mpiexec")
# Keeps an MPI library's network transport on loopback when it opens one at all
# (UCX, which MPICH from PyPI and Open MPI use, listens on every interface otherwise).
# Open MPI's TCP transport listens on every interface whatever interfaces it is told
# to use, and so does another of its transports (measured, 4.1): its ranks, on one
# machine, talk through shared memory alone.
LOOPBACK_ENVIRONMENT = {
    "UCX_NET_DEVICES": "lo",
    "FI_TCP_IFACE": "lo",
    "FI_SOCKETS_IFACE": "lo",
    "OMPI_MCA_btl": "self,vader",
}


def find_launcher(command: str | None) -> list[str] | None:
    """The launcher's command line up to ``-n N``: the option's value if given (``mpirun
    --oversubscribe``), as written; else the first of DEFAULT_LAUNCHERS found, with the
    options Open MPI's needs (:func:`open_mpi_options`); None if none is found."""
    if command:
        return shlex.split(command)
    for name in DEFAULT_LAUNCHERS:
        beside = Path(sys.executable).parent / name
        found = str(beside) if beside.exists() else shutil.which(name)
        if found:
            if name == "mpiexec.gforker":  # MPICH's alone
                return [found]
            return [found, *open_mpi_options(_version(found), root=os.geteuid() == 0)]
    return None


def open_mpi_options(version: str, root: bool) -> list[str]:
    """What Open MPI's launcher needs to start a test's world, from its ``--version``:
    ``--oversubscribe`` (it refuses more ranks than cores) and, as root (a container's CI),
    ``--allow-run-as-root`` (it refuses root). Nothing for other launchers. The plugin chose
    this launcher, so the plugin says so; a launcher named by the user is used as written."""
    if "Open MPI" not in version and "OpenRTE" not in version:
        return []
    return ["--oversubscribe", *(["--allow-run-as-root"] if root else [])]


@functools.cache
def _version(launcher: str) -> str:
    """The launcher's ``--version`` output ("mpirun (Open MPI) 4.1.4"); "" if it gives none."""
    try:
        done = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


def mpi_unavailable(command: str | None) -> str | None:
    """Why MPI tests cannot run here (they are skipped saying so), or None."""
    if importlib.util.find_spec("mpi4py") is None:
        return "backend='mpi' needs mpi4py and an MPI library: pip install 'pytest-ddp[mpi]'"
    launcher = find_launcher(command)
    if launcher is None:
        return f"backend='mpi' needs an MPI launcher: none of {', '.join(DEFAULT_LAUNCHERS)} found"
    if shutil.which(launcher[0]) is None:
        return f"backend='mpi': the MPI launcher {launcher[0]!r} (--ddp-mpi-launcher) is not found"
    return None


@dataclass
class LaunchedProcess:
    """A rank the launcher started, in the shape the group uses of a forked rank's Process."""

    pid: int | None = None  # known once the rank has said hello
    exitcode: int | None = None  # told by its stand-in

    def kill(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def join(self, timeout: float | None = None) -> None:
        """Wait until the process has ended (it is not our child: a pidfd tells)."""
        if self.pid is None:
            return
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return
        try:
            select.select([fd], [], [], timeout)
        finally:
            os.close(fd)


def _shared_memory_of(pid: int) -> set[str]:
    """The files in /dev/shm that a process has mapped (MPICH's segments for the ranks of one machine)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split(maxsplit=5)[5].strip() for line in maps if " /dev/shm/" in line}
    except OSError:
        return set()


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc: they are not ours to wait for)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


class MpiGroup(RankGroup):
    """The ranks of one MPI world, started by an MPI launcher (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._launcher: subprocess.Popen[bytes] | None = None
        self._listener: socket.socket | None = None
        self._all_connected = False  # every rank has said hello
        self._socket_name = f"pytest-ddp-{self.run_id}"
        self._shared_memory: set[str] = set()  # the world's segments in /dev/shm

    def start(self, deadline: float) -> None:
        cfg = self.config
        launcher = find_launcher(cfg.mpi_launcher)
        if launcher is None:
            raise GroupStartError(mpi_unavailable(cfg.mpi_launcher) or "no MPI launcher")
        try:
            self._listen()
            for rank in range(cfg.world_size):
                self.write_spec(rank, env=None)
                self.ranks.append(self.rank_process(rank, LaunchedProcess(), None, None))
            env = {**os.environ, **self.rank_environment()}
            for name, value in LOOPBACK_ENVIRONMENT.items():
                env.setdefault(name, value)
            env.pop("PYTEST_ADDOPTS", None)
            command = [*launcher, "-n", str(cfg.world_size), sys.executable, "-m", "pytest_ddp.rank.mpi_standin"]
            with open(self.workdir / "launcher.out", "wb") as output:
                self._launcher = subprocess.Popen(
                    [*command, str(self.workdir), self._socket_name],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C in a terminal is the controller's, which then kills it
                    preexec_fn=prctl.die_with_parent,  # before exec: the launcher dies with the controller
                )
            self._wait_ready(deadline)
            self._shared_memory = {path for rp in self.ranks for path in _shared_memory_of(rp.proc.pid)}
        except BaseException:
            self.kill()
            raise

    def _listen(self) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(b"\0" + self._socket_name.encode())
        self._listener.listen(self.config.world_size)
        self._listener.setblocking(False)
        assert self._news is not None
        self._news.register(self._listener, selectors.EVENT_READ, None)

    def _wait(self, timeout: float) -> None:
        """As for forked ranks, and: accept connections, read hellos, and hear of ends."""
        if self._news is None:  # killed
            return
        for key, _ in self._news.select(timeout):
            if key.fileobj is self._listener:
                assert self._listener is not None
                try:
                    sock, _ = self._listener.accept()
                except BlockingIOError:
                    continue
                sock.setblocking(True)
                self._news.register(Connection(sock.detach()), selectors.EVENT_READ, None)
                continue
            connection: Connection = key.fileobj  # type: ignore[assignment]
            try:
                message = connection.recv_bytes()
            except (EOFError, OSError):  # the stand-in is gone (killed with its launcher)
                self._news.unregister(connection)
                connection.close()
                self._gone(key.data, None)
                continue
            if key.data is None:  # a new rank's hello
                self._hello(connection, message)
            elif (ended := parse_exit_message(message)) is not None:
                self._gone(key.data, ended)
        self._check_launcher()

    def _hello(self, connection: Connection, message: bytes) -> None:
        hello = json.loads(message)
        rp = self.ranks[hello["rank"]]
        rp.proc.pid = hello["pid"]
        rp.commands = rp.notify = connection
        assert self._news is not None
        self._news.modify(connection, selectors.EVENT_READ, rp)
        self._all_connected = all(rp.proc.pid is not None for rp in self.ranks)

    def _gone(self, rp: RankProcess | None, ended: tuple[int, float] | None) -> None:
        if rp is None or rp.exit_code is not None:
            return
        code, when = ended if ended is not None else (-signal.SIGKILL, time.time())
        rp.exit_code = rp.proc.exitcode = code
        rp.died_at = when
        if ended is None:
            rp.commands = rp.notify = None

    def _check_launcher(self) -> None:
        """While the group starts: a launcher that ended before every rank said hello failed."""
        launcher = self._launcher
        if self._all_connected or launcher is None or launcher.poll() is None:
            return
        output = (self.workdir / "launcher.out").read_text(errors="replace")[-3000:]
        command = find_launcher(self.config.mpi_launcher) or []
        raise GroupStartError(
            f"the MPI launcher exited ({launcher.returncode}) before every rank started: "
            f"{shlex.join(command)}\n{output}"
        )

    def kill(self) -> None:
        if self._news is not None:  # connections of ranks that had not said hello yet
            for key in list(self._news.get_map().values()):
                if key.data is None and isinstance(key.fileobj, Connection):
                    key.fileobj.close()
        super().kill()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._launcher is not None:
            # The launcher, and the process groups of its children: the stand-ins that
            # gforker starts, or hydra's proxies, which make process groups of their own.
            helpers = [LaunchedProcess(pid) for pid in _children(self._launcher.pid)]
            for pid in [self._launcher.pid] + [helper.pid for helper in helpers if helper.pid]:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._launcher.wait()
            self._launcher = None
            for helper in helpers:
                helper.join()
        # MPICH removes them in MPI_Finalize, which ranks that were killed or that
        # exit as every rank does (os._exit) never reach.
        for path in self._shared_memory:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._shared_memory = set()

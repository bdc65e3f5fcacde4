"""A rank group: N rank processes of one world size and backend, and what they share.

The controller owns, per group: a private temporary folder (rank specs, event
logs, output logs, stack dumps), a TCPStore that listens on 127.0.0.1 only,
and for each rank a command pipe (controller -> rank) and a notify pipe
(rank -> controller: one byte after each event worth waking up for; end of
file when the rank dies).  Everything else a rank says goes through its event
log (see :mod:`pytest_ddp.state`).

No orphans: ranks run in their own session (Ctrl-C in a terminal reaches only
the controller, which then kills them), ask the kernel for SIGKILL when the
controller dies (PR_SET_PDEATHSIG), and exit when their command pipe closes.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from .state import EventReader, RankState

STACK_DUMP_WAIT = 1.0  # seconds to wait for a rank's faulthandler dump
STOP_WAIT = 5.0  # seconds a rank gets to finish its session after "stop"


class GroupStartError(RuntimeError):
    """The ranks could not be started; the message says which rank and why."""


@dataclass
class RankProcess:
    rank: int
    proc: subprocess.Popen[bytes]
    events: EventReader
    stdout_path: Path
    stderr_path: Path
    dump_path: Path
    command_fd: int
    notify_fd: int | None
    stdout_offset: int = 0  # where the current test's output starts
    stderr_offset: int = 0
    dump_offset: int = 0


def signal_name(exit_code: int) -> str:
    """``exit code 1`` or ``killed by SIGABRT`` for a Popen return code."""
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


def loopback_store(world_size: int, timeout: float) -> tuple[Any, socket.socket]:
    """A TCPStore server on 127.0.0.1 and an OS-chosen port.

    TCPStore's own server listens on every interface whatever host it is
    given; handing it a socket we bound to loopback keeps it there.  The
    socket must outlive the store, so it is returned with it.
    """
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    store = dist.TCPStore(
        "127.0.0.1",
        sock.getsockname()[1],
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
    )
    return store, sock


@dataclass
class GroupConfig:
    """What the ranks of a group need to know beyond their rank."""

    world_size: int
    backend: str
    init: bool
    pg_timeout: float  # the process group's own timeout, above every test's
    mode: str = "pytest"  # "pytest": run test items; "function": run api.run() functions
    pytest_args: list[str] = field(default_factory=list)
    sys_path: list[str] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)  # NCCL: visible GPU ids for ranks 0..N-1


class RankGroup:
    """Start, command, watch and stop the ranks of one group."""

    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="pytest-ddp-"))
        self.ranks: list[RankProcess] = []
        self.states: list[RankState] = []
        self.tests_run = 0
        self.started_at = time.monotonic()
        self._store: Any = None
        self._store_socket: socket.socket | None = None
        self._items: list[str] = []

    # -- life cycle -----------------------------------------------------------

    def start(self, deadline: float) -> None:
        """Spawn the ranks and wait until each has collected its tests (and joined its group)."""
        cfg = self.config
        self._store, self._store_socket = loopback_store(cfg.world_size, cfg.pg_timeout)
        port = self._store_socket.getsockname()[1]
        try:
            for rank in range(cfg.world_size):
                self.ranks.append(self._spawn(rank, port))
            self._wait_ready(deadline)
        except BaseException:
            self.kill()
            raise

    def _spawn(self, rank: int, port: int) -> RankProcess:
        cfg = self.config
        command_read, command_write = os.pipe()
        notify_read, notify_write = os.pipe()
        paths = {
            name: self.workdir / f"rank{rank}.{name}" for name in ("events", "stdout", "stderr", "dump")
        }
        spec = {
            "rank": rank,
            "world_size": cfg.world_size,
            "backend": cfg.backend,
            "init": cfg.init,
            "mode": cfg.mode,
            "pg_timeout": cfg.pg_timeout,
            "store_port": port,
            "parent_pid": os.getpid(),
            "command_fd": command_read,
            "notify_fd": notify_write,
            "events": str(paths["events"]),
            "dump": str(paths["dump"]),
            "pytest_args": cfg.pytest_args,
            "sys_path": cfg.sys_path,
            "basetemp": str(self.workdir / f"rank{rank}.tmp"),
        }
        spec_path = self.workdir / f"rank{rank}.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(cfg.world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(cfg.world_size),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            # As under torchrun: every rank, rank 0 included, is a client of the
            # store the controller hosts, so a test's own init_process_group
            # (init=False) opens no listening socket either.
            TORCHELASTIC_USE_AGENT_STORE="True",
            PYTHONUNBUFFERED="1",
        )
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.pop("PYTEST_ADDOPTS", None)
        if cfg.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in cfg.gpus)
        with open(paths["stdout"], "wb") as stdout, open(paths["stderr"], "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pytest_ddp.rank", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                pass_fds=(command_read, notify_write),
                start_new_session=True,
            )
        os.close(command_read)
        os.close(notify_write)
        return RankProcess(
            rank=rank,
            proc=proc,
            events=EventReader(str(paths["events"])),
            stdout_path=paths["stdout"],
            stderr_path=paths["stderr"],
            dump_path=paths["dump"],
            command_fd=command_write,
            notify_fd=notify_read,
        )

    def _wait_ready(self, deadline: float) -> None:
        ready: dict[int, list[str]] = {}
        while len(ready) < len(self.ranks):
            self._wait_for_notify(0.05)
            for rp in self.ranks:
                for ev in rp.events.read_new():
                    if ev["e"] == "ready":
                        ready[rp.rank] = ev.get("items", [])
                    elif ev["e"] == "fatal":
                        raise GroupStartError(f"rank {rp.rank} could not start:\n{ev['error']}")
                if rp.rank not in ready and rp.proc.poll() is not None:
                    raise GroupStartError(
                        f"rank {rp.rank} exited while starting ({signal_name(rp.proc.returncode)}):\n"
                        + self.stderr_tail(rp.rank)
                    )
            if time.monotonic() > deadline:
                missing = sorted(set(range(len(self.ranks))) - set(ready))
                raise GroupStartError(f"ranks {missing} were not ready in time")
        self._items = ready[0]

    def can_run(self, test_id: str) -> bool:
        """Whether these ranks can run that test (in pytest mode: collected it)."""
        return self.config.mode != "pytest" or test_id in self._items

    @property
    def alive(self) -> bool:
        return bool(self.ranks) and all(rp.proc.poll() is None for rp in self.ranks)

    def stop(self) -> None:
        """Ask every rank to finish its session (session fixtures' teardown), then make sure."""
        for rp in self.ranks:
            self._send(rp, {"cmd": "stop"})
        end = time.monotonic() + STOP_WAIT
        for rp in self.ranks:
            try:
                rp.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank still alive, reap them, close pipes, remove the folder."""
        for rp in self.ranks:
            if rp.proc.poll() is None:
                try:
                    os.kill(rp.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for rp in self.ranks:
            rp.proc.wait()
            for fd in (rp.command_fd, rp.notify_fd):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            rp.notify_fd = None
            rp.command_fd = -1
        self._store = None
        if self._store_socket is not None:
            # The store closed the listening descriptor it was lent when it went.
            self._store_socket.detach()
            self._store_socket = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- one test -------------------------------------------------------------

    def begin(self, command: dict[str, Any]) -> None:
        """Hand the next test to every rank; fresh states start recording it."""
        self.tests_run += 1
        self.states = [RankState(rank=rp.rank) for rp in self.ranks]
        for rp in self.ranks:
            rp.stdout_offset = _size(rp.stdout_path)
            rp.stderr_offset = _size(rp.stderr_path)
            rp.dump_offset = _size(rp.dump_path)
            self._send(rp, command)

    def poll(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for news, then fold every new event and exit into the states."""
        self._wait_for_notify(wait)
        now = time.time()
        for rp, state in zip(self.ranks, self.states):
            for ev in rp.events.read_new():
                state.apply(ev)
            if state.alive and rp.proc.poll() is not None:
                # A rank may have written events just before it died.
                for ev in rp.events.read_new():
                    state.apply(ev)
                state.mark_dead(rp.proc.returncode, now)

    def dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Make each live rank write every thread's Python stack; return the dumps."""
        targets = [rp for rp in self.ranks if rp.rank in ranks and rp.proc.poll() is None]
        for rp in targets:
            try:
                os.kill(rp.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        dumps: dict[int, str] = {}
        end = time.monotonic() + STACK_DUMP_WAIT
        pending = list(targets)
        while pending and time.monotonic() < end:
            time.sleep(0.01)
            for rp in list(pending):
                text = _read_from(rp.dump_path, rp.dump_offset)
                # faulthandler writes the whole dump from its signal handler;
                # a dump that ends with a newline and did not grow is complete.
                if text.endswith("\n") and text == dumps.get(rp.rank):
                    pending.remove(rp)
                dumps[rp.rank] = text
        return {rank: text for rank, text in dumps.items() if text}

    def test_output(self, rank: int) -> dict[str, str]:
        """What the rank's process wrote to its stdout and stderr (fds 1, 2) during this test."""
        rp = self.ranks[rank]
        return {
            "stdout": _read_from(rp.stdout_path, rp.stdout_offset),
            "stderr": _read_from(rp.stderr_path, rp.stderr_offset),
        }

    def stderr_tail(self, rank: int, lines: int = 30) -> str:
        text = _read_from(self.ranks[rank].stderr_path, 0)
        return "\n".join(text.splitlines()[-lines:])

    def pids(self) -> list[int]:
        return [rp.proc.pid for rp in self.ranks]

    # -- plumbing -------------------------------------------------------------

    def _send(self, rp: RankProcess, command: dict[str, Any]) -> None:
        try:
            os.write(rp.command_fd, (json.dumps(command) + "\n").encode())
        except OSError:
            pass  # the rank is gone; its exit shows in poll()

    def _wait_for_notify(self, wait: float) -> None:
        fds = [rp.notify_fd for rp in self.ranks if rp.notify_fd is not None]
        if not fds:
            time.sleep(wait)
            return
        readable, _, _ = select.select(fds, [], [], wait)
        for fd in readable:
            if not os.read(fd, 4096):
                # End of file: the rank died.  Stop watching the pipe; poll() sees the exit.
                for rp in self.ranks:
                    if rp.notify_fd == fd:
                        os.close(fd)
                        rp.notify_fd = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""

"""How a rank process comes to be, and how its files are read: the forkserver ranks are forked
from, a rank's start and files, the fork itself, and the TCPStore the ranks of a group meet at."""

from __future__ import annotations

import functools
import importlib.metadata
import multiprocessing
import multiprocessing.util
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing import forkserver, reduction
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pytest_ddp.common.event_log import EventReader
from pytest_ddp.common.protocol import PRELOAD_ENV, Command, RankRole, RankStart, encode
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.groups.forkserver_guard import REFUSED

# The secret of a launched session's link (pytest_ddp.launched.link): its pytest processes' alone.
SECRET_ENV = "PYTEST_DDP_SECRET"
# Not a rank's: the session's pytest options, an MPI launcher's (a rank would take itself for the
# launched process), and the launched session's secret.
NOT_FOR_RANKS = ("PYTEST_ADDOPTS", "PMI_FD", "PMI_RANK", "PMI_SIZE", SECRET_ENV)

# What ends pytest, by default, without its exit handlers: a kill, a closed terminal.
KILLING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

# Imported once by the forkserver before it forks any rank (then gc.freeze(): pytest_ddp.groups.preload),
# and after them the modules PRELOAD_ENV names (torch_modules_imported).
PRELOAD = [
    "torch", "torch.distributed", "pytest", "pytest_ddp.plugin", "pytest_ddp.rank.entry",
    "pytest_ddp.rank.session",
]


@functools.cache
def _entry_point_plugins() -> list[str]:
    """The entry-point plugins this pytest loaded, which each rank's pytest loads again: imported
    once by the forkserver, not in every rank (over half a rank's start)."""
    plugins = importlib.metadata.entry_points(group="pytest11")
    return sorted({plugin.module for plugin in plugins if plugin.module in sys.modules})


def torch_modules_imported() -> list[str]:
    """torch's own modules this process has imported, in the order it imported them: once the
    session is collected, those its test files need (torch's DTensor test helpers, and sympy
    through them: a second of imports), which each rank would import again.  None on a build with
    an accelerator: torch.testing asks at import whether CUDA is available, which initialises the
    driver, and a rank forked after that could not use it."""
    torch = sys.modules.get("torch")
    if torch is None or torch.__file__ is None or torch.backends.cuda.is_built() or torch.xpu._is_compiled():
        return []
    package = os.path.dirname(torch.__file__) + os.sep
    return [
        name for name, module in list(sys.modules.items())
        if name.startswith("torch.") and (getattr(module, "__file__", None) or "").startswith(package)
    ]  # fmt: skip


def _listed(modules: list[str]) -> str:
    """A file naming these modules, one a line, for the forkserver to import (and remove): in the
    private folder multiprocessing removes at exit, as the forkserver's socket.  Not the environment
    itself: a variable over 128 KB would fail the forkserver's exec."""
    fd, path = tempfile.mkstemp(prefix="preload-", dir=multiprocessing.util.get_temp_dir())
    with open(fd, "w") as out:
        out.write("\n".join(modules))
    return path


def fork_context() -> Any:
    """The forkserver context ranks are started from; starts the server, in the background."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([*PRELOAD, *_entry_point_plugins(), "pytest_ddp.groups.preload"])
    if forkserver._forkserver._forkserver_pid is None:  # type: ignore[attr-defined]  # it starts now
        os.environ[PRELOAD_ENV] = _listed(torch_modules_imported())
    # The forkserver ignores SIGINT only after its imports; else Ctrl-C prints a traceback.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
        os.environ.pop(PRELOAD_ENV, None)
    if threading.current_thread() is threading.main_thread():
        for number in KILLING_SIGNALS:
            if signal.getsignal(number) is signal.SIG_DFL:
                signal.signal(number, _die_of_signal)
    return context


class Refusals:
    """What the running forkserver refused (:mod:`pytest_ddp.groups.forkserver_guard`) since this
    session's last look."""

    def __init__(self) -> None:
        self._offset = 0
        self.new()  # what it refused before this session's first look is not this session's

    def new(self) -> list[str]:
        address = forkserver._forkserver._forkserver_address  # type: ignore[attr-defined]
        if address is None:  # none runs
            return []
        refused = read_bytes_from(Path(address).parent / REFUSED, self._offset)
        self._offset += len(refused)
        return refused.decode(errors="replace").splitlines()


# The killing signals that came while held (hold_killing_signals); None while none is held.
_held: list[int] | None = None


def hold_killing_signals() -> None:
    """From now on a kill by KILLING_SIGNALS waits for :func:`release_killing_signals`: called as a
    passed test's follow is handed to its warm ranks.  The follow may kill this process (a test that
    SIGTERMs its xdist worker); it must die within that test, once xdist has the one that passed
    whole (its reports, then its protocol complete), else xdist reports that one as the crash."""
    global _held
    if _held is None:
        _held = []


def release_killing_signals() -> None:
    """Die of the killing signals that came while held, if any; hold them no longer.  Called as the
    next test begins (the follow, where one was handed) and at the session's end."""
    global _held
    held, _held = _held or [], None
    for number in held:
        os.kill(os.getpid(), number)


def _die_of_signal(number: int, frame: Any) -> None:
    """Die of the signal, first removing the forkserver socket's folder (which multiprocessing's exit
    handler removes on any other ending); while held, once the hold ends."""
    if _held is not None:
        _held.append(number)
        return
    shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)


# A rank's files read past where the current test's part starts (RankProcess.offsets); its event
# log has a reader of its own.
OUTPUTS = ("stdout", "stderr", "dump")


def rank_files(folder: Path, rank: int) -> dict[str, Path]:
    """A rank's event log, output files and stack dump file in ``folder``."""
    return {name: folder / f"rank{rank}.{name}" for name in ("events", *OUTPUTS)}


def write_start_file(
    folder: Path, role: RankRole, env: dict[str, str], pytest_args: list[str], sys_path: list[str]
) -> Path:
    """A rank's whole start (its role, and what only its machine knows: files, cwd, import path) as a
    0600 file in ``folder`` (it holds the rank's environment)."""
    start = RankStart(
        role=role,
        **{name: str(path) for name, path in rank_files(folder, role.rank).items()},
        env=env,
        cwd=os.getcwd(),
        pytest_args=pytest_args,
        sys_path=sys_path,
        basetemp=str(folder / f"rank{role.rank}.tmp"),
    )
    path = folder / f"rank{role.rank}.json"
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as out:
        out.write(start.to_json())
    return path


def forkserver_ready() -> None:
    """Return once the forkserver has done its imports (seconds), so that a later fork is quick."""
    process = fork_context().Process(target=_nothing, name="ddp-ready")
    process.start()
    process.join()


def _nothing() -> None:
    pass


class Descriptor:
    """A descriptor a forked rank gets a copy of through the forkserver's socket, at another number."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _received, (reduction.DupFd(self.fd),)


def _received(duplicate: Any) -> int:
    """The number of a descriptor a rank was handed (in the rank, as its args are unpickled)."""
    return int(duplicate.detach())


def fork_rank(
    start_path: Path, rank: int, descriptors: dict[str, Descriptor] | None = None
) -> ForkedRank:
    """Fork a rank.  ``descriptors``: copies it gets, by the variable that says its number (``PMI_FD``)."""
    context = fork_context()
    command_read, command_write = context.Pipe(duplex=False)
    notify_read, notify_write = context.Pipe(duplex=False)
    from pytest_ddp.rank.entry import forked_main

    proc = context.Process(
        target=forked_main,
        args=(str(start_path), command_read, notify_write, descriptors or {}),
        name=f"ddp-rank{rank}",
    )
    proc.start()
    command_read.close()
    notify_write.close()
    return ForkedRank(proc, command_write, notify_read)


class RankHandle:
    """What a group does to one of its ranks, wherever it is: forked here (:class:`ForkedRank`), or on
    another host (:class:`pytest_ddp.launched.world.RemoteRank`).  This base is itself a rank not forked
    yet, until :meth:`pytest_ddp.groups.group.RankGroup.fork` replaces it (an MPI rank until its stand-in
    says hello): nothing runs, nothing can be told to it, so each method, which says what it does to a
    rank that runs, does nothing here."""

    @property
    def pid(self) -> int | None:
        """Its process id on this machine; None where it has none here."""
        return None

    @property
    def exitcode(self) -> int | None:
        """How it ended (negative: the signal); None while it runs, or before it started."""
        return None

    def send(self, command: Command) -> None:
        """Hand it a command; nothing if it is gone (its end is heard of otherwise)."""

    def request_dump(self) -> None:
        """Ask it to write every thread's Python stack to its dump file."""

    def dump_complete(self, text: str, before: str | None) -> bool:
        """Whether the dump is whole: ``text`` its dump file now, ``before`` at the last look."""
        return True  # no dump is coming

    def kill(self) -> None:
        """SIGKILL it."""

    def join(self) -> None:
        """Once it ended or was killed: reap it, and close what led to it."""


class ForkedRank(RankHandle):
    """A rank this process forked (:func:`fork_rank`): its process, the write end of its command pipe,
    and the read end of its notify pipe (a wake-up byte per event worth it; end of file when it dies)."""

    def __init__(self, process: Any, commands: Connection, notify: Connection) -> None:
        self.process = process  # multiprocessing.Process from the forkserver
        self.commands: Connection | None = commands
        self.notify: Connection | None = notify

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def send(self, command: Command) -> None:
        self.send_encoded(encode(command))

    def send_encoded(self, payload: bytes) -> None:
        """Hand it a command already encoded; nothing if it is gone (its sentinel says so)."""
        if self.commands is not None:
            try:
                self.commands.send_bytes(payload)
            except OSError:
                pass

    def request_dump(self) -> None:
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    def dump_complete(self, text: str, before: str | None) -> bool:
        return dump_complete(text, before)

    def kill(self) -> None:
        self.process.kill()

    def watch(self, selector: selectors.BaseSelector, data: Any) -> None:
        """Have ``selector`` say (with ``data``) when a wake-up byte came, and when the process ended."""
        assert self.notify is not None
        selector.register(self.notify, selectors.EVENT_READ, data)
        selector.register(self.process.sentinel, selectors.EVENT_READ, data)

    def news(self, selector: selectors.BaseSelector, ready: Any) -> bool:
        """Take in what ``selector`` found ready of what :meth:`watch` registered: a wake-up byte, or
        the notify pipe's end (the rank is gone: its sentinel tells how); True: the process ended."""
        if ready is not self.notify:
            selector.unregister(ready)
            return True
        try:
            self.notify.recv_bytes()  # one wake-up byte; any other makes the next wait return at once
        except (EOFError, OSError):
            selector.unregister(self.notify)
            self.notify.close()
            self.notify = None
        return False

    def unwatch(self, selector: selectors.BaseSelector) -> None:
        """What :meth:`watch` registered and is still there, unregistered."""
        for fileobj in (self.notify, self.process.sentinel):
            if fileobj is not None and fileobj in selector.get_map():
                selector.unregister(fileobj)

    def join(self) -> None:
        self.process.join()
        for pipe in (self.commands, self.notify):
            if pipe is not None:
                pipe.close()
        self.commands = self.notify = None


@dataclass
class RankProcess:
    """A started rank as its group sees it: its handle, its files, how it ended."""

    rank: int
    proc: RankHandle  # what the group does to it, wherever it runs
    events: EventReader
    files: dict[str, Path]  # rank_files: its event log (read by its own reader), output and dump
    exit_code: int | None = None  # set once the process is seen to have ended
    died_at: float | None = None  # when it ended, where its starter says (else when it is seen)
    # where the current test's part of each of OUTPUTS starts
    offsets: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTPUTS, 0))


class GroupStore:
    """The TCPStore server a group's default process groups meet at, renewed after a test that ended
    or made one (:mod:`pytest_ddp.rank.default_group`)."""

    def __init__(self, address: str, world_size: int, timeout: float) -> None:
        self._args = (address, world_size, timeout)
        self._bind()

    def _bind(self) -> None:
        """A server on the address and an OS-chosen port, with the socket, which must outlive it:
        TCPStore's own server listens on every interface whatever host it is given."""
        import torch.distributed as dist

        address, world_size, timeout = self._args
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((address, 0))
        self._socket.listen(128)
        self._store: Any = dist.TCPStore(
            address,
            self.port,
            world_size,
            is_master=True,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
            master_listen_fd=self._socket.fileno(),
        )
        self.used = False  # a test's own rendezvous (env://) was made on it

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def spent(self, states: list[RankState]) -> bool:
        """After a test: whether the next needs a fresh store: a default group was ended or replaced,
        or a test's own rendezvous used it and no default group that may still use it is left."""
        self.used = self.used or any(state.used_store for state in states)
        if any(not s.group_intact for s in states):
            return True
        return self.used and not any(s.group_alive for s in states)

    def renew(self) -> int:
        """A fresh store in place of this one, which goes (every rank is done with it); its port."""
        self.close()
        self._bind()
        return self.port

    def close(self) -> None:
        self._store = None  # it closes the listening descriptor it was lent
        self._socket.detach()


def dump_complete(text: str, before: str | None) -> bool:
    """faulthandler writes a dump in its signal handler: whole once it ends in a newline and stops
    growing."""
    return text.endswith("\n") and text == before


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_bytes_from(path: Path, offset: int) -> bytes:
    """What a rank's file holds past ``offset``; nothing if it is shorter or not there yet."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


def read_from(path: Path, offset: int) -> str:
    return read_bytes_from(path, offset).decode(errors="replace")

"""An MPI group: N ranks of one ``MPI.COMM_WORLD``, started by an MPI launcher (its own session,
killed with the controller) through stand-ins (:mod:`pytest_ddp.rank.mpi_standin`): each hands over
what ``MPI_Init`` needs, and the controller forks the rank from its forkserver, as any rank.  How
each side knows the other is its own: :mod:`pytest_ddp.common.mpi_world`.

The default launcher, MPICH's ``mpiexec.gforker``, listens on no socket (hydra listens on every
interface); ``--ddp-mpi-launcher`` picks another.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import secrets
import select
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from pytest_ddp.common import prctl, procfs
from pytest_ddp.common.handshake import NONCE
from pytest_ddp.common.mpi_world import (
    FD_VARIABLES,
    HEADER,
    HELLO_WAIT,
    MAX_MESSAGE,
    SHARED_MEMORY,
    SOCKET_FILE,
    Hello,
    at_socket,
    frame,
    parse_hello,
    remove_shared_memory,
    write_key,
    write_shared_memory,
)
from pytest_ddp.common.procfs import descends_from, environment_of, parent_of, peer_credentials
from pytest_ddp.groups.group import GroupConfig, GroupStartError, RankGroup
from pytest_ddp.groups.spawn import (
    Descriptor,
    RankHandle,
    RankProcess,
    forkserver_ready,
)

logger = logging.getLogger(__name__)
MAX_REFUSALS = 20  # the latest refused connections a group keeps, to say why its start failed
HELPERS_GRACE = 2.0  # seconds the launcher's children get to end by themselves when a world is killed
# Tried in order, next to this Python (a venv's MPICH) and then on PATH.
DEFAULT_LAUNCHERS = ("mpiexec.gforker", "mpiexec")
# Keeps network transports on loopback (UCX listens on every interface otherwise); Open MPI's
# TCP transport listens everywhere whatever it is told, so its ranks use shared memory alone.
LOOPBACK_ENVIRONMENT = {
    "UCX_NET_DEVICES": "lo",
    "FI_TCP_IFACE": "lo",
    "FI_SOCKETS_IFACE": "lo",
    "OMPI_MCA_btl": "self,vader",
}


def find_launcher(command: str | None) -> list[str] | None:
    """The launcher's command up to ``-n N``: the option's as written, else the first of
    DEFAULT_LAUNCHERS found, with :func:`open_mpi_options`; None if none is."""
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
    """``--oversubscribe`` and, as root, ``--allow-run-as-root`` for Open MPI's launcher (from its
    ``--version``), which refuses more ranks than cores, and root, otherwise."""
    if "Open MPI" not in version and "OpenRTE" not in version:
        return []
    return ["--oversubscribe", *(["--allow-run-as-root"] if root else [])]


@functools.cache
def _version(launcher: str) -> str:
    """The launcher's ``--version`` output ("mpirun (Open MPI) 4.1.4"); "" if it gives none."""
    try:
        done = subprocess.run(
            [launcher, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
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
class _StandIn:
    """The connection of a rank's stand-in, once it said a good hello: open while the rank lives."""

    link: Connection
    rp: RankProcess

    def close(self) -> None:
        """Tell the stand-in that the controller ends the world (else it does), and let it end."""
        try:
            self.link.send_bytes(b"end")
        except OSError:
            pass
        self.link.close()


@dataclass
class _Greeting:
    """A connection from a process the launcher started that has not said a good hello yet."""

    sock: socket.socket
    peer: int  # the process that connected (the kernel says so)
    challenge: bytes
    deadline: float  # time.monotonic() by which its hello must be read
    received: bytearray = field(default_factory=bytearray)
    descriptors: list[int] = field(default_factory=list)  # handed over with the hello
    length: int = 0  # the hello's, once its frame's header is read

    def wanted(self) -> int:
        """How many bytes of its frame are still to come (never more)."""
        return HEADER.size + self.length - len(self.received)

    def close(self) -> None:
        self.sock.close()
        for fd in self.descriptors:
            os.close(fd)
        self.descriptors = []


def _shared_memory_of(pid: int) -> set[str]:
    """The files in /dev/shm that a process has mapped (MPICH's segments for the ranks of one machine)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split(maxsplit=5)[5].strip() for line in maps if f" {SHARED_MEMORY}/" in line}
    except OSError:
        return set()


def _files_in(folder: str) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc: they are not ours to wait for)."""
    return [pid for pid in procfs.pids() if parent_of(pid) == parent]


def _wait_gone(pids: list[int], timeout: float | None = None) -> None:
    """Wait until processes that are not our children have ended, or ``timeout`` has passed."""
    fds = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                pass
        deadline = None if timeout is None else time.monotonic() + timeout
        while fds:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ended = select.select(fds, [], [], left)[0]
            if not ended:
                return
            for fd in ended:
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def _launched(greeting: _Greeting) -> tuple[dict[str, str], dict[str, Descriptor]]:
    """What the launcher gave a stand-in, for its rank: its environment, and the descriptors handed
    over, by the variable naming each; ValueError if one the launcher named is missing."""
    try:
        env = environment_of(greeting.peer)
    except OSError as exc:
        raise ValueError(f"its environment cannot be read ({exc})") from None
    named = [name for name in FD_VARIABLES if name in env]
    if len(greeting.descriptors) != len(named):
        handed = len(greeting.descriptors)
        raise ValueError(f"it handed over {handed} descriptors, its launcher named {named}")
    return env, dict(zip(named, map(Descriptor, greeting.descriptors)))


def _say_how_full_shared_memory_is(stderr: Path, rank: int) -> None:
    """Say in the rank's stderr how much of /dev/shm is free (a full one is the usual cause of SIGBUS)."""
    try:
        room = os.statvfs(SHARED_MEMORY)
        free, size = room.f_bavail * room.f_frsize, room.f_blocks * room.f_frsize
        with open(stderr, "a") as out:
            out.write(
                f"pytest-ddp: rank {rank} was killed by SIGBUS; {SHARED_MEMORY}, where MPI keeps the "
                f"shared memory of one machine's ranks, has {free / 2**20:.1f} MiB free "
                f"of {size / 2**20:.1f} MiB\n"
            )
    except OSError:
        pass


class MpiGroup(RankGroup):
    """The ranks of one MPI world, started by an MPI launcher (see the module's docstring)."""

    def __init__(self, config: GroupConfig) -> None:
        super().__init__(config)
        self._launcher: subprocess.Popen[bytes] | None = None
        self._listener: socket.socket | None = None
        self._secret = b""
        self._shared_memory: dict[str, tuple[int, int]] = {}  # the world's files in /dev/shm
        self.refused: list[str] = []  # why connections to the socket were refused (the latest ones)

    def start(self, deadline: float) -> None:
        cfg = self.config
        launcher = find_launcher(cfg.mpi_launcher)
        if launcher is None:
            raise GroupStartError(mpi_unavailable(cfg.mpi_launcher) or "no MPI launcher")
        try:
            self._secret = write_key(self.workdir)
            self._listen()
            self.ranks = [self.rank_process(rank, RankHandle()) for rank in range(cfg.world_size)]
            env = {**os.environ, **self.rank_environment()}
            for name, value in LOOPBACK_ENVIRONMENT.items():
                env.setdefault(name, value)
            env.pop("PYTEST_ADDOPTS", None)
            forkserver_ready()  # a hello is answered by a fork, and stand-ins wait HELLO_WAIT for challenges
            stand_in = [sys.executable, "-m", "pytest_ddp.rank.mpi_standin"]
            command = [*launcher, "-n", str(cfg.world_size), *stand_in]
            there_before = _files_in(SHARED_MEMORY)
            output = os.open(self.workdir / "launcher.out", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                self._launcher = subprocess.Popen(
                    [*command, str(self.workdir)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C in a terminal is the controller's, which then kills it
                    preexec_fn=prctl.die_with_parent,  # before exec: the launcher dies with the controller
                )
            finally:
                os.close(output)
            try:
                self._wait_ready(deadline)
            except GroupStartError as exc:  # a world that did not start says which connections were refused
                raise GroupStartError("\n".join([str(exc), *self.refused])) from None
            self._note_shared_memory(there_before)
        except BaseException:
            self.kill()
            raise

    def _note_shared_memory(self, there_before: set[str]) -> None:
        """The world's files in /dev/shm (new, and mapped by its ranks), listed for the stand-ins."""
        for rp in self.ranks:
            assert rp.proc.pid is not None
            for path in _shared_memory_of(rp.proc.pid):
                try:
                    found = os.stat(path, follow_symlinks=False)
                    if os.path.basename(path) not in there_before and found.st_uid == os.geteuid():
                        self._shared_memory[path] = (found.st_dev, found.st_ino)
                except OSError:
                    pass
        write_shared_memory(self.workdir, self._shared_memory)

    def _listen(self) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        at_socket(self.workdir, self._listener.bind)
        os.chmod(self.workdir / SOCKET_FILE, 0o600)  # made as the umask says, in a folder only we can enter
        self._listener.listen(self.config.world_size)
        self._listener.setblocking(False)
        self._news.register(self._listener, selectors.EVENT_READ, None)

    @property
    def alive(self) -> bool:
        """As for forked ranks, and its launcher runs: one that ended ended the world (MPI_Abort)."""
        return super().alive and self._launcher is not None and self._launcher.poll() is None

    def _wait(self, timeout: float) -> None:
        """As for forked ranks, and: drop a connection whose hello is late; a launcher that ended
        while the world starts failed."""
        super()._wait(timeout)
        if self.killed:
            return
        now = time.monotonic()
        for key in list(self._news.get_map().values()):
            if isinstance(key.data, _Greeting) and now > key.data.deadline:
                self._refuse(key.data, f"process {key.data.peer} sent no hello in {HELLO_WAIT:g} s")
        self._check_launcher()

    def _news_of(self, key: selectors.SelectorKey) -> None:
        """As for forked ranks, and: a connection to the socket, a hello, a stand-in's end; a rank
        killed by SIGBUS is told in its stderr how full /dev/shm is."""
        if key.fileobj is self._listener:
            return self._accept()
        if isinstance(key.data, _Greeting):
            return self._read_hello(key.data)
        if isinstance(key.data, _StandIn):
            return self._stand_in_news(key.data)
        rp: RankProcess = key.data
        ended = rp.exit_code is not None
        super()._news_of(key)
        if not ended and rp.exit_code == -signal.SIGBUS:
            _say_how_full_shared_memory_is(rp.files["stderr"], rp.rank)

    def _accept(self) -> None:
        """Challenge a connection from this user's process that the launcher started; close others."""
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except OSError:  # another look took it, or no descriptor is left for it
            return
        pid, uid = peer_credentials(sock)
        greeting = _Greeting(sock, pid, secrets.token_bytes(NONCE), time.monotonic() + HELLO_WAIT)
        if uid != os.geteuid():
            return self._refuse(greeting, f"process {pid} runs as user {uid}")
        if self._launcher is None or not descends_from(pid, self._launcher.pid):
            return self._refuse(greeting, f"process {pid} is not one that the MPI launcher started")
        sock.setblocking(False)
        try:
            sock.sendall(frame(greeting.challenge))  # a few bytes into a new socket's empty buffer
        except OSError as exc:
            return self._refuse(greeting, f"process {pid} could not be sent its challenge ({exc})")
        self._news.register(sock, selectors.EVENT_READ, greeting)

    def _read_hello(self, greeting: _Greeting) -> None:
        """Read what came of a hello and its descriptors, never past it; check a whole one."""
        try:
            chunk, fds, flags, _ = socket.recv_fds(greeting.sock, greeting.wanted(), len(FD_VARIABLES))
        except BlockingIOError:
            return
        except OSError:
            chunk, fds, flags = b"", [], 0
        greeting.descriptors += fds
        if flags & socket.MSG_CTRUNC:
            why = f"process {greeting.peer} handed over more descriptors than a launcher gives"
            return self._refuse(greeting, why)
        if not chunk:
            return self._refuse(greeting, f"process {greeting.peer} left without a whole hello")
        greeting.received += chunk
        if not greeting.length and len(greeting.received) == HEADER.size:
            (greeting.length,) = HEADER.unpack(greeting.received)
            if not 0 < greeting.length <= MAX_MESSAGE:
                why = f"process {greeting.peer} announced a hello of {greeting.length} bytes"
                return self._refuse(greeting, why)
        if greeting.length and not greeting.wanted():
            self._hello(greeting, bytes(greeting.received[HEADER.size :]))

    def _hello(self, greeting: _Greeting, message: bytes) -> None:
        """A good hello: fork the rank with the stand-in's environment and descriptors; tell it the pid."""
        try:
            rp = self._rank_of(parse_hello(message, self._secret, greeting.challenge), greeting.peer)
            env, descriptors = _launched(greeting)
        except ValueError as exc:
            return self._refuse(greeting, f"process {greeting.peer}: {exc}")
        self._news.unregister(greeting.sock)
        self.fork(rp, self.write_start(rp.rank, env), descriptors)
        greeting.sock.setblocking(True)
        link = Connection(greeting.sock.detach())
        greeting.close()  # the rank's now, not ours
        self._news.register(link, selectors.EVENT_READ, _StandIn(link, rp))
        try:
            link.send_bytes(str(rp.proc.pid).encode())
        except OSError:  # gone: its end is heard of next
            pass

    def _rank_of(self, hello: Hello, peer: int) -> RankProcess:
        """The rank a signed hello names, from the stand-in that connected; ValueError saying why not."""
        if hello.stand_in != peer:
            raise ValueError(f"its hello names process {hello.stand_in} as its stand-in")
        if not 0 <= hello.rank < len(self.ranks):
            raise ValueError(f"its hello names rank {hello.rank}, not one of {len(self.ranks)}")
        if self.ranks[hello.rank].proc.pid is not None:
            raise ValueError(f"rank {hello.rank} has said hello already")
        return self.ranks[hello.rank]

    def _refuse(self, greeting: _Greeting, why: str) -> None:
        """Drop a connection, saying why (logged, and in a start error)."""
        if greeting.sock in self._news.get_map():
            self._news.unregister(greeting.sock)
        greeting.close()
        text = f"{self.name}: refused a connection to its socket: {why}"
        logger.warning("%s", text)
        self.refused = [*self.refused[-(MAX_REFUSALS - 1) :], text]

    def _stand_in_news(self, stand_in: _StandIn) -> None:
        """A stand-in sends nothing: its connection is ready when it is gone (``MPI_Abort``), and its
        rank goes with it."""
        self._news.unregister(stand_in.link)
        stand_in.close()
        if stand_in.rp.proc.exitcode is None:
            stand_in.rp.proc.kill()

    def _check_launcher(self) -> None:
        """While the group starts: a launcher that ended before every rank said hello failed."""
        launcher = self._launcher
        if launcher is None or launcher.poll() is None or all(rp.proc.pid is not None for rp in self.ranks):
            return
        output = (self.workdir / "launcher.out").read_text(errors="replace")[-3000:]
        command = find_launcher(self.config.mpi_launcher) or []
        raise GroupStartError(
            f"the MPI launcher exited ({launcher.returncode}) before every rank started: "
            f"{shlex.join(command)}\n{output}"
        )

    def kill(self) -> None:
        if not self.killed:  # the stand-ins' connections, and those that had not said hello yet
            for key in list(self._news.get_map().values()):
                if isinstance(key.data, (_Greeting, _StandIn)):
                    key.data.close()
        super().kill()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._launcher is not None:
            # The launcher, and the process groups of its children (hydra's proxies make their own).
            helpers = _children(self._launcher.pid)
            # They get a moment to end by themselves (hydra's proxy then removes its
            # /tmp/hydra_hwloc_xmlfile_*, which SIGKILL leaves); not the launcher: gforker waits ~2 s.
            _wait_gone(helpers, HELPERS_GRACE)
            for pid in [self._launcher.pid, *helpers]:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._launcher.wait()
            self._launcher = None
            _wait_gone(helpers)
        # MPICH removes them in MPI_Finalize, which killed ranks and os._exit never reach.
        remove_shared_memory(self._shared_memory)
        self._shared_memory = {}

"""A rank group: N rank processes of one world size and backend, and what they share.

Per group: a private folder, a TCPStore on 127.0.0.1 only, and per rank a command pipe and a
notify pipe (a wake-up byte per event worth it; end of file when the rank dies); all else goes
through the rank's event log (:mod:`pytest_ddp.common.protocol`).  Ranks fork from a forkserver
that imported torch once, so a fresh group costs no ``import torch``.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import selectors
import shutil
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import ClassVar

from pytest_ddp.common import procfs
from pytest_ddp.common.bounds import read_bounded
from pytest_ddp.common.event_log import EventReader
from pytest_ddp.common.protocol import (
    CallFunction,
    Fatal,
    RankRole,
    Ready,
    RunItem,
    SessionEnd,
    Stop,
)
from pytest_ddp.diagnose.state import Process, RankState, exit_text
from pytest_ddp.groups.spawn import (
    NOT_FOR_RANKS,
    ForkedRank,
    GroupStore,
    RankHandle,
    RankProcess,
    file_size,
    fork_rank,
    rank_files,
    rank_start,
    read_from,
    write_start_file,
)

STACK_DUMP_WAIT = 1.0  # seconds to wait for a rank's faulthandler dump
STOP_WAIT = 5.0  # seconds a rank gets to finish its session after "stop"
# Where the folders shared by a test's ranks live (the ``ddp_shared_path`` fixture).
SHARED_ROOT_ENV = "PYTEST_DDP_SHARED_ROOT"


class GroupStartError(RuntimeError):
    """The ranks could not be started; the message says which rank and why."""


_live_groups: weakref.WeakSet[RankGroup] = weakref.WeakSet()


@atexit.register
def _kill_live_groups() -> None:
    """Last resort at interpreter exit (before multiprocessing joins its children)."""
    for group in list(_live_groups):
        group.kill()


@dataclass(frozen=True)
class UnfinishedTeardown:
    """What is known of a rank that sent no :class:`~pytest_ddp.common.protocol.SessionEnd` after
    "stop": it ended in its teardown, or was still in it after the wait and was killed."""

    exit_code: int | None  # how it ended (negative: the signal); None: still running when killed
    waited: float  # seconds it was given to finish (STOP_WAIT)
    duration: float  # seconds from "stop" to its end as seen here; ``waited`` for one still running
    stderr: str  # what it wrote to stderr after "stop"
    stacks: str = ""  # its Python stacks, dumped before it was killed (a rank still running)
    outcome: ClassVar[str] = "failed"  # as a failed SessionEnd's


# A rank's teardown at its group's stop: its own report, or what the controller knows of it.
StopTeardown = SessionEnd | UnfinishedTeardown


@dataclass
class GroupConfig:
    """What the ranks of a group need to know beyond their rank."""

    world_size: int
    backend: str
    init: bool
    pg_timeout: float  # the process group's own timeout, above every test's
    mode: str = "pytest"  # "pytest": run test items; "function": run api.run() functions
    pytest_args: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # pytest mode: the node ids the ranks collect
    sys_path: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)  # NCCL: the GPU ids ranks 0..N-1 use
    mpi_launcher: str | None = None  # MPI: the launcher's command (--ddp-mpi-launcher); None: found
    # pytest's basetemp, which pytest rotates: a controller killed by SIGKILL leaves nothing outside.
    workdir_parent: str | None = None


class RankGroup:
    """Start, command, watch and stop the ranks of one group."""

    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="pytest-ddp-", dir=config.workdir_parent))
        self.run_id = uuid.uuid4().hex  # TORCHELASTIC_RUN_ID, the same on every rank
        self.ranks: list[RankProcess] = []
        self.states: list[RankState] = []
        self.tests_run = 0
        self.current: str | None = None  # id of the test handed over and not yet judged
        self.last_test: str | None = None  # id of the last test handed over
        self.handed_over_at = 0.0  # time.time() of that hand-over
        self._store: GroupStore | None = None
        self._items: set[str] = set()  # collected by every rank (pytest mode)
        self.collect_errors: list[str] = []  # the ranks' collection errors, each once
        # Ready when a rank has news (a byte on its notify pipe) or has ended (its sentinel).
        self._news: selectors.BaseSelector | None = selectors.DefaultSelector()
        self.store_host = "127.0.0.1"  # where the group's store listens
        _live_groups.add(self)

    # -- life cycle -----------------------------------------------------------

    def start(self, deadline: float) -> None:
        """Spawn the ranks and wait until each has collected its tests (and joined its group)."""
        cfg = self.config
        self._store = GroupStore(self.store_host, cfg.world_size, cfg.pg_timeout)
        port = self._store.port
        try:
            self._start_ranks(port)
            self._wait_ready(deadline)
        except BaseException:
            self.kill()
            raise

    def _start_ranks(self, store_port: int) -> None:
        """Start every rank (each joins the store at ``store_port``); they say when ready."""
        for rank in range(self.config.world_size):
            self.ranks.append(self._spawn(rank, store_port))

    def _spawn(self, rank: int, port: int) -> RankProcess:
        cfg = self.config
        env = {**os.environ, **self.torchrun_environment(rank, port), **self.rank_environment()}
        for name in NOT_FOR_RANKS:
            env.pop(name, None)
        if cfg.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(cfg.gpus)
        process, commands, notify = fork_rank(self.write_start(rank, env, store_port=port), rank)
        rp = self.rank_process(rank, ForkedRank(process, commands), notify)
        self.watch(rp)
        return rp

    def watch(self, rp: RankProcess) -> None:
        """Hear of a forked rank: its notify pipe's bytes, and its end (its sentinel)."""
        assert self._news is not None and rp.notify is not None and isinstance(rp.proc, ForkedRank)
        self._news.register(rp.notify, selectors.EVENT_READ, rp)
        self._news.register(rp.proc.sentinel, selectors.EVENT_READ, rp)

    def torchrun_environment(self, rank: int, port: int) -> dict[str, str]:
        """torchrun's environment for one node running every rank (LocalElasticAgent._start_workers),
        so that is_torchelastic_launched() is true; the controller hosts the store."""
        world_size = self.config.world_size
        return dict(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(self.local_rank(rank)),
            LOCAL_WORLD_SIZE=str(world_size),
            GROUP_RANK="0",
            GROUP_WORLD_SIZE="1",
            ROLE_NAME="default",
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(world_size),
            MASTER_ADDR=self.store_host,
            MASTER_PORT=str(port),
            TORCHELASTIC_RUN_ID=self.run_id,
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0",
            # As under torchrun: rank 0 too is a client of the controller's store, so a test's
            # own init_process_group (init=False) opens no listening socket.
            TORCHELASTIC_USE_AGENT_STORE="True",
        )

    def rank_environment(self) -> dict[str, str]:
        """What every rank's environment gets on top of the controller's, however it is started."""
        env = {"PYTHONUNBUFFERED": "1"}
        if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ:
            env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        if self.config.workdir_parent is not None:
            env[SHARED_ROOT_ENV] = str(Path(self.config.workdir_parent) / "ddp_shared")
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        return env

    def local_rank(self, rank: int) -> int:
        """The rank's rank on its node: every rank is on this one."""
        return rank

    def role(self, rank: int, store_port: int | None) -> RankRole:
        """What rank ``rank`` is in this group, on any machine (the rest of its start is local)."""
        cfg = self.config
        return RankRole(
            rank=rank,
            world_size=cfg.world_size,
            backend=cfg.backend,
            init=cfg.init,
            mode=cfg.mode,
            pg_timeout=cfg.pg_timeout,
            store_host=self.store_host,
            store_port=store_port,
            local_rank=self.local_rank(rank),
        )

    def write_start(self, rank: int, env: dict[str, str], store_port: int | None = None) -> Path:
        """The rank's start file (read by :func:`pytest_ddp.rank.entry.forked_main`), ``env`` its whole
        environment."""
        cfg = self.config
        start = rank_start(self.role(rank, store_port), env, self.workdir, cfg.pytest_args, cfg.sys_path)
        return write_start_file(self.workdir, start)

    def rank_process(self, rank: int, proc: RankHandle, notify: Connection | None = None) -> RankProcess:
        paths = rank_files(self.workdir, rank)
        return RankProcess(
            rank=rank,
            proc=proc,
            events=EventReader(str(paths["events"])),
            stdout=paths["stdout"],
            stderr=paths["stderr"],
            dump=paths["dump"],
            notify=notify,
        )

    def _wait_ready(self, deadline: float) -> None:
        ready: dict[int, Ready] = {}
        while len(ready) < len(self.ranks):
            self._wait(0.05)
            for rp in self.ranks:
                for ev in rp.events.read_new():
                    if isinstance(ev, Ready):
                        ready[rp.rank] = ev
                    elif isinstance(ev, Fatal):
                        raise GroupStartError(f"rank {rp.rank} could not start:\n{ev.error}")
                if rp.rank not in ready and rp.exit_code is not None:
                    tail = read_bounded(rp.stderr, 0).splitlines()[-30:]
                    raise GroupStartError(
                        f"rank {rp.rank} exited while starting ({exit_text(rp.exit_code)}):\n"
                        + "\n".join(tail)
                    )
            if time.monotonic() > deadline:
                missing = sorted(set(range(len(self.ranks))) - set(ready))
                raise GroupStartError(f"ranks {missing} were not ready in time")
        self._items = set.intersection(*(set(ev.items) for ev in ready.values()))
        self.collect_errors = list(dict.fromkeys(error for ev in ready.values() for error in ev.errors))

    @property
    def name(self) -> str:
        """``world_size=2, gloo`` (``, init=False`` for such groups)."""
        cfg = self.config
        return f"world_size={cfg.world_size}, {cfg.backend}" + ("" if cfg.init else ", init=False")

    def can_run(self, test_id: str) -> bool:
        """Whether these ranks can run that test (in pytest mode: every rank collected it)."""
        return self.config.mode != "pytest" or test_id in self._items

    @property
    def alive(self) -> bool:
        self._wait(0)
        return bool(self.ranks) and all(rp.exit_code is None for rp in self.ranks)

    def stop(self) -> dict[int, StopTeardown]:
        """Ask every rank to finish its session (session fixtures' teardown), then make sure.

        Returns each rank's teardown report, or what is known of one that owed it
        (:class:`UnfinishedTeardown`); ranks ended before "stop" are left out.  Ranks busy with a
        test handed over ahead are killed instead: they would read "stop" only after it.
        """
        if self.current is not None or self._news is None:  # busy with a test, or killed already
            self.kill()
            return {}
        self._wait(0)  # hear of ranks that ended since the last look
        stopping = [rp for rp in self.ranks if rp.proc.exitcode is None]
        for rp in stopping:
            self._mark_output(rp)  # what each writes from now on is its teardown's
            rp.proc.send(Stop())
        stopped_at, end = time.time(), time.monotonic() + STOP_WAIT
        # A rank's exit shows in its process (forked ranks) or arrives as news (launched ones).
        while self._news is not None and any(rp.proc.exitcode is None for rp in stopping):
            if (left := end - time.monotonic()) <= 0:
                break
            self._wait(min(left, 0.1))
        ends: dict[int, StopTeardown] = {}
        for rp in self.ranks:  # every rank's log: launched ranks on other hosts have no command pipe here
            for ev in rp.events.read_new():
                if isinstance(ev, SessionEnd):
                    ends[rp.rank] = ev
        # Only a pytest session that ran a test has fixtures to tear down, and reports it.
        if self.config.mode == "pytest" and self.tests_run:
            silent = [rp for rp in stopping if rp.rank not in ends]
            ends.update(self._unfinished_teardowns(silent, stopped_at))
        self.kill()
        return ends

    def _unfinished_teardowns(
        self, silent: list[RankProcess], stopped_at: float
    ) -> dict[int, UnfinishedTeardown]:
        """How each rank that sent no teardown report ended, or its stacks if still in it after
        STOP_WAIT (it is killed next).  One that exited 0 is left out: a session reports
        before it exits, so its own code ended it (``os._exit(0)``), and nothing says that failed."""
        codes = {rp.rank: rp.proc.exitcode for rp in silent}
        stacks = self.dump_stacks([rank for rank, code in codes.items() if code is None])
        return {
            rp.rank: UnfinishedTeardown(
                exit_code=codes[rp.rank],
                waited=STOP_WAIT,
                duration=max(0.0, rp.died_at - stopped_at) if rp.died_at is not None else STOP_WAIT,
                stderr=read_bounded(rp.stderr, rp.stderr_offset),
                stacks=stacks.get(rp.rank, ""),
            )
            for rp in silent
            if codes[rp.rank] != 0
        }

    def kill(self) -> None:
        """SIGKILL every rank still alive, reap them, close pipes, remove the folder."""
        if self._news is not None:
            self._news.close()
            self._news = None
        for rp in self.ranks:
            if rp.proc.exitcode is None:
                rp.proc.kill()
        for rp in self.ranks:
            rp.proc.join()
            if rp.notify is not None:
                rp.notify.close()
                rp.notify = None
            rp.events.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- one test -------------------------------------------------------------

    def begin(self, command: RunItem | CallFunction) -> None:
        """Hand the next test to every rank; fresh states record it.  After a test that ended,
        replaced or made a default group, the ranks join the next on a fresh store."""
        if isinstance(command, RunItem) and self._store is not None and self._store.spent(self.states):
            command = dataclasses.replace(command, store_port=self._store.renew())
        self.tests_run += 1
        self.current = self.last_test = command.id
        self.handed_over_at = time.time()
        self.states = [RankState(rank=rp.rank) for rp in self.ranks]
        for rp in self.ranks:
            self._mark_output(rp)
            rp.proc.send(command)

    def _mark_output(self, rp: RankProcess) -> None:
        """What the rank writes from now on belongs to what comes next (a test, or the stop)."""
        rp.stdout_offset = file_size(rp.stdout)
        rp.stderr_offset = file_size(rp.stderr)
        rp.dump_offset = file_size(rp.dump)

    def poll(self, wait: float) -> None:
        """Fold new events and exits into the states until the watchdog has news to judge (every rank
        done or ended, or a rank failed or ended) or ``wait`` is out: a rank done while others run is
        waited past; what came before a wake-up byte drained already (``alive``) is not waited for."""
        end, before = time.monotonic() + wait, self._judged()
        self._fold()
        while self._judged() == before and not all(state.finished for state in self.states):
            left, before = end - time.monotonic(), self._judged()
            self._wait(max(0.0, left))
            self._fold()
            if left <= 0 or self._news is None:  # out of time, or killed: nothing more to hear of
                return

    def _judged(self) -> list[tuple[float | None, bool]]:
        return [(state.failed_at, state.alive) for state in self.states]  # a failure, a death

    def _fold(self) -> None:
        now = time.time()
        for rp, state in zip(self.ranks, self.states):
            # Events first: a rank may have written some just before it died.
            for ev in rp.events.read_new():
                state.apply(ev)
            if state.alive and rp.exit_code is not None:
                state.mark_dead(rp.exit_code, rp.died_at or now)

    def dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Make each live rank write every thread's Python stack; return the dumps."""
        targets = [rp for rp in self.ranks if rp.rank in ranks and rp.exit_code is None]
        for rp in targets:
            rp.proc.request_dump()
        dumps: dict[int, str] = {}
        end = time.monotonic() + STACK_DUMP_WAIT
        pending = list(targets)
        while pending and time.monotonic() < end:
            self._wait(0.01)
            for rp in list(pending):
                text = read_from(rp.dump, rp.dump_offset)
                if rp.proc.dump_complete(text, dumps.get(rp.rank)):
                    pending.remove(rp)
                dumps[rp.rank] = text
        return {rank: text for rank, text in dumps.items() if text}

    @property
    def store_address(self) -> str | None:
        """``host:port`` of the store a test's env:// rendezvous dials now; None without one."""
        return None if self._store is None else f"{self.store_host}:{self._store.port}"

    def process(self, rank: int) -> Process | None:
        """The kernel's word on the rank's process (stopped? SIGUSR1 ignored?); None if gone or elsewhere."""
        pid = self.ranks[rank].proc.pid
        found = None if pid is None else procfs.stat(pid)
        if pid is None or found is None:
            return None
        try:
            return Process.read(found.state, procfs.status(pid))
        except OSError:
            return None

    def peak_rss(self, rank: int) -> int | None:
        """The rank process's peak resident memory so far (VmHWM), in bytes; None if gone, or not here."""
        pid = self.ranks[rank].proc.pid
        if pid is None:  # another machine's rank, or not forked yet
            return None
        try:
            return procfs.size(procfs.status(pid)["VmHWM"])
        except (OSError, ValueError, KeyError):
            return None

    def test_output(self, rank: int) -> dict[str, str]:
        """What the rank's process wrote to its stdout and stderr (fds 1, 2) during this test."""
        rp = self.ranks[rank]
        return {
            "stdout": read_bounded(rp.stdout, rp.stdout_offset),
            "stderr": read_bounded(rp.stderr, rp.stderr_offset),
        }

    def exit_codes(self) -> dict[int, int | None]:
        """Each rank's exit code (negative: the signal), None while it runs."""
        return {rp.rank: rp.proc.exitcode for rp in self.ranks}

    def pids(self) -> list[int]:
        """The rank processes of this machine."""
        return [pid for rp in self.ranks if (pid := rp.proc.pid) is not None]

    # -- plumbing -------------------------------------------------------------

    def _wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a notify byte or a rank's end, and take them in."""
        if self._news is None:  # killed: nothing to hear of, but the caller still waits
            time.sleep(timeout)
            return
        for key, _ in self._news.select(timeout):
            self._news_of(key)

    def _news_of(self, key: selectors.SelectorKey) -> None:
        """A forked rank's notify pipe or sentinel is ready."""
        assert self._news is not None
        rp: RankProcess = key.data
        if key.fileobj is not rp.notify:  # the sentinel: the process ended
            self._news.unregister(key.fileobj)
            rp.exit_code = rp.proc.exitcode
            rp.died_at = time.time()
            return
        try:
            rp.notify.recv_bytes()  # one wake-up byte; any other makes the next wait return at once
        except (EOFError, OSError):  # the rank is gone; its sentinel tells how
            self._news.unregister(rp.notify)
            rp.notify.close()
            rp.notify = None

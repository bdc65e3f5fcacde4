"""A rank group: N rank processes of one world size and backend, and what they share.

Per group: a private folder, a TCPStore on 127.0.0.1 only, and per rank a command pipe and a
notify pipe (a wake-up byte per event worth it; end of file when the rank dies); all else goes
through the rank's event log (:mod:`pytest_ddp.common.protocol`).  Ranks fork from a forkserver
that imported torch once, so a fresh group costs no ``import torch``.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import selectors
import shutil
import tempfile
import time
import uuid
import weakref
from collections import Counter
from dataclasses import dataclass, field
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
    OUTPUTS,
    Descriptor,
    ForkedRank,
    GroupStore,
    RankHandle,
    RankProcess,
    file_size,
    fork_rank,
    rank_files,
    read_from,
    write_start_file,
)

STACK_DUMP_WAIT = 1.0  # seconds to wait for a rank's faulthandler dump
STOP_WAIT = 5.0  # seconds a rank gets to finish its session after "stop"
# Where the folders shared by a test's ranks live (the ``ddp_shared_path`` fixture).
SHARED_ROOT_ENV = "PYTEST_DDP_SHARED_ROOT"
LOOPBACK = "127.0.0.1"  # where a group's store listens, but for a launched world across nodes


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
        self._news = selectors.DefaultSelector()
        self.killed = False  # kill() ran: nothing more to hear of, or to wait for
        self.store_host = LOOPBACK  # where the group's store listens
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
        env = {**os.environ, **self.torchrun_environment(rank, port), **self.rank_environment()}
        for name in NOT_FOR_RANKS:
            env.pop(name, None)
        rp = self.rank_process(rank, RankHandle())
        self.fork(rp, self.write_start(rank, env, store_port=port))
        return rp

    def fork(self, rp: RankProcess, start: Path, descriptors: dict[str, Descriptor] | None = None) -> None:
        """Fork the rank from its start file, and hear of it: its notify pipe's bytes, and its end
        (its sentinel)."""
        rp.proc = fork_rank(start, rp.rank, descriptors)
        rp.proc.watch(self._news, rp)

    def torchrun_environment(self, rank: int, port: int) -> dict[str, str]:
        """torchrun's environment (LocalElasticAgent._start_workers) for the group's ranks on their
        nodes, so that is_torchelastic_launched() is true; the controller hosts the store."""
        world_size = self.config.world_size
        node, local_rank = self.place(rank)
        group_rank, local_world_size = self._nodes[node]
        return dict(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_world_size),
            GROUP_RANK=str(group_rank),
            GROUP_WORLD_SIZE=str(len(self._nodes)),
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

    @functools.cached_property
    def _nodes(self) -> dict[int, tuple[int, int]]:
        """Each node of the group's ranks: (its place in the order of their first ranks, its number of
        ranks); computed once, not once a rank (a launched group's world may be large)."""
        counts = Counter(self.place(rank)[0] for rank in range(self.config.world_size))
        return {node: (index, count) for index, (node, count) in enumerate(counts.items())}

    def rank_environment(self) -> dict[str, str]:
        """What every rank's environment gets on top of the controller's, however it is started."""
        env = {"PYTHONUNBUFFERED": "1"}
        if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ:
            env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        if self.config.workdir_parent is not None:
            env[SHARED_ROOT_ENV] = str(Path(self.config.workdir_parent) / "ddp_shared")
        # A store on loopback has every rank on this machine; across nodes, Gloo's own choice or the user's.
        if "GLOO_SOCKET_IFNAME" not in os.environ and self.store_host == LOOPBACK:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        if self.config.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.config.gpus)
        return env

    def place(self, rank: int) -> tuple[int, int]:
        """The rank's (node, rank on its node): every rank is on this node."""
        return 0, rank

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
            local_rank=self.place(rank)[1],
        )

    def write_start(self, rank: int, env: dict[str, str], store_port: int | None = None) -> Path:
        """The rank's start file (read by :func:`pytest_ddp.rank.entry.forked_main`), ``env`` its whole
        environment."""
        cfg = self.config
        return write_start_file(self.workdir, self.role(rank, store_port), env, cfg.pytest_args, cfg.sys_path)

    def rank_process(self, rank: int, proc: RankHandle) -> RankProcess:
        files = rank_files(self.workdir, rank)
        return RankProcess(rank=rank, proc=proc, events=EventReader(str(files["events"])), files=files)

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
                    tail = read_bounded(rp.files["stderr"], 0).splitlines()[-30:]
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

        Returns each rank's failed teardown: its report, or what is known of one that owed it
        (:class:`UnfinishedTeardown`); ranks ended before "stop" are left out.  Ranks busy with a
        test handed over ahead are killed instead: they would read "stop" only after it.
        """
        if self.current is not None or self.killed:  # busy with a test, or killed already
            self.kill()
            return {}
        self._wait(0)  # hear of ranks that ended since the last look
        stopping = [rp for rp in self.ranks if rp.proc.exitcode is None]
        for rp in stopping:
            self._mark_output(rp)  # what each writes from now on is its teardown's
            rp.proc.send(Stop())
        stopped_at, end = time.time(), time.monotonic() + STOP_WAIT
        # A rank's exit shows in its process (forked ranks) or arrives as news (launched ones).
        while any(rp.proc.exitcode is None for rp in stopping):
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
        return {rank: end for rank, end in ends.items() if end.outcome == "failed"}

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
                stderr=self._output(rp, "stderr"),
                stacks=stacks.get(rp.rank, ""),
            )
            for rp in silent
            if codes[rp.rank] != 0
        }

    def kill(self) -> None:
        """SIGKILL every rank still alive, reap them, close pipes, remove the folder."""
        self._news.close()
        self.killed = True
        for rp in self.ranks:
            if rp.proc.exitcode is None:
                rp.proc.kill()
        for rp in self.ranks:
            rp.proc.join()
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
        rp.offsets = {name: file_size(rp.files[name]) for name in OUTPUTS}

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
            if left <= 0 or self.killed:  # out of time, or killed: nothing more to hear of
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
                text = read_from(rp.files["dump"], rp.offsets["dump"])
                if rp.proc.dump_complete(text, dumps.get(rp.rank)):
                    pending.remove(rp)
                dumps[rp.rank] = text
        return {rank: text for rank, text in dumps.items() if text}

    @property
    def store_address(self) -> str | None:
        """``host:port`` of the store a test's env:// rendezvous dials now; None without one."""
        return None if self._store is None else f"{self.store_host}:{self._store.port}"

    def look_at(self, state: RankState) -> None:
        """The kernel's word on a busy rank's process: stopped? SIGUSR1 ignored? its peak resident
        memory so far (VmHWM)?  Nothing of one gone, or on another machine."""
        pid = self.ranks[state.rank].proc.pid
        found = None if pid is None else procfs.stat(pid)
        if pid is None or found is None:
            return
        try:
            status = procfs.status(pid)
            state.process = Process.read(found.state, status)
            state.peak_rss = procfs.size(status["VmHWM"])
        except (OSError, ValueError, KeyError):
            pass

    def test_output(self, rank: int) -> dict[str, str]:
        """What the rank's process wrote to its stdout and stderr (fds 1, 2) during this test."""
        return {name: self._output(self.ranks[rank], name) for name in ("stdout", "stderr")}

    def _output(self, rp: RankProcess, name: str) -> str:
        """What the rank wrote to its ``stdout`` or ``stderr`` since the current test (or the stop) began."""
        return read_bounded(rp.files[name], rp.offsets[name])

    def exit_codes(self) -> dict[int, int | None]:
        """Each rank's exit code (negative: the signal), None while it runs."""
        return {rp.rank: rp.proc.exitcode for rp in self.ranks}

    def pids(self) -> list[int]:
        """The rank processes of this machine."""
        return [pid for rp in self.ranks if (pid := rp.proc.pid) is not None]

    # -- plumbing -------------------------------------------------------------

    def _wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a notify byte or a rank's end, and take them in."""
        if self.killed:  # nothing to hear of, but the caller still waits
            time.sleep(timeout)
            return
        for key, _ in self._news.select(timeout):
            self._news_of(key)

    def _news_of(self, key: selectors.SelectorKey) -> None:
        """A forked rank's notify pipe or sentinel is ready."""
        rp: RankProcess = key.data
        assert isinstance(rp.proc, ForkedRank)
        if rp.proc.news(self._news, key.fileobj):
            rp.exit_code = rp.proc.exitcode
            rp.died_at = time.time()

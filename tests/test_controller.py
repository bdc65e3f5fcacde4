"""The controller on a fake group: no processes, milliseconds per test.

:class:`FakeGroup` stands in for :class:`pytest_ddp.groups.group.RankGroup` (the
methods the pool and the runner use of it): after ``begin``, its next ``poll`` folds a
scripted ending of the test into real :class:`RankState` objects through real
protocol events, and the real watchdog judges them.  The real-rank behaviour
is covered end to end in tests/groups/test_warm_groups.py and its neighbours.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_ddp.common.ops import DESTROY
from pytest_ddp.common.protocol import (
    CallEvent,
    CallFunction,
    Done,
    Event,
    PhaseStart,
    Report,
    RetEvent,
    RunItem,
    TestStart,
)
from pytest_ddp.config.settings import ALREADY_IMPORTED, Settings, rank_pytest_args
from pytest_ddp.config.spec import RankSpec
from pytest_ddp.controller import Controller
from pytest_ddp.diagnose import watchdog, wording
from pytest_ddp.diagnose.consistency import CountDifference, UnfinishedWork
from pytest_ddp.diagnose.state import RankState, Snapshot
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.groups import spawn
from pytest_ddp.groups.group import GroupConfig, GroupStartError, StopTeardown
from pytest_ddp.groups.runner import GroupPool, StartFailure, TestRun, group_is_reusable
from pytest_ddp.report.merge import merged_reports

SPEC = RankSpec(world_size=2, backend="gloo", timeout=60.0, grace=2.0)
# A group whose default group cannot be joined afresh: MPI_Finalize ends it for good.
MPI_SPEC = dataclasses.replace(SPEC, backend="mpi")
FAILURE = {"longrepr": {"reprcrash": {"message": "AssertionError: boom"}}}


# -- scripted rank endings ---------------------------------------------------------


@dataclass
class Ending:
    """How one rank's test ends: the events it writes, then maybe its death."""

    events: list[Event]
    exit_code: int | None = None  # the rank dies after writing its events


def collective(
    index: int, op: str = "all_reduce", outcome: str = "ok", seq: int | None = None
) -> list[Event]:
    """A call on the default group of two ranks: ``outcome`` ok, raised or running."""
    seq = index + 1 if seq is None else seq
    call = CallEvent(index, op, group_ranks=[0, 1], seq=seq, shapes=[[4]], dtypes=["float32"])
    events: list[Event] = [call]
    if outcome != "running":
        error = None if outcome == "ok" else "RuntimeError: x"
        events.append(RetEvent(index, ok=outcome == "ok", error=error))
    return events


def in_call(calls: list[Event] | None = None) -> list[Event]:
    """A test on one rank that passed its setup and is in its call, after these calls."""
    setup: list[Event] = [TestStart("t"), PhaseStart("setup"), Report("setup", "passed"), PhaseStart("call")]
    return [*setup, *(calls or [])]


def ended(outcome: str = "passed", calls: list[Event] | None = None, done: Done | None = None) -> list[Event]:
    """A whole test on one rank: setup passes, the call ends with ``outcome``, teardown passes."""
    return [
        *in_call(calls),
        Report("call", outcome, data=FAILURE if outcome == "failed" else None),
        PhaseStart("teardown"),
        Report("teardown", "passed"),
        done or Done(),
    ]


def passes(rank: int) -> Ending:
    return Ending(ended("passed", collective(0)))


def fails(rank: int) -> Ending:
    """Every rank raises after a consistent all_reduce: an ordinary failure."""
    return Ending(ended("failed", collective(0)))


def rank1_dies(rank: int) -> Ending:
    if rank == 1:
        return Ending(in_call(), exit_code=-9)
    return Ending(ended("passed"))


def rank1_blocks_alone(rank: int) -> Ending:
    """Rank 0 finishes without the all_reduce rank 1 waits in: a certain deadlock."""
    if rank == 1:
        return Ending(in_call(collective(0, outcome="running")))
    return Ending(ended("passed"))


def play(ending: Ending, state: RankState) -> None:
    """Fold a rank's scripted ending into its state, as the group's poll folds its event log."""
    for event in ending.events:
        state.apply(event)
    if ending.exit_code is not None:
        state.mark_dead(ending.exit_code, time.time())


def states_of(script: Callable[[int], Ending], world_size: int = 2) -> list[RankState]:
    """The rank states a scripted test leaves."""
    states = [RankState(rank=rank) for rank in range(world_size)]
    for state in states:
        play(script(state.rank), state)
    return states


# -- the fake group ---------------------------------------------------------------


class FakeGroup:
    """A rank group that replays scripted endings, in :class:`pytest_ddp.groups.group.RankGroup`'s place."""

    def __init__(self, config: GroupConfig, fleet: Fleet) -> None:
        self.config = config
        self.fleet = fleet
        self.log: list[str] = []  # "start", "begin <id>", "stop", "kill", in order
        self.states: list[RankState] = []
        self.current: str | None = None
        self.last_test: str | None = None
        self.name = f"world_size={config.world_size}, {config.backend}"
        self.handed_over_at = 0.0
        self.collect_errors: list[str] = list(fleet.collect_errors)
        self.collected = fleet.collected  # None: every test
        self.alive = False
        self._pending: list[Ending] = []

    def start(self, deadline: float) -> None:
        self.log.append("start")
        if self.fleet.start_error is not None:
            raise GroupStartError(self.fleet.start_error)
        self.alive = True

    def can_run(self, test_id: str) -> bool:
        return self.collected is None or test_id in self.collected

    def begin(self, command: RunItem | CallFunction) -> None:
        self.log.append(f"begin {command.id}")
        self.current = self.last_test = command.id
        self.handed_over_at = time.time()
        self.states = [RankState(rank=rank) for rank in range(self.config.world_size)]
        script = self.fleet.endings.get(command.id, passes)
        self._pending = [script(rank) for rank in range(self.config.world_size)]

    def poll(self, wait: float) -> None:
        if not self._pending:
            raise AssertionError("the watchdog waits for ranks the script left running")
        for state, ending in zip(self.states, self._pending):
            play(ending, state)
            self.alive = self.alive and state.alive
        self._pending = []

    def dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        return {rank: f"stack of rank {rank}\n" for rank in ranks}

    store_address = None

    def look_at(self, state: RankState) -> None:
        state.peak_rss = 1 << 20

    def test_output(self, rank: int) -> dict[str, str]:
        return {"stdout": f"out of rank {rank}\n", "stderr": ""}

    def exit_codes(self) -> dict[int, int | None]:
        code = -9 if "kill" in self.log else 0
        return {rank: code for rank in range(self.config.world_size)}

    def pids(self) -> list[int]:
        return []

    def stop(self) -> dict[int, StopTeardown]:
        self.log.append("stop")
        self.alive = False
        return {}

    def kill(self) -> None:
        self.log.append("kill")
        self.alive = False


@dataclass
class Fleet:
    """Makes the pool's fake groups and scripts how each test ends on them."""

    endings: dict[str, Callable[[int], Ending]] = field(default_factory=dict)  # test id -> script
    collected: set[str] | None = None  # what new groups collect; None: every test
    collect_errors: list[str] = field(default_factory=list)
    start_error: str | None = None  # new groups fail to start with it
    groups: list[FakeGroup] = field(default_factory=list)

    def make_group(self, config: GroupConfig) -> FakeGroup:
        group = FakeGroup(config, self)
        self.groups.append(group)
        return group

    def pool(self, max_groups: int = 2) -> GroupPool:
        return GroupPool(max_groups, make_group=self.make_group)


def run(
    pool: GroupPool, test_id: str, spec: RankSpec = SPEC, keep: bool = True, follow: str | None = None
) -> TestRun | StartFailure:
    config = GroupConfig(world_size=spec.world_size, backend=spec.backend, init=spec.init, pg_timeout=600)
    following = RunItem(follow) if follow is not None else None
    return pool.run(spec, RunItem(test_id), lambda: config, keep=keep, follow=following)


def passed(result: TestRun | StartFailure) -> TestRun:
    assert isinstance(result, TestRun)
    assert result.verdict == Verdict("done"), result.verdict
    return result


# -- GroupPool: reuse and eviction ----------------------------------------------------


def test_a_group_is_reused_for_later_tests_with_the_same_key() -> None:
    fleet = Fleet()
    pool = fleet.pool()
    first = passed(run(pool, "t1"))
    second = passed(run(pool, "t2"))
    assert len(fleet.groups) == pool.groups_started == 1
    assert fleet.groups[0].log == ["start", "begin t1", "begin t2"]
    assert first.cold_start is not None and second.cold_start is None
    assert second.outputs == {
        0: {"stdout": "out of rank 0\n", "stderr": ""},
        1: {"stdout": "out of rank 1\n", "stderr": ""},
    }


def test_max_groups_stops_the_least_recently_used_group() -> None:
    fleet = Fleet()
    pool = fleet.pool(max_groups=2)
    two, three, four = SPEC, dataclasses.replace(SPEC, world_size=3), dataclasses.replace(SPEC, world_size=4)
    run(pool, "a", two)
    run(pool, "b", three)
    run(pool, "c", two)  # the group of two is now the most recently used
    run(pool, "d", four)
    by_size = {group.config.world_size: group for group in fleet.groups}
    assert len(fleet.groups) == 3
    assert by_size[3].log[-1] == "stop"
    assert "stop" not in by_size[2].log and "stop" not in by_size[4].log
    pool.close()
    assert by_size[2].log[-1] == by_size[4].log[-1] == "stop"


def test_a_follow_is_handed_to_the_ranks_with_the_killing_signals_held() -> None:
    """A follow that SIGTERMs this process (benchmarks/chaos.py: a test that kills its xdist worker)
    ended it between the hand-over and the end of the test that passed, reported as the crash: the
    hold begins before the hand-over (the controller releases it as the next test begins)."""
    fleet = Fleet()
    pool = fleet.pool()
    passed(run(pool, "t1"))
    assert spawn._held is None  # no follow, nothing held
    passed(run(pool, "t2", follow="t3"))
    try:
        assert spawn._held == [] and fleet.groups[0].log[-1] == "begin t3"  # a kill now waits
    finally:
        spawn.release_killing_signals()
    assert spawn._held is None


def test_the_next_test_releases_the_killing_signals_as_it_begins() -> None:
    """The hold ends as the next test begins, whatever it is (here an ordinary test's item): a kill
    its follow sent while held kills this process within that test, as xdist must see it."""
    controller = Controller(None, Settings(), None)  # type: ignore[arg-type]  # no config read here
    item = types.SimpleNamespace(stash=pytest.Stash(), get_closest_marker=lambda name: None)
    spawn.hold_killing_signals()
    try:
        assert controller.pytest_runtest_protocol(item, None) is None  # not a ddp item: pytest runs it
        assert spawn._held is None
    finally:
        spawn.release_killing_signals()


def test_keep_false_stops_the_group_after_its_test() -> None:
    fleet = Fleet()
    pool = fleet.pool()
    result = passed(run(pool, "last", keep=False))
    assert fleet.groups[0].log == ["start", "begin last", "stop"]
    assert result.exit_codes == {0: 0, 1: 0}
    run(pool, "after")
    assert len(fleet.groups) == 2


def test_an_isolated_test_gets_its_own_group_and_leaves_the_warm_one_be() -> None:
    fleet = Fleet()
    pool = fleet.pool()
    run(pool, "warm")
    passed(run(pool, "alone", dataclasses.replace(SPEC, isolated=True)))
    run(pool, "warm again")
    warm, alone = fleet.groups
    assert alone.log == ["start", "begin alone", "stop"]
    assert warm.log == ["start", "begin warm", "begin warm again"]


@pytest.mark.parametrize("why", ["dead", "not collected", "busy with another test"])
def test_a_warm_group_that_cannot_take_the_test_is_stopped_and_replaced(why: str) -> None:
    fleet = Fleet()
    pool = fleet.pool()
    run(pool, "t1", follow="t2" if why == "busy with another test" else None)
    warm = fleet.groups[0]
    if why == "dead":
        warm.alive = False
    elif why == "not collected":
        warm.collected = {"t1"}
    passed(run(pool, "t3"))
    assert len(fleet.groups) == 2
    assert warm.log[-1] == "stop"
    assert fleet.groups[1].log == ["start", "begin t3"]


def test_a_group_that_fails_to_start_is_a_start_failure() -> None:
    fleet = Fleet(start_error="rank 1 could not start:\nImportError: no torch")
    result = run(fleet.pool(), "t1")
    assert isinstance(result, StartFailure)
    assert result.error == "rank 1 could not start:\nImportError: no torch"
    assert fleet.groups[0].log == ["start"]


def test_a_fresh_group_that_did_not_collect_the_test_is_a_start_failure() -> None:
    fleet = Fleet(collected={"other"}, collect_errors=["test_x.py: SyntaxError"])
    result = run(fleet.pool(), "t1")
    assert isinstance(result, StartFailure)
    assert result.error == "the ranks did not collect t1; their collection errors:\n\ntest_x.py: SyntaxError"
    assert fleet.groups[0].log == ["start", "stop"]


# -- supervise: what a verdict does to the group ------------------------------------------


def test_a_stopped_test_dumps_the_busy_ranks_stacks_and_kills_the_group() -> None:
    fleet = Fleet(endings={"hangs": rank1_blocks_alone})
    pool = fleet.pool()
    result = run(pool, "hangs")
    assert isinstance(result, TestRun)
    verdict = result.verdict
    assert (verdict.status, verdict.kind, verdict.culprits) == ("deadlock", "partial", [0])
    assert result.stacks == {1: "stack of rank 1\n"}
    assert result.states[1].peak_rss == 1 << 20
    assert fleet.groups[0].log == ["start", "begin hangs", "kill", "stop"]
    assert result.exit_codes == {0: -9, 1: -9}


def test_a_bug_in_the_controller_kills_the_group() -> None:
    fleet = Fleet()
    pool = fleet.pool()
    run(pool, "t1")
    def interrupted(wait: float) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the controller waits for the ranks

    fleet.groups[0].poll = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run(pool, "t2")
    assert fleet.groups[0].log[-1] == "kill"


# -- the next test handed over early (follow) -----------------------------------------


def test_the_next_test_is_handed_over_after_a_clean_pass() -> None:
    fleet = Fleet()
    pool = fleet.pool()
    passed(run(pool, "t1", follow="t2"))
    group = fleet.groups[0]
    assert group.log == ["start", "begin t1", "begin t2"]
    assert group.current == "t2"
    passed(run(pool, "t2"))  # judged without a second hand-over
    assert group.log == ["start", "begin t1", "begin t2"]


@pytest.mark.parametrize(
    "script, kept",
    [(fails, True), (rank1_dies, False), (rank1_blocks_alone, False)],
    ids=["ordinary failure", "a rank died", "deadlock"],
)
def test_the_next_test_is_not_handed_over_after_a_failure(
    script: Callable[[int], Ending], kept: bool
) -> None:
    fleet = Fleet(endings={"t1": script})
    pool = fleet.pool()
    result = run(pool, "t1", follow="t2")
    assert isinstance(result, TestRun) and result.verdict.kind is not None
    group = fleet.groups[0]
    assert "begin t2" not in group.log
    assert group.current is None
    passed(run(pool, "t2"))
    assert ("begin t2" in group.log) == kept
    assert len(fleet.groups) == (1 if kept else 2)


def test_the_next_test_is_not_handed_over_when_the_collectives_differ() -> None:
    def rank1_one_more(rank: int) -> Ending:
        return Ending(ended("passed", collective(0) + (collective(1) if rank == 1 else [])))

    fleet = Fleet(endings={"t1": rank1_one_more})
    pool = fleet.pool()
    result = run(pool, "t1", follow="t2")
    assert isinstance(result, TestRun) and result.sequence_differences
    assert fleet.groups[0].log == ["start", "begin t1", "stop"]


# -- group_is_reusable: each reason a group is dropped ------------------------------


def standing(alive: bool = True) -> FakeGroup:
    """A group after its test: group_is_reusable asks it only whether it is alive."""
    group = Fleet().make_group(GroupConfig(world_size=2, backend="gloo", init=True, pg_timeout=600))
    group.alive = alive
    return group


def made_run(
    states: list[RankState], verdict: Verdict | None = None, spec: RankSpec = SPEC, **fields: Any
) -> TestRun:
    """A TestRun of these states, judged by the watchdog unless a verdict is given."""
    if verdict is None:
        snapshot = Snapshot(now=time.time(), started=time.time(), timeout=60, grace=2, ranks=states)
        verdict = watchdog.judge(snapshot)
    return TestRun(
        test_id="t", spec=spec, states=states, verdict=verdict, elapsed=0.1, ended=time.time(), **fields
    )



def with_done(**done: Any) -> Callable[[int], Ending]:
    def script(rank: int) -> Ending:
        return Ending(ended("passed", collective(0), Done(**done) if rank == 1 else Done()))

    return script


def with_calls(calls: list[Event]) -> Callable[[int], Ending]:
    def script(rank: int) -> Ending:
        return Ending(ended("passed", calls))

    return script


def test_a_clean_pass_and_an_ordinary_failure_keep_the_group() -> None:
    assert group_is_reusable(made_run(states_of(passes)), standing())
    failure = made_run(states_of(fails))
    assert failure.verdict.kind == "failed"
    assert group_is_reusable(failure, standing())


@pytest.mark.parametrize(
    "make_run",
    [
        # Ranks stopped before the test ended on all of them, whatever the verdict's kind.
        lambda: made_run(states_of(passes), Verdict("stopped")),
        lambda: made_run(states_of(passes), Verdict("timeout")),
        lambda: made_run(states_of(rank1_dies)),
        lambda: made_run(states_of(passes), spec=dataclasses.replace(SPEC, isolated=True)),
        lambda: made_run(states_of(passes), sequence_differences=[CountDifference("WORLD", {0: 1, 1: 2})]),
        lambda: made_run(states_of(passes), unfinished_work=[UnfinishedWork(0, None, 3, "still running")]),
        lambda: made_run(states_of(with_done(group_intact=False)), spec=MPI_SPEC),
        lambda: made_run(states_of(with_done(in_flight=[{"i": 0, "err": "Timed out"}]))),
        lambda: made_run(states_of(with_calls(collective(0, outcome="raised")))),
        lambda: made_run(states_of(with_calls(collective(0, "barrier", outcome="running"))), Verdict("done")),
        lambda: made_run(states_of(with_calls(collective(0, DESTROY, seq=0))), spec=MPI_SPEC),
    ],
    ids=[
        "stopped verdict",
        "timeout verdict",
        "dead rank",
        "isolated",
        "collectives differ",
        "unfinished work",
        "MPI world finalized",
        "async work in flight",
        "a call raised",
        "a call still running",
        "destroy_process_group in an MPI world",
    ],
)
def test_a_group_is_dropped(make_run: Callable[[], TestRun]) -> None:
    assert not group_is_reusable(make_run(), standing())


def test_a_group_not_alive_after_its_test_is_dropped() -> None:
    assert not group_is_reusable(made_run(states_of(passes)), standing(alive=False))


@pytest.mark.parametrize(
    "kind", ["rank_exited", "partial", "mismatch", "p2p_cycle", "p2p_unmatched", "init", "timeout"]
)
def test_a_group_is_dropped_after_a_distributed_fault(kind: str) -> None:
    assert not group_is_reusable(made_run(states_of(passes), Verdict("done", kind)), standing())


# -- merging the ranks' reports -------------------------------------------------------


class Merge:
    """Builds rank reports for the running test item and merges them as the controller does."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.item = request.node
        self.config = request.config

    def report(
        self, when: str, outcome: str, longrepr: Any = None, wasxfail: str | None = None
    ) -> list[Event]:
        """A phase on one rank, as the rank writes it: the serialized pytest report."""
        item = self.item
        location = item.location
        rep = pytest.TestReport(item.nodeid, location, {}, outcome, longrepr, when)  # type: ignore[arg-type]
        if wasxfail is not None:
            rep.wasxfail = wasxfail  # type: ignore[attr-defined]
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=rep)
        return [PhaseStart(when), Report(when, outcome, 0.01, data)]

    def passed(self, when: str) -> list[Event]:
        return [PhaseStart(when), Report(when, "passed", 0.01)]  # a plain pass, sent without its report

    def merged(self, *ranks: list[Event], **fields: Any) -> dict[str, pytest.TestReport]:
        """The merged reports by phase of the ranks' events (each rank ends its test unless
        its events stop short: then it is stuck, and the watchdog stops it at its timeout)."""
        states = [RankState(rank=rank) for rank in range(len(ranks))]
        for state, events in zip(states, ranks):
            play(Ending([TestStart("t"), *events]), state)
        snapshot = Snapshot(now=time.time(), started=time.time() - 1, timeout=0.5, grace=2, ranks=states)
        verdict = wording.worded(watchdog.judge(snapshot), states)
        reports, _ = merged_reports(self.item, made_run(states, verdict, **fields), self.config)
        return {rep.when: rep for rep in reports}

    def whole(self, call: list[Event]) -> list[Event]:
        return [*self.passed("setup"), *call, *self.passed("teardown"), Done()]


@pytest.fixture
def merge(request: pytest.FixtureRequest) -> Merge:
    return Merge(request)


def outcomes(reports: dict[str, pytest.TestReport]) -> dict[str, str]:
    return {when: rep.outcome for when, rep in reports.items()}


def test_a_ranks_report_stays_as_it_was_sent_after_the_merge(merge: Merge) -> None:
    """pytest turns a serialized report's dicts into its objects in place: the merge turns a copy,
    and the rank's data is read as sent after it (its raise's line: diagnose.own_lines)."""
    try:
        raise AssertionError("boom")
    except AssertionError:
        longrepr = pytest.ExceptionInfo.from_current().getrepr()
    state = RankState(rank=0)
    play(Ending([TestStart("t"), *merge.whole(merge.report("call", "failed", longrepr))]), state)
    sent = copy.deepcopy(state.reports["call"]["data"])
    merged_reports(merge.item, made_run([state]), merge.config)
    assert isinstance(sent["longrepr"], dict) and state.reports["call"]["data"] == sent


def test_an_xfail_on_one_rank_xfails_the_test(merge: Merge) -> None:
    xfailed = merge.report("call", "skipped", wasxfail="known bug")
    for other in (
        merge.report("call", "passed", wasxfail="known bug"),  # XPASS
        merge.report("call", "failed", "[XPASS(strict)] known bug"),
    ):
        reports = merge.merged(merge.whole(xfailed), merge.whole(other))
        assert outcomes(reports) == {"setup": "passed", "call": "skipped", "teardown": "passed"}
        assert reports["call"].wasxfail == "known bug"  # type: ignore[attr-defined]


def test_a_strict_xpass_on_every_rank_fails(merge: Merge) -> None:
    xpass = merge.whole(merge.report("call", "failed", "[XPASS(strict)] known bug"))
    reports = merge.merged(xpass, xpass)
    assert reports["call"].outcome == "failed"
    assert not hasattr(reports["call"], "wasxfail")


def test_an_xpass_on_every_rank_passes_as_xpassed(merge: Merge) -> None:
    xpass = merge.whole(merge.report("call", "passed", wasxfail="fixed now"))
    reports = merge.merged(xpass, xpass)
    assert reports["call"].outcome == "passed"
    assert reports["call"].wasxfail == "fixed now"  # type: ignore[attr-defined]


def test_a_skip_on_every_rank_skips_and_one_on_some_ranks_passes(merge: Merge) -> None:
    skip = ("test_controller.py", 7, "Skipped: no GPU")
    skipped = [*merge.report("setup", "skipped", skip), *merge.passed("teardown"), Done()]
    reports = merge.merged(skipped, skipped)
    assert outcomes(reports) == {"setup": "skipped", "teardown": "passed"}
    assert reports["setup"].longrepr == skip
    runs_on = merge.whole(merge.passed("call"))
    reports = merge.merged(merge.whole(merge.report("call", "skipped", skip)), runs_on)
    assert outcomes(reports) == {"setup": "passed", "call": "passed", "teardown": "passed"}
    # A rank skipped at setup has no call to report: it is not stuck there.
    reports = merge.merged(skipped, runs_on)
    assert outcomes(reports) == {"setup": "passed", "call": "passed", "teardown": "passed"}


def test_a_failure_in_setup_fails_it_and_skips_the_call(merge: Merge) -> None:
    rank0 = [*merge.report("setup", "failed", "E   fixture broke"), *merge.passed("teardown"), Done()]
    reports = merge.merged(rank0, merge.whole(merge.passed("call")))
    assert outcomes(reports) == {"setup": "failed", "teardown": "passed"}
    assert "fixture broke" in str(reports["setup"].longrepr)


def test_a_rank_stuck_in_a_phase_fails_that_phase_with_the_diagnosis(merge: Merge) -> None:
    stuck_in_call = [*merge.passed("setup"), PhaseStart("call"), *collective(0, outcome="running")]
    finished = merge.whole(merge.passed("call"))
    reports = merge.merged(finished, stuck_in_call)
    assert outcomes(reports) == {"setup": "passed", "call": "failed", "teardown": "passed"}
    assert str(reports["call"].longrepr).splitlines()[0].endswith(" [ddp deadlock, partial, 0.10 s]")
    stuck_in_teardown = [*merge.passed("setup"), *merge.passed("call"), PhaseStart("teardown")]
    reports = merge.merged(finished, stuck_in_teardown)
    assert outcomes(reports) == {"setup": "passed", "call": "passed", "teardown": "failed"}
    assert str(reports["teardown"].longrepr).startswith("timed out")


def test_a_pass_whose_collectives_differ_fails_its_call(merge: Merge) -> None:
    whole = merge.whole(merge.passed("call"))
    reports = merge.merged(whole, whole, sequence_differences=[CountDifference("WORLD", {0: 1, 1: 2})])
    assert outcomes(reports) == {"setup": "passed", "call": "failed", "teardown": "passed"}
    assert str(reports["call"].longrepr).startswith("the ranks' collective sequences differ [ddp failed]")


def test_each_ranks_output_goes_with_the_call_report(merge: Merge) -> None:
    whole = merge.whole(merge.passed("call"))
    reports = merge.merged(whole, whole, outputs={1: {"stdout": "hello\n", "stderr": ""}})
    assert reports["call"].sections == [("Captured stdout (rank 1)", "hello\n")]


def test_a_start_failure_is_an_error_at_setup(merge: Merge) -> None:
    failure = StartFailure("t", SPEC, "rank 1 could not start:\nImportError: no torch", 0.2)
    reports, built = merged_reports(merge.item, failure, merge.config)
    assert [(rep.when, rep.outcome) for rep in reports] == [("setup", "failed"), ("teardown", "passed")]
    assert str(reports[0].longrepr) == "ddp: rank 1 could not start\n\nImportError: no torch"
    assert built is None


# -- the rank's command line ----------------------------------------------------------


def test_the_rank_command_line_repeats_the_set_up_and_clears_addopts(
    pytester: pytest.Pytester, request: pytest.FixtureRequest
) -> None:
    # Neither found on their own: an ini file of another name, a rootdir that is not an ancestor.
    inifile = pytester.mkdir("conf") / "custom.ini"
    inifile.write_text("[pytest]\naddopts = -x --showlocals\n")
    rootdir = pytester.mkdir("root")
    config = pytester.parseconfig(
        "-c", str(inifile), "--rootdir", str(rootdir), "-p", "no:doctest", "-o", "xfail_strict=true",
        "-W", "error::UserWarning", "--import-mode=importlib", "--tb=line", "--strict-markers",
    )
    args = rank_pytest_args(config, [request.node])
    assert args[args.index("addopts=") - 1 : args.index("addopts=") + 1] == ["-o", "addopts="]
    assert args[-1] == f"{rootdir / request.node.nodeid.split('::')[0]}::{request.node.name}"
    # The rank's pytest reads its command line as this session's set-up, without the addopts.
    rank_config = pytester.parseconfig(*args)
    assert rank_config.rootpath == config.rootpath == rootdir
    assert rank_config.inipath == config.inipath == inifile
    assert "no:doctest" in rank_config.option.plugins
    assert "xfail_strict=true" in rank_config.option.override_ini
    # The user's filters, then the one that keeps the plugin's own rewrite warning from them.
    assert rank_config.known_args_namespace.pythonwarnings == [
        "error::UserWarning", f"ignore:{ALREADY_IMPORTED}:pytest.PytestAssertRewriteWarning"
    ]
    assert rank_config.option.importmode == "importlib"
    assert rank_config.option.tbstyle == "line"
    assert rank_config.option.strict_markers
    assert rank_config.option.showlocals  # carried over from the addopts, by name
    assert config.option.maxfail == 1 and not rank_config.option.maxfail  # -x in addopts is not

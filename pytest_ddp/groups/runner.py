"""Run one test on a rank group under the watchdog's eye; keep warm groups for the next.

While a test runs: wait for news from the ranks (or a poll interval), fold it in, ask the
watchdog.  On any verdict but "done" the live ranks dump their stacks and the group is killed.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ddp.common.ops import DESTROY
from pytest_ddp.common.protocol import CallFunction, RunItem
from pytest_ddp.config.spec import RankSpec
from pytest_ddp.diagnose import consistency, mismatches, watchdog, wording
from pytest_ddp.diagnose.state import RankState, Snapshot
from pytest_ddp.diagnose.verdicts import MembersDiffer
from pytest_ddp.groups.group import GroupConfig, GroupStartError, RankGroup, StopTeardown
from pytest_ddp.groups.spawn import hold_killing_signals

POLL_INTERVAL = 0.05  # seconds between watchdog looks when no rank has news
START_ALLOWANCE = 120.0  # seconds a group gets to start, on top of the test's timeout


@dataclass
class StoppedGroupFailure:
    """A warm group stopped after its last test was reported, whose ranks failed to tear down
    the fixtures they still held: an error of no test left to report."""

    group: str  # RankGroup.name
    last_test: str  # node id of the last test the group ran
    failures: dict[int, StopTeardown]  # rank -> its failed teardown


def _stop(group: RankGroup) -> list[StoppedGroupFailure]:
    """Stop a group whose last test was already reported; its teardown failure, if any."""
    failed = group.stop()
    if not failed or group.last_test is None:
        return []
    return [StoppedGroupFailure(group.name, group.last_test, failed)]


@dataclass
class TestRun:
    """What happened to one test on every rank."""

    __test__ = False  # not a pytest test class

    test_id: str
    spec: RankSpec
    states: list[RankState]
    verdict: watchdog.Verdict
    elapsed: float  # seconds from hand-over to verdict
    ended: float  # time.time() of the verdict
    stacks: dict[int, str] = field(default_factory=dict)  # ranks stopped while busy
    outputs: dict[int, dict[str, str]] = field(default_factory=dict)  # rank -> stdout, stderr
    sequence_differences: list[consistency.SequenceDifference] = field(default_factory=list)
    # async work left in flight
    unfinished_work: list[consistency.UnfinishedWork] = field(default_factory=list)
    # MPI sends nobody took
    unreceived_messages: list[consistency.UnreceivedMessage] = field(default_factory=list)
    cold_start: float | None = None  # seconds spent starting a fresh group, if one was started
    exit_codes: dict[int, int | None] = field(default_factory=dict)  # once the group was stopped
    # Stopped right after this test: each rank's failed teardown, part of this test's.
    stop_teardown: dict[int, StopTeardown] = field(default_factory=dict)
    # Other groups stopped to make room for this test, whose teardown failed.
    stopped_groups: list[StoppedGroupFailure] = field(default_factory=list)
    faults_not_fired: list[str] = field(default_factory=list)  # declared faults whose call never came

    @property
    def started(self) -> float:
        """time.time() of the hand-over: the report's and the timeline's origin."""
        return self.ended - self.elapsed

    @property
    def collectives_wrong(self) -> bool:
        """Fails a test that passed on every rank: the ranks' collective sequences differ or
        they made a group of other members (the verdict after the test names them), asynchronous
        work was left in flight, or MPI messages were never received."""
        members_differ = isinstance(self.verdict.finding, MembersDiffer)
        left_behind = self.unfinished_work or self.unreceived_messages
        return bool(self.sequence_differences or members_differ or left_behind)

    @property
    def stopped(self) -> bool:
        """The ranks were stopped before the test ended on all of them."""
        return self.verdict.status not in ("done", "wait")


@dataclass
class StartFailure:
    """A test no rank ran: its group could not start, or its ranks did not collect it."""

    test_id: str
    spec: RankSpec
    error: str  # which rank and why, or the ranks' collection errors
    elapsed: float  # seconds spent starting the group
    stopped_groups: list[StoppedGroupFailure] = field(default_factory=list)  # as in TestRun


SOURCE_LIMIT = 1 << 20  # bytes: a call site's file larger than this is not read


def _source_files() -> Callable[[str], str | None]:
    """A file's text by a call site's name for it, read once; None unless a readable regular
    file of at most SOURCE_LIMIT bytes (a rank gave the name: never block on a FIFO)."""

    @functools.cache
    def read(file: str) -> str | None:
        path = Path(file)
        try:
            if path.is_file() and path.stat().st_size <= SOURCE_LIMIT:
                return path.read_text()
        except (OSError, ValueError):  # ValueError: undecodable text, or a NUL in the name
            pass
        return None

    return read


def supervise(group: RankGroup, spec: RankSpec) -> TestRun:
    """Watch the test handed over to the group until a verdict."""
    started = group.handed_over_at
    watch = watchdog.Watch(_source_files())
    verdict = None
    while verdict is None:
        group.poll(POLL_INTERVAL)
        snapshot = Snapshot(
            now=time.time(), started=started, timeout=spec.timeout, grace=spec.grace, ranks=group.states,
            store=group.store_address,
        )
        verdict = watch.verdict(snapshot)
    ended = time.time()
    # The ranks stopped while busy: named so, not "running" (finished ones reported theirs).
    busy = [s for s in group.states if not s.finished] if verdict.status != "done" else []
    for state in busy:
        group.look_at(state)
    verdict = wording.worded(verdict, group.states)
    run = TestRun(group.current or "", spec, group.states, verdict, ended - started, ended)
    group.current = None
    run.stacks = group.dump_stacks([s.rank for s in busy])
    for state in busy:
        state.stack_missing = state.rank not in run.stacks
    run.outputs = {state.rank: group.test_output(state.rank) for state in group.states}
    if verdict.status != "done":
        group.kill()
        return run
    if verdict.kind is None:
        # A rank an injected fault ended made fewer calls on purpose: the survivors are compared.
        survivors = [s for s in group.states if not s.died_as_injected]
        if spec.check_collectives:
            run.sequence_differences = consistency.compare_sequences(survivors)
            # Calls the ranks survived, though they differ: who departed, as the majority says;
            # else groups the ranks made of other members, which met by chance.
            by_rank = {s.rank: s for s in survivors}
            found = None
            if run.sequence_differences:
                found = mismatches.finished_mismatch("done", by_rank)
            if found is None:
                found = mismatches.new_group_members("done", by_rank)
            if found is not None:
                run.verdict = wording.worded(found, group.states)
            run.unfinished_work = consistency.unfinished_work(survivors)
        run.faults_not_fired = not_fired(spec, group.states)
    if spec.check_collectives:
        # Also after a failure: a message left behind would be the next test's on a warm MPI world.
        run.unreceived_messages = consistency.unreceived_messages(group.states)
    return run


def not_fired(spec: RankSpec, states: list[RankState]) -> list[str]:
    """The test's declared faults that never fired: its rank made fewer such calls, or an
    injected fault had ended it before (said so)."""
    fired = {(s.rank, event.text) for s in states for event in s.injected}
    ended = {s.rank: s.ended_by.text for s in states if s.ended_by is not None}
    return [
        str(f) + (f" (never reached: {ended[f.rank]} ended the rank first)" if f.rank in ended else "")
        for f in spec.faults
        if (f.rank, str(f)) not in fired
    ]


def _can_take(group: RankGroup, test_id: str) -> bool:
    """Whether a warm group can run that test: alive, collected it, and not busy
    with another test handed over ahead."""
    return group.alive and group.can_run(test_id) and group.current in (None, test_id)


def group_is_reusable(run: TestRun, group: RankGroup) -> bool:
    """A group may serve the next test only if nothing about it is in doubt."""
    if run.stopped or not group.alive or run.spec.isolated:
        return False
    # An ordinary failure ("failed": ranks raised, no distributed fault) keeps the group.
    if run.collectives_wrong or run.verdict.kind not in (None, "failed"):
        return False
    # A default group the test ended, replaced or made is joined afresh on a fresh store before
    # the next test (RankGroup.begin); an MPI world is not: MPI_Finalize ends it for good.
    renewable = run.spec.backend != "mpi"
    for state in run.states:
        if (not state.group_intact and not renewable) or state.in_flight or state.threads_left:
            return False
        for call in state.calls:
            # A collective that raised in its argument checks, before the backend had it, left
            # the group as it was (torch's own tests make some raise on purpose).
            untouched = call.state == "raised" and call.before_backend
            if (call.state != "ok" and not untouched) or (call.op == DESTROY and not renewable):
                return False
    return True


def new_group(config: GroupConfig) -> RankGroup:
    """A group of ranks, not yet started: started by an MPI launcher for MPI, else forked."""
    if config.backend == "mpi":
        from pytest_ddp.groups.mpi_group import MpiGroup

        return MpiGroup(config)
    return RankGroup(config)


class GroupPool:
    """Warm groups by key, at most ``max_groups`` alive, least recently used stopped first."""

    def __init__(self, max_groups: int, make_group: Callable[[GroupConfig], RankGroup] = new_group) -> None:
        self.max_groups = max_groups
        self._make_group = make_group
        self._groups: OrderedDict[tuple[Any, ...], RankGroup] = OrderedDict()
        self.groups_started = 0

    def run(
        self,
        spec: RankSpec,
        command: RunItem | CallFunction,
        make_config: Callable[[], GroupConfig],
        keep: bool,
        follow: RunItem | CallFunction | None = None,
    ) -> TestRun | StartFailure:
        """Run ``command`` on a warm group of ``spec``'s key, or on a fresh one.

        ``keep``: a later test will want this group (else it is stopped after).  ``follow``: the
        next test's command, handed over once this one passed so the ranks start it meanwhile;
        the killing signals are held from then on (:func:`~pytest_ddp.groups.spawn.hold_killing_signals`).
        """
        key = spec.group_key
        stopped: list[StoppedGroupFailure] = []
        # An isolated test gets a group of its own and leaves the warm one be.
        group = None if spec.isolated else self._groups.pop(key, None)
        if group is not None and not _can_take(group, command.id):
            stopped += _stop(group)
            group = None
        cold_start = None
        if group is None:
            while len(self._groups) >= max(1, self.max_groups):
                _, oldest = self._groups.popitem(last=False)
                stopped += _stop(oldest)
            begin = time.monotonic()
            config = make_config()
            try:
                group = self._make_group(config)
                self.groups_started += 1
                group.start(deadline=begin + spec.timeout + START_ALLOWANCE)
                if not group.can_run(command.id):
                    group.stop()
                    error = f"the ranks did not collect {command.id}"
                    if group.collect_errors:
                        error += "; their collection errors:\n\n" + "\n\n".join(group.collect_errors)
                    raise GroupStartError(error)
            except GroupStartError as exc:
                return StartFailure(command.id, spec, str(exc), time.monotonic() - begin, stopped)
            except OSError as exc:
                # its files (a full disk), a fork, its store's socket; start() killed its ranks
                error = f"the rank group could not start: {exc} (its files go under {config.workdir_parent})"
                return StartFailure(command.id, spec, error, time.monotonic() - begin, stopped)
            cold_start = time.monotonic() - begin
        if group.current is None:
            group.begin(command)
        try:
            run = supervise(group, spec)
        except BaseException:  # Ctrl-C, pytest-timeout in the controller, a bug: no orphans
            group.kill()
            raise
        run.cold_start = cold_start
        run.stopped_groups = stopped
        if keep and group_is_reusable(run, group):
            # Only after a clean pass: a failure may end the session (-x) with a test begun.
            if follow is not None and run.verdict.kind is None:
                hold_killing_signals()  # the follow may kill this process: not within this test
                group.begin(follow)
            self._groups[key] = group
        else:
            # This test is not reported yet: a failed teardown of what its ranks held is its own.
            run.stop_teardown = group.stop()
            run.exit_codes = group.exit_codes()
        return run

    def pids(self) -> list[int]:
        """The rank processes of the warm groups."""
        return [pid for group in self._groups.values() for pid in group.pids()]

    def close(self) -> list[StoppedGroupFailure]:
        """Stop every warm group; the teardown failures of their ranks."""
        stopped = []
        while self._groups:
            _, group = self._groups.popitem()
            stopped += _stop(group)
        return stopped

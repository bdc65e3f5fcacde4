"""A failed test's report as data, built once by :func:`build`, in the order the text reads.

Each format renders this one model: the failure text (:mod:`pytest_ddp.report.failure`), the
JSON report (:mod:`pytest_ddp.report.json_report`), whose data the Chrome trace
(:mod:`pytest_ddp.report.timeline`) and the HTML page (:mod:`pytest_ddp.report.picture`) draw,
and torch's Flight Recorder dumps (:mod:`pytest_ddp.report.flight_recorder`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pytest_ddp.diagnose.consistency import SequenceDifference, UnfinishedWork, UnreceivedMessage
from pytest_ddp.diagnose.rank_words import not_entered, rank_doing
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.diagnose.wording import lead, tag
from pytest_ddp.groups.runner import TestRun
from pytest_ddp.report import stack_tree
from pytest_ddp.report.sequences import Divergence, GroupSequences, divergence, group_sequences, p2p_table


@dataclass(frozen=True)
class RankFacts:
    """One rank: its state, what it is doing in words, and what it left (failure, stack, output)."""

    state: RankState
    doing: str  # "waiting in barrier #2 (test_x.py:20), in call" (rank_words.rank_doing)
    failure: str | None  # its failure's text (a traceback), if it failed
    stack: str | None  # its faulthandler dump, if it was stopped
    output: dict[str, str] | None  # its stdout and stderr

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def stderr(self) -> str:
        return (self.output or {}).get("stderr", "").rstrip()


@dataclass(frozen=True)
class Report:
    """Everything a failed test's report says, in the order the text says it."""

    test_id: str
    test_file: str  # whose lines are marked in the ranks' stacks ("" for none)
    world_size: int
    backend: str
    timeout: float
    elapsed: float  # seconds from the hand-over to the verdict
    ended: float  # time.time() of the verdict
    # What happened and to whom.
    verdict: Verdict
    lead: str  # the verdict's summary, or what failed a test whose ranks all passed
    tag: str  # "[ddp deadlock, partial, 0.41 s]"
    # Each rank.
    ranks: list[RankFacts]
    # The tables: each group's collectives, where the ranks part ways, sends and receives unmatched.
    sequences: list[GroupSequences]
    divergence: Divergence | None
    p2p: list[str]
    # What failed a test whose ranks all passed.
    faults_not_fired: list[str]
    sequence_differences: list[SequenceDifference]
    unfinished_work: list[UnfinishedWork]
    unreceived_messages: list[UnreceivedMessage]
    # The stopped ranks' main threads, merged.
    tree: stack_tree.Tree

    @property
    def headline(self) -> str:
        """What happened and who (several lines when a rank's exception message is), then the tag."""
        return f"{self.lead} {self.tag}"

    @property
    def started(self) -> float:
        """time.time() of the hand-over: the timeline's origin."""
        return self.ended - self.elapsed

    @property
    def states(self) -> list[RankState]:
        return [rank.state for rank in self.ranks]


def build(run: TestRun, rank_failures: dict[int, str], test_file: str) -> Report:
    """The report of ``run``; ``rank_failures`` each failing rank's text, ``test_file`` the path
    whose lines the stacks mark."""
    states = run.states
    verdict = run.verdict
    words = lead(
        verdict,
        unfinished=bool(run.unfinished_work),
        unreceived=bool(run.unreceived_messages),
        differ=bool(run.sequence_differences),
        not_fired=run.faults_not_fired,
        stop_teardown=bool(run.stop_teardown),
    )
    ranks = [
        RankFacts(
            s,
            rank_doing(s, _line_in(run.stacks.get(s.rank), test_file)),
            rank_failures.get(s.rank),
            run.stacks.get(s.rank),
            run.outputs.get(s.rank),
        )
        for s in states
    ]
    sequences = group_sequences(states)
    return Report(
        test_id=run.test_id,
        test_file=test_file,
        world_size=run.spec.world_size,
        backend=run.spec.backend,
        timeout=run.spec.timeout,
        elapsed=run.elapsed,
        ended=run.ended,
        verdict=verdict,
        lead=words,
        tag=tag(verdict, run.elapsed),
        ranks=ranks,
        sequences=sequences,
        divergence=divergence(sequences, {s.rank: not_entered(s) for s in states}),
        p2p=p2p_table(states),
        faults_not_fired=run.faults_not_fired,
        sequence_differences=run.sequence_differences,
        unfinished_work=run.unfinished_work,
        unreceived_messages=run.unreceived_messages,
        tree=stack_tree.merged(run.stacks),
    )


def _line_in(dump: str | None, test_file: str) -> str | None:
    """``t.py:81``: the innermost frame of the test's file in a stopped rank's main thread, where
    it stood (shown as call sites show a file: relative to the working directory, where under it)."""
    frames = stack_tree.main_thread(dump) if dump and test_file else []
    line = next((f.line for f in reversed(frames) if f.file == test_file and f.line is not None), None)
    if line is None:
        return None
    relative = os.path.relpath(test_file)
    return f"{test_file if relative.startswith('..') else relative}:{line}"

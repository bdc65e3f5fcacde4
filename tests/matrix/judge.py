"""Run a matrix cell (tests/matrix/cells.py) on fresh ranks (:func:`run_cell`: what the verdict
said, as a :class:`Record`) and judge it against the cell's answer (:func:`judge`, pure): right
or wrong and why, a false culprit or not, and the seconds from the moment the hang was certain
(the last rank's last event: a call entered or left, a return, a death) to the verdict."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest_ddp
from pytest_ddp.diagnose import mismatches
from pytest_ddp.diagnose.consistency import unreceived_messages
from pytest_ddp.diagnose.verdicts import Cycle, Disagreement
from pytest_ddp.groups import runner
from pytest_ddp.groups.runner import TestRun
from tests.matrix.cells import Cell
from tests.matrix.families import line_of


@dataclass
class Record:
    """What a cell's run said."""

    outcome: str
    kind: str | None = None
    culprits: list[int] = field(default_factory=list)
    likely: list[int] = field(default_factory=list)  # a tie's likely culprits (likely, after or skipped)
    call: list[Any] | None = None  # [op, seq, label, site] of Diagnosis.call
    differences: list[str] = field(default_factory=list)  # Result.collective_differences
    latency: float | None = None  # seconds from certain to the verdict; None: passed, or a timeout
    wall: float = 0.0  # seconds the cell took, ranks' start included


@dataclass(frozen=True)
class Judged:
    cell: Cell
    record: Record
    right: bool
    why: str  # what was wrong, and where known why; "" when right
    false_culprit: bool  # a rank named at fault that is not (a tie is not: it says it cannot tell)
    tie: bool = False  # 2 ranks named as disagreeing (of 2, or a pair of peers), neither as likely
    cause: str = ""  # why a wrong answer is wrong, where that is known

    @property
    def answer(self) -> str:
        r = self.record
        text = r.outcome if r.kind is None else f"{r.outcome} {r.kind} {r.culprits}"
        if r.likely:
            text += f" likely {r.likely}"
        if r.call is not None:
            text += f" {r.call[2]} ({r.call[3].rsplit('/', 1)[-1]})"
        return text


@contextlib.contextmanager
def _keeping() -> Iterator[list[TestRun]]:
    """The TestRun that run() judges, kept for its ranks' event times and its verdict's finding
    (not in run()'s Result), as benchmarks/verdict_scale.py keeps it."""
    kept: list[TestRun] = []
    plain = runner.GroupPool.run

    def keeping(self: runner.GroupPool, *args: Any, **kwargs: Any) -> Any:
        test_run = plain(self, *args, **kwargs)
        kept.append(test_run)
        return test_run

    runner.GroupPool.run = keeping  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        runner.GroupPool.run = plain  # type: ignore[method-assign]


def certain_at(test_run: TestRun) -> float:
    """When the last thing any rank did happened: from then on nothing new could be learnt."""
    times = [0.0]
    for state in test_run.states:
        for call in state.calls:
            times += [call.enter, call.exit or 0.0]
        times += [state.finished_at or 0.0, state.died_at or 0.0, state.failed_at or 0.0]
        times += [fault.time for fault in state.injected if fault.action not in ("hang", "delay")]
    return max(times)


def run_cell(cell: Cell) -> Record:
    start = time.perf_counter()
    with _keeping() as kept:
        result = pytest_ddp.run(
            cell.body, world_size=cell.world, backend=cell.backend, timeout=cell.timeout, init=cell.init,
            args=(cell.plan,), faults=cell.faults,
        )
    record = Record(result.outcome, differences=result.collective_differences, wall=time.perf_counter() - start)
    diagnosis = result.diagnosis
    if diagnosis is not None:
        record.kind, record.culprits = diagnosis.kind, list(diagnosis.culprits)
        if diagnosis.call is not None:
            c = diagnosis.call
            record.call = [c.op, c.seq, c.label, c.site]
    unreceived = unreceived_messages(kept[-1].states) if kept else []
    if result.outcome == "passed" and unreceived:
        # MPI messages sent and never received: a marked test fails on them; the culprits are
        # the ranks that never received them.
        record.kind = "unreceived"
        record.culprits = sorted({m.dest for m in unreceived})
        record.call = [unreceived[0].call.op, unreceived[0].call.seq, unreceived[0].call.label, unreceived[0].call.site]
    if result.outcome == "passed" and result.collective_differences and kept:
        # Calls that completed though they differ (another reduce op): a marked test fails on
        # them, named as the runner names them (run() leaves the check to its caller).
        found = mismatches.finished_mismatch("done", {s.rank: s for s in kept[-1].states})
        if found is not None:
            record.outcome, record.kind, record.culprits = "failed", found.kind, list(found.culprits)
            kept[-1].verdict = found
            if isinstance(found.finding, Disagreement):
                c = found.finding.call
                record.call = [c.op, c.seq, c.label, c.site]
    if kept:
        finding = kept[-1].verdict.finding
        if isinstance(finding, (Disagreement, Cycle)):
            record.likely = sorted(getattr(finding, "likely", {}) or finding.after or finding.skipped)
        if record.outcome in ("deadlock", "failed"):
            record.latency = max(kept[-1].ended - certain_at(kept[-1]), 0.0)
    return record


def judge(cell: Cell, record: Record) -> Judged:
    expected = cell.expected
    named = set(record.culprits)
    if record.likely and named - set(record.likely):  # a tie whose likely culprits are said
        named = set(record.likely)
    # Two ranks named as disagreeing, the culprit one of them: a world of 2, or a pair of peers
    tie = (len(named) == 2 and set(expected.culprits) <= named and not record.likely
           and record.kind in ("mismatch", "p2p_cycle", "p2p_unmatched", "partial") and len(expected.culprits) == 1)
    false_culprit = bool(named - set(expected.culprits) - set(expected.may_name)) and not tie
    why = ""
    call = record.call
    if not expected.outcomes:
        why = "" if record.outcome == "passed" else f"a slow rank's test was called {record.outcome}"
        false_culprit = bool(record.culprits)
    elif (record.outcome not in expected.outcomes and record.kind != "unreceived") or record.kind is None:
        why = f"outcome {record.outcome}" + (f"; sequences differ: {record.differences[0]}" if record.differences
                                              else "")
    elif record.kind not in expected.kinds:
        why = f"kind {record.kind}"
    elif not set(expected.culprits) <= named or named - set(expected.culprits) - set(expected.may_name):
        why = f"culprits {sorted(named)}"
    elif (expected.ops or expected.seq or expected.lines) and call is None:
        why = "no call named"
    elif call is not None and ((expected.ops and call[0] not in expected.ops)
                               or (expected.seq is not None and call[1] != expected.seq)):
        why = f"call {call[2]}"
    elif call is not None and expected.lines and not any(
        call[3].endswith(f"families.py:{line_of(tag)}") for tag in expected.lines
    ):
        why = f"line {call[3]}"
    cause = _cause(cell, record, why, tie)
    return Judged(cell, record, not why, why + (f": {cause}" if cause else ""), false_culprit, tie and bool(why), cause)


def _cause(cell: Cell, record: Record, why: str, tie: bool) -> str:
    """Why a wrong answer is wrong, where the reason is known (measured on these cells)."""
    if not why:
        return ""
    if tie and not cell.faults and cell.world == 2 and cell.kind in ("skip", "extra"):
        return ("a step less on one rank is a step more on the other, each a way of the code (its loop's count,"
                " written per rank): of 2 ranks no majority tells which the code meant (a tie)")
    if tie and not cell.faults and cell.world == 2:
        return ("each rank took a way of its code (a value or a branch written per rank): of 2 ranks no majority"
                " tells which the code meant (a tie)")
    if tie:
        return "2 ranks disagree (a world of 2, or two peers), and nothing in their calls tells which departed (a tie)"
    if cell.kind == "extra" and record.kind == "partial":
        return "the rank that made a call more waits alone in it; partial names the ranks that returned"
    if cell.kind == "disconnect":
        return "the rank whose connections broke had not raised yet when its peers' calls on them did (a race)"
    return ""

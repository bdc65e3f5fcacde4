"""A report (:mod:`pytest_ddp.report.model`) as JSON data: every rank, every call, the verdict's
facts beside its words; what ``--ddp-report-dir`` writes as ``<test>.json``, and what the Chrome
trace and the HTML page are drawn from."""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_ddp.diagnose.consistency import difference_line, unfinished_line, unreceived_line
from pytest_ddp.groups.runner import StartFailure
from pytest_ddp.report import stack_tree
from pytest_ddp.report.failure import rank_line
from pytest_ddp.report.model import Report
from pytest_ddp.report.sequences import Divergence, divergence_line


def to_json(report: Report | StartFailure) -> dict[str, Any]:
    """The report as JSON data (a test no rank ran: its spec and its error)."""
    if isinstance(report, StartFailure):
        return {
            "test": report.test_id,
            "world_size": report.spec.world_size,
            "backend": report.spec.backend,
            "timeout": report.spec.timeout,
            "status": "not_started",
            "start_error": report.error,
            "elapsed": round(report.elapsed, 3),
            "ranks": [],
        }
    run = report.run
    verdict = run.verdict
    return {
        "test": run.test_id,
        "world_size": run.spec.world_size,
        "backend": run.spec.backend,
        "timeout": run.spec.timeout,
        "status": verdict.status,
        "kind": verdict.kind,
        "culprits": verdict.culprits,
        "waiting": verdict.waiting,
        "collective": verdict.collective,
        "call": verdict.call,
        "summary": verdict.summary,
        "headline": report.headline,
        "elapsed": round(run.elapsed, 3),
        "started": run.started,
        "ended": run.ended,
        "injected": [
            {"rank": s.rank, "text": e.text, "action": e.action, "op": e.op, "call": e.call, "site": e.site}
            for s in run.states
            for e in s.injected
        ],
        "faults_not_fired": run.faults_not_fired,
        "sequence_differences": [
            {**dataclasses.asdict(d), "text": difference_line(d)} for d in run.sequence_differences
        ],
        "unfinished_work": [
            {**dataclasses.asdict(w), "text": unfinished_line(w)} for w in run.unfinished_work
        ],
        "unreceived_messages": [
            {"rank": m.rank, "dest": m.dest, "call": m.call.index, "text": unreceived_line(m)}
            for m in run.unreceived_messages
        ],
        "divergence": _divergence(report.divergence),
        "stack_tree": stack_tree.to_json(report.tree) if report.tree.ranks else None,
        "ranks": [
            {
                "rank": r.rank,
                "line": rank_line(r),
                "alive": r.state.alive,
                "exit_code": r.state.exit_code,
                "phase": r.state.phase,
                "failed": r.state.failed,
                "calls": [{**c.to_dict(), "label": c.label} for c in r.state.calls],
                "finished_at": r.state.finished_at,
                "died_at": r.state.died_at,
                "failure": r.failure,
                "stack": r.stack,
                "output": r.output,
            }
            for r in report.ranks
        ],
    }


def _divergence(found: Divergence | None) -> dict[str, Any] | None:
    """Where the ranks part ways (see :func:`pytest_ddp.report.sequences.divergence`), at any world size."""
    if found is None:
        return None
    sides = [{"ranks": ranks, "did": did} for did, ranks in found.sides]
    return {**dataclasses.asdict(found), "sides": sides, "text": divergence_line(found)}

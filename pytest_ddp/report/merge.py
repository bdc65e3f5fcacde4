"""Merge the ranks' pytest reports of one test into one report per phase.

Per phase: failed if any rank failed, was stopped or died in it; skipped if every rank skipped
(an xfail on a rank not otherwise failed makes it xfailed); else passed.  The call phase is
reported only after a passed setup, as pytest does; the first failing phase carries the diagnosis.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from pytest_ddp.diagnose.state import RankState
from pytest_ddp.groups.group import StopTeardown, UnfinishedTeardown
from pytest_ddp.groups.runner import StartFailure, StoppedGroupFailure, TestRun
from pytest_ddp.report import files
from pytest_ddp.report.failure import (
    render,
    start_failure_text,
    stopped_group_text,
    unfinished_teardown_text,
)
from pytest_ddp.report.model import Report, build
from pytest_ddp.report.writable import printable, printable_data

PHASES = ("setup", "call", "teardown")
RERUN = "rerun"  # pytest-rerunfailures' outcome of a failed attempt that it runs again


def _stuck_phase(state: RankState) -> str | None:
    """The phase this rank was stopped or died in: the first it did not report (call only after a
    passed setup), or, if it never said it was done, the phase it was in (pytest-rerunfailures
    reports every phase of an attempt as "rerun" before the one it was stopped in)."""
    setup = state.reports.get("setup")
    expected = ("setup", "teardown") if setup is not None and setup["outcome"] != "passed" else PHASES
    for when in expected:
        if when not in state.reports:
            return when
    if state.finished_at is None and state.phase in PHASES:
        return state.phase
    return None


def _stuck_duration(state: RankState, when: str, run: TestRun) -> float:
    """Seconds a rank spent in the phase it was stopped or died in, up to its death or the verdict."""
    earlier = PHASES[: PHASES.index(when)]
    began = max((state.reports[w]["t"] for w in earlier if w in state.reports), default=run.started)
    return max(0.0, (state.died_at or run.ended) - began)


def merged_reports(
    item: pytest.Item, run: TestRun | StartFailure, config: pytest.Config
) -> tuple[list[pytest.TestReport], Report | None]:
    """The controller's reports for ``item``, and the report of its failure, built once (None when
    no rank ran it, or nothing failed)."""
    keywords = {name: 1 for name in item.keywords}
    if isinstance(run, StartFailure):  # no rank ran it: its setup failed
        text = start_failure_text(run)
        setup = _report(item.nodeid, item.location, keywords, "setup", "failed", text)
        return [setup, _report(item.nodeid, item.location, keywords, "teardown", "passed", None)], None

    rank_reports: dict[str, dict[int, pytest.TestReport]] = {when: {} for when in PHASES}
    rank_failures: dict[int, str] = {}
    for state in run.states:
        for when, event in state.reports.items():
            data = event.get("data")
            if data:
                rep = _from_serializable(config, data)
            else:  # a plain pass, sent without its report
                rep = _report(item.nodeid, item.location, {}, when, "passed", None, event["duration"])
            rank_reports[when][state.rank] = rep
            if rep.failed or rep.outcome == RERUN:
                label = "" if when == "call" else f" (in {when})"
                if rep.outcome == RERUN:
                    label += (
                        " (then the rank ran the test again, alone: a plugin's rerun, e.g. the flaky mark's)"
                    )
                rank_failures.setdefault(state.rank, rep.longreprtext + label)
    # A line of its event log was lost: what it did cannot be known.
    lost = [state for state in run.states if state.fatal is not None and state.alive]
    for state in lost:
        rank_failures.setdefault(state.rank, f"ddp: {state.fatal}")
    # The group was stopped right after this test: a failed teardown then is this test's.
    for rank, end in run.stop_teardown.items():
        teardown = rank_reports["teardown"].get(rank)
        at_stop = _stop_teardown_report(end, str(item.path), config)
        if at_stop is None or (teardown is not None and teardown.failed):
            continue
        at_stop.duration += teardown.duration if teardown is not None else 0.0
        rank_reports["teardown"][rank] = at_stop
        # The controller's own text of a rank that sent no report says it was in teardown.
        label = "" if isinstance(end, UnfinishedTeardown) else " (in teardown)"
        rank_failures.setdefault(rank, at_stop.longreprtext + label)
    # A rank an injected fault ended was not stuck: the phase stands on the others' (on all, if
    # faults ended every rank).
    survivors = [state for state in run.states if not state.died_as_injected] or run.states
    stuck = {state.rank: _stuck_phase(state) for state in survivors}
    states = {state.rank: state for state in run.states}

    reports: list[pytest.TestReport] = []
    built: Report | None = None
    for when in PHASES:
        per_rank = rank_reports[when]
        stuck_here = sorted(rank for rank, phase in stuck.items() if phase == when)
        if when == "call" and reports[-1].outcome != "passed":
            continue
        outcome, wasxfail = _merge_outcome(list(per_rank.values()), bool(stuck_here))
        if outcome == "passed" and when == "call" and (run.collectives_wrong or run.faults_not_fired or lost):
            outcome = "failed"
        longrepr: Any = None
        if outcome == "failed":
            if built is None:
                built = build(run, rank_failures, str(item.path))
                longrepr = render(built)
            else:
                longrepr = "\n\n".join(
                    f"rank {rank}: {rep.longreprtext}" for rank, rep in sorted(per_rank.items()) if rep.failed
                )
        elif outcome == "skipped":
            longrepr = _skip_longrepr(item, per_rank)
        # A phase no rank ran (teardown after a hang) lasted 0 s, not the whole run.
        duration = max(
            [rep.duration for rep in per_rank.values()]
            + [_stuck_duration(states[rank], when, run) for rank in stuck_here],
            default=0.0,
        )
        report = _report(item.nodeid, item.location, keywords, when, outcome, longrepr, duration)
        if wasxfail is not None:
            report.wasxfail = wasxfail
        for rank, rep in sorted(per_rank.items()):
            for name, content in rep.sections:
                report.sections.append((f"{name} (rank {rank})", content))
            report.user_properties.extend(rep.user_properties)
        reports.append(report)
    _attach_output(reports, run)
    return [_printable(report) for report in reports], built


def write_files(
    directory: str,
    run: TestRun | StartFailure,
    built: Report | None,
    reports: list[pytest.TestReport],
) -> None:
    """A failed test's report files (:mod:`pytest_ddp.report.files`).  Where they cannot be
    written, its failure says why and the session goes on: a side job must not end it."""
    try:
        if isinstance(run, StartFailure):
            files.write(directory, run)
        elif built is not None:
            files.write(directory, built)
    except Exception as exc:
        failed = next(report for report in reports if report.failed)
        why = f"ddp: this test's report files were not written to {directory}: {type(exc).__name__}: {exc}"
        failed.longrepr = printable(f"{failed.longrepr}\n\n{why}")


def stopped_group_report(
    failure: StoppedGroupFailure, last_item: tuple[str, tuple[str, int | None, str]], config: pytest.Config
) -> pytest.TestReport:
    """An error at teardown of a stopped group, reported under ``last_item`` (node id and
    location of the item reported last: xdist accepts a worker's reports only under its current
    item's); the location's headline names the group."""
    test_file, _, test = failure.last_test.partition("::")
    reps = {rank: _stop_teardown_report(end, test_file, config) for rank, end in failure.failures.items()}
    texts = {rank: rep.longreprtext for rank, rep in reps.items() if rep is not None}
    nodeid, (path, _, _) = last_item
    location = (path, None, f"ddp group {failure.group} (stopped after {test})")
    duration = max((end.duration for end in failure.failures.values()), default=0.0)
    text = stopped_group_text(failure, texts)
    return _printable(_report(nodeid, location, {}, "teardown", "failed", text, duration))


def _stop_teardown_report(
    end: StopTeardown, test_file: str, config: pytest.Config
) -> pytest.TestReport | None:
    """A rank's failed teardown at its group's stop as a teardown report: its own, or the
    controller's of a rank that sent none (it died in that teardown, or was killed in it)."""
    if isinstance(end, UnfinishedTeardown):
        text = unfinished_teardown_text(end, test_file)
        return _report("", (test_file, None, ""), {}, "teardown", "failed", text, end.duration)
    if end.data is None:  # a pass, sent without its report
        return None
    return _from_serializable(config, end.data)


def _from_serializable(config: pytest.Config, data: dict[str, Any]) -> pytest.TestReport:
    """A rank's report as pytest's object, from a copy: pytest turns the data's dicts into its
    objects in place, and the rank's data is read as sent after (its raise's line, the JSON report)."""
    return config.hook.pytest_report_from_serializable(config=config, data=copy.deepcopy(data))


def _attach_output(reports: list[pytest.TestReport], run: TestRun) -> None:
    """Each rank's stdout and stderr of the whole test, on the report pytest shows them with:
    the first failed one, else the call report (``-rP``)."""
    target = next((r for r in reports if r.failed), None)
    target = target or next((r for r in reports if r.when == "call"), reports[0])
    for rank, streams in sorted(run.outputs.items()):
        for stream, text in streams.items():
            if text.strip():
                target.sections.append((f"Captured {stream} (rank {rank})", text))


def _printable(report: pytest.TestReport) -> pytest.TestReport:
    """``report`` with the ranks' text in it (failure, skip reason, output, xfail reason, user
    properties) as UTF-8 can encode it: the terminal, junitxml and pytest-xdist's channel write it."""
    if isinstance(report.longrepr, str):
        report.longrepr = printable(report.longrepr)
    elif isinstance(report.longrepr, tuple):
        path, lineno, reason = report.longrepr
        report.longrepr = (printable(str(path)), lineno, printable(str(reason)))
    report.sections = [(printable(name), printable(content)) for name, content in report.sections]
    if hasattr(report, "wasxfail"):
        report.wasxfail = printable(str(report.wasxfail))
    report.user_properties = [
        (printable_data(name), printable_data(value)) for name, value in report.user_properties
    ]
    return report


def _merge_outcome(reps: list[pytest.TestReport], any_stuck: bool) -> tuple[str, str | None]:
    """(outcome, wasxfail) of one phase over the ranks' reports.  xfail is about the whole test:
    the expected failure on some rank makes it xfailed, even beside another rank's strict XPASS."""
    strict_xpass = [rep for rep in reps if rep.failed and str(rep.longrepr).startswith("[XPASS(strict)]")]
    if any_stuck or any(rep.failed and rep not in strict_xpass for rep in reps):
        return "failed", None
    xfailed = [rep for rep in reps if rep.skipped and hasattr(rep, "wasxfail")]
    if xfailed:
        return "skipped", xfailed[0].wasxfail
    if strict_xpass:
        return "failed", None
    if reps and all(rep.skipped for rep in reps):
        return "skipped", None
    xpassed = [rep for rep in reps if hasattr(rep, "wasxfail")]
    if reps and len(xpassed) == len(reps):
        return "passed", xpassed[0].wasxfail  # XPASS on every rank
    return "passed", None


def _skip_longrepr(item: pytest.Item, per_rank: dict[int, pytest.TestReport]) -> Any:
    for rep in per_rank.values():
        if rep.skipped and isinstance(rep.longrepr, (tuple, list)) and len(rep.longrepr) == 3:
            return tuple(rep.longrepr)
    path, lineno, _ = item.location
    return (str(path), (lineno or 0) + 1, "Skipped")


def _report(
    nodeid: str,
    location: tuple[str, int | None, str],
    keywords: Mapping[str, Any],
    when: str,
    outcome: str,
    longrepr: Any,
    duration: float = 0.0,
) -> pytest.TestReport:
    """A report of one phase (the controller's, or a rank's plain pass); ``keywords``, an item's, are
    copied (walking the item's and its parents' keywords once for all phases)."""
    return pytest.TestReport(
        nodeid=nodeid,
        location=location,
        keywords=dict(keywords),
        outcome=outcome,  # type: ignore[arg-type]
        longrepr=longrepr,
        when=when,  # type: ignore[arg-type]
        duration=duration,
        sections=[],
        user_properties=[],
    )

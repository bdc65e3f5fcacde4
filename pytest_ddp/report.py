"""Turn what the ranks did into what pytest shows: one report per phase, and the text of a hang.

The failure text follows one order, so that people learn where to look:

1. the verdict, its kind and how long it took to reach;
2. one line per rank: its state and its current or last collective;
3. the collective sequences side by side per group, the first divergence marked;
4. each failing rank's traceback and each stopped rank's Python stacks;
5. the fd-level output (C++ stderr) of ranks that died.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from . import picture, timeline
from .runner import StartFailure, StoppedGroupFailure, TestRun
from .state import Call, RankState, exit_text
from .wording import describe_call, difference_line, rank_list, unfinished_line, unreceived_line

PHASES = ("setup", "call", "teardown")
OUTPUT_TAIL_LINES = 40
HEADLINE_LIMIT = 200  # characters of a failure's first line; the whole headline follows it when cut
SEQUENCE_CONTEXT = 3  # collectives shown before and after the first divergence


def capped(text: str, limit: int = HEADLINE_LIMIT) -> str:
    """``text`` on one line (its whitespace runs, newlines included, as one space),
    cut at ``limit`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def _head(full: str) -> list[str]:
    """A failure's first lines: its headline on one capped line, and the whole of it below when cut."""
    line = capped(full)
    return [line, ""] if len(" ".join(full.split())) <= HEADLINE_LIMIT else [line, "", full, ""]


def headline(run: TestRun) -> str:
    """The whole headline of a failure: verdict, kind, time, diagnosis (long or several
    lines when a rank's exception message is)."""
    verdict = run.verdict
    if verdict.status == "timeout":
        head = "ddp"  # the summary starts "timed out after N s"
    elif verdict.status == "deadlock":
        head = f"ddp: deadlock ({verdict.kind}) diagnosed {run.elapsed:.2f} s into the test"
    elif verdict.status == "stopped":
        head = f"ddp: ranks stopped {run.spec.grace:g} s after a rank failed ({verdict.kind})"
    elif verdict.kind is None and run.unfinished_work:
        head = "ddp: failed: asynchronous work left in flight"
    elif verdict.kind is None and run.unreceived_messages:
        head = "ddp: failed: messages sent and never received"
    elif verdict.kind is None and run.sequence_differences:
        head = "ddp: failed: the ranks' collective sequences differ"
    elif verdict.kind is None and run.faults_not_fired:
        head = f"ddp: failed: injected faults never fired: {'; '.join(run.faults_not_fired)}"
    elif verdict.kind is None and run.stop_teardown:
        head = "ddp: failed in the teardown of the fixtures the ranks still held when their group was stopped"
    else:
        head = f"ddp: {verdict.kind}" if verdict.kind else "ddp: failed"
    return f"{head}: {verdict.summary}" if verdict.summary else head


def injected_lines(states: list[RankState]) -> list[str]:
    """``injected: SIGKILL on rank 1 at all_reduce call 3 (test_x.py:12)``: what the test did on
    purpose, so that its effect is not read as the diagnosis's cause; then a blank line."""
    lines = [f"injected: {event.text} ({event.site})" for state in states for event in state.injected]
    return [*lines, ""] if lines else []


def rank_line(state: RankState) -> str:
    """``rank 0: waiting in barrier #2 (test_x.py:20), in call; peak RSS 310 MB``."""
    line = _rank_state(state)
    if state.peak_rss is not None:
        line += f"; peak RSS {state.peak_rss / 2**20:.0f} MB"
    if state.peak_cuda is not None:
        line += f", peak CUDA {state.peak_cuda / 2**20:.0f} MB"
    return line


def _rank_state(state: RankState) -> str:
    last = state.calls[-1] if state.calls else None
    where = f"{describe_call(last)}" if last is not None else "no collective yet"
    if not state.alive:
        return f"rank {state.rank}: died ({exit_text(state.exit_code)}) during {state.phase}; last call {where}"
    if state.finished:
        outcome = "failed" if state.failed else "passed"
        return f"rank {state.rank}: finished ({outcome}); last call {where}"
    if state.current_call is not None:
        return f"rank {state.rank}: waiting in {where}, in {state.phase}"
    return f"rank {state.rank}: running ({state.phase}), outside any collective; last call {where}"


def _cell(call: Call | None, with_site: bool = False) -> str:
    if call is None:
        return "-"
    shapes = ",".join("x".join(str(d) for d in shape) or "scalar" for shape in call.shapes)
    text = call.op + (f" [{shapes}]" if shapes else "")
    if call.dtypes:
        text += " " + ",".join(sorted(set(call.dtypes)))
    if call.root is not None:
        text += f" root={call.root}"
    if with_site:  # ranks met in this collective from different lines: say where each came from
        text += f" at {call.site}" + (f" from {call.caller}" if call.caller else "")
    if call.state == "running":
        text += " (waiting)"
    elif call.state == "raised":
        text += " (raised)"
    return text


def sequence_table(states: list[RankState]) -> list[str]:
    """Each group's collectives side by side, around the first place the ranks differ."""
    groups: dict[str, tuple[int, ...]] = {}
    for state in states:
        for call in state.calls:
            if call.is_collective:
                groups.setdefault(call.group, call.group_ranks)
    lines: list[str] = []
    for name, members in groups.items():
        by_rank = {
            s.rank: {c.seq: c for c in s.calls if c.is_collective and c.group == name}
            for s in states
            if s.rank in members or not members
        }
        last = max((max(calls, default=0) for calls in by_rank.values()), default=0)
        if last == 0:
            continue
        diverges = None
        for seq in range(1, last + 1):
            cells = {rank: calls.get(seq) for rank, calls in by_rank.items()}
            signatures = {c.signature() if c else None for c in cells.values()}
            if len(signatures) > 1:
                diverges = seq
                break
        centre = diverges if diverges is not None else last
        first, end = max(1, centre - SEQUENCE_CONTEXT), min(last, centre + SEQUENCE_CONTEXT)
        ranks = sorted(by_rank)
        rows = [["#"] + [f"rank {r}" for r in ranks]]
        for seq in range(first, end + 1):
            calls = [by_rank[r].get(seq) for r in ranks]
            sites = {(c.site, c.caller) for c in calls if c is not None}
            rows.append([str(seq)] + [_cell(c, len(sites) > 1) for c in calls])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        title = f"collectives on group {name}" + ("" if name == "WORLD" else f" {list(members)}")
        lines.append(title + ":")
        for row, row_seq in zip(rows, [None, *range(first, end + 1)]):
            text = "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            mark = "  <-- ranks differ" if row_seq is not None and row_seq == diverges else ""
            lines.append("  " + text + mark)
    return lines


HARNESS_FRAMES = ("/pluggy/", "/_pytest/", "/pytest_ddp/", "/multiprocessing/", "<frozen runpy>", '"<string>"')


def format_stack(stack: str, test_file: str) -> str:
    """A faulthandler dump made readable: the test file's lines marked with ``>``,
    the harness frames (pytest, pluggy, pytest-ddp) below the test left out."""
    out = []
    hidden = 0
    for line in stack.splitlines():
        if line.lstrip().startswith("File ") and any(part in line for part in HARNESS_FRAMES):
            hidden += 1
            continue
        if hidden:
            out.append(f"  ({hidden} pytest and pytest-ddp frames hidden)")
            hidden = 0
        out.append(("> " + line.lstrip()) if test_file and test_file in line else line)
    if hidden:
        out.append(f"  ({hidden} pytest and pytest-ddp frames hidden)")
    return "\n".join(out)


FATAL_CONTEXT = 5  # lines kept before "Fatal Python error" (what C++ printed, e.g. "terminate called ...")


def stderr_tail(stderr: str, test_file: str, limit: int = OUTPUT_TAIL_LINES) -> str:
    """The end of a dead rank's stderr, readable: faulthandler's harness frames collapsed
    and the test file's lines marked (:func:`format_stack`); if still longer than ``limit``
    lines, the last ones, or those around the last ``Fatal Python error`` if that is
    further up (the test's frames follow it)."""
    lines = format_stack(stderr, test_file).splitlines()
    if len(lines) <= limit:
        return "\n".join(lines)
    fatal = max((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), default=None)
    start = len(lines) - limit
    if fatal is not None and fatal - FATAL_CONTEXT < start:
        start = max(0, fatal - FATAL_CONTEXT)
    end = start + limit
    kept = lines[start:end]
    if start:
        kept.insert(0, f"({start} earlier lines left out)")
    if end < len(lines):
        kept.append(f"({len(lines) - end} later lines left out)")
    return "\n".join(kept)


def _section(title: str) -> str:
    return f"{'-' * 20} {title} {'-' * 20}"


def start_failure_text(failure: StartFailure) -> str:
    """The whole text of a test no rank ran."""
    return "\n".join([capped(f"ddp: {failure.error.splitlines()[0].rstrip(':')}"), "", failure.error])


def stopped_group_text(failure: StoppedGroupFailure, rank_failures: dict[int, str]) -> str:
    """The text of a stopped group's failed teardown (module or session fixtures)."""
    head = (
        f"ddp: when the rank group ({failure.group}) was stopped after {failure.last_test}, "
        "the teardown of the fixtures its ranks still held failed"
    )
    return "\n".join(_head(head)[:-1] + _grouped_failures(rank_failures))


def failure_text(run: TestRun, rank_failures: dict[int, str], test_file: str) -> str:
    """The whole text of a failed ddp phase."""
    lines = _head(headline(run))
    lines += injected_lines(run.states)
    lines += [rank_line(s) for s in run.states]
    table = sequence_table(run.states)
    if table:
        lines += ["", *table]
    if run.sequence_differences:
        lines += ["", "the ranks' collective sequences differ:"]
        lines += ["  " + difference_line(d) for d in run.sequence_differences]
    if run.unfinished_work:
        lines += ["", "asynchronous work still in flight after the test:"]
        lines += ["  " + unfinished_line(w) for w in run.unfinished_work]
    if run.unreceived_messages:
        lines += ["", "messages sent and never received (MPI drops them silently when the program ends):"]
        lines += ["  " + unreceived_line(m) for m in run.unreceived_messages]
    lines += _grouped_failures(rank_failures)
    for rank, stack in sorted(run.stacks.items()):
        lines += ["", _section(f"rank {rank}: Python stacks when stopped"), format_stack(stack, test_file)]
    for state in run.states:
        output = run.outputs.get(state.rank, {}).get("stderr", "").rstrip()
        if not state.alive and output:
            tail = stderr_tail(output, test_file)
            lines += ["", _section(f"rank {state.rank}: stderr ({exit_text(state.exit_code)})"), tail]
    return "\n".join(lines)


def _grouped_failures(rank_failures: dict[int, str]) -> list[str]:
    """Each rank's traceback, ranks with the very same text shown once."""
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(rank_failures.items()):
        by_text.setdefault(text, []).append(rank)
    lines: list[str] = []
    for text, ranks in by_text.items():
        lines += ["", _section(f"{rank_list(ranks)}: failed"), text.rstrip()]
    return lines


def sanitize(nodeid: str) -> str:
    """A file name for a node id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:200] or "test"


def run_to_json(run: TestRun | StartFailure, rank_failures: dict[int, str]) -> dict[str, Any]:
    if isinstance(run, StartFailure):
        return {
            "test": run.test_id,
            "world_size": run.spec.world_size,
            "backend": run.spec.backend,
            "timeout": run.spec.timeout,
            "status": "not_started",
            "start_error": run.error,
            "elapsed": round(run.elapsed, 3),
            "ranks": [],
        }
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
        "headline": headline(run),
        "elapsed": round(run.elapsed, 3),
        "started": run.ended - run.elapsed,  # time.time() of the hand-over, the timeline's origin
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
        "unfinished_work": [{**dataclasses.asdict(w), "text": unfinished_line(w)} for w in run.unfinished_work],
        "unreceived_messages": [
            {"rank": m.rank, "dest": m.dest, "call": m.call.index, "text": unreceived_line(m)}
            for m in run.unreceived_messages
        ],
        "ranks": [
            {
                "rank": s.rank,
                "line": rank_line(s),
                "alive": s.alive,
                "exit_code": s.exit_code,
                "phase": s.phase,
                "failed": s.failed,
                "calls": [{**c.to_dict(), "label": c.label} for c in s.calls],
                "finished_at": s.finished_at,
                "died_at": s.died_at,
                "failure": rank_failures.get(s.rank),
                "stack": run.stacks.get(s.rank),
                "output": run.outputs.get(s.rank),
            }
            for s in run.states
        ],
    }


def write_json(directory: str, run: TestRun | StartFailure, rank_failures: dict[int, str]) -> Path:
    """``<test>.json``, and beside it the same as a Chrome trace (``<test>.trace.json``) and as a
    page with its timeline (``<test>.html``); the JSON's path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    name = sanitize(run.test_id)
    report = json.loads(json.dumps(run_to_json(run, rank_failures), default=str))  # as a reader gets it
    target = path / f"{name}.json"
    target.write_text(json.dumps(report, indent=2))
    (path / f"{name}.trace.json").write_text(timeline.trace_json(report))
    test_file = run.test_id.split("::")[0]
    page = picture.page(report, lambda text: format_stack(text, test_file))
    (path / f"{name}.html").write_text(page, encoding="utf-8")
    return target

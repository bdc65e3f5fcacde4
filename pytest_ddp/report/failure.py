"""Turn what the ranks did into what pytest shows: one report per phase, and the text of a hang.

The failure text follows one order, so that people learn where to look:

1. the headline: what happened and to whom, then the verdict's status and kind (and for a
   deadlock, how long into the test it was diagnosed) in brackets, so that pytest's one-line
   summary, cut at a terminal's width, keeps the cause;
2. one line per rank: its state and its current or last collective;
3. the collective sequences side by side per group, the first divergence marked;
4. each failing rank's traceback; the stopped ranks' main threads merged into one tree where they
   differ (:mod:`pytest_ddp.report.stack_tree`), then each stopped rank's Python stacks;
5. the fd-level output (C++ stderr) of ranks that died.

Above ``GROUP_ABOVE`` (8) ranks, so that a 64-rank report fits on a screen (as
LLNL's STAT merges the stacks of ranks into classes): ranks in the same state
share one line (``ranks 0-61, 63: waiting in ...``), ranks whose sequence
columns are the same share a column, and a line under the headline names the
first collective where the ranks part ways and the minority.  Identical
tracebacks, stacks and stderr tails are shown once, with their ranks, at any
size.  The JSON keeps every rank.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from pytest_ddp.diagnose.state import RankState, exit_text
from pytest_ddp.diagnose.wording import describe_call, difference_line, rank_list, unfinished_line, unreceived_line
from pytest_ddp.groups.group import UnfinishedTeardown
from pytest_ddp.groups.runner import StartFailure, StoppedGroupFailure, TestRun
from pytest_ddp.report import picture, stack_tree, timeline
from pytest_ddp.report.sequences import (
    GROUP_ABOVE,
    Divergence,
    GroupSequences,
    divergence,
    divergence_line,
    group_sequences,
    p2p_table,
    table,
)
from pytest_ddp.report.writable import file_name, printable_data

PHASES = ("setup", "call", "teardown")
OUTPUT_TAIL_LINES = 40
HEADLINE_LIMIT = 200  # characters of a failure's first line; the whole headline follows it when cut


def capped(text: str, limit: int = HEADLINE_LIMIT) -> str:
    """``text`` on one line (its whitespace runs, newlines included, as one space),
    cut at ``limit`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def _cut(text: str) -> bool:
    """Whether :func:`capped` cuts ``text``."""
    return len(" ".join(text.split())) > HEADLINE_LIMIT


def _head(full: str) -> list[str]:
    """A failure's first lines: its headline on one capped line, and the whole of it below when cut."""
    line = capped(full)
    return [line, "", full, ""] if _cut(full) else [line, ""]


_NAMED_STATUSES = ("deadlock", "stopped", "timeout")  # a tag's first word; any other status: "failed"


def _lead(run: TestRun) -> str:
    """What happened and to whom: the verdict's summary, or what failed a test whose ranks all passed."""
    verdict = run.verdict
    if verdict.summary:
        return verdict.summary
    if run.unfinished_work:
        return "asynchronous work left in flight"
    if run.unreceived_messages:
        return "messages sent and never received"
    if run.sequence_differences:
        return "the ranks' collective sequences differ"
    if run.faults_not_fired:
        return f"injected faults never fired: {'; '.join(run.faults_not_fired)}"
    if run.stop_teardown:
        return "the ranks failed in the teardown of the fixtures they still held when their group was stopped"
    return "failed"


def _tag(run: TestRun) -> str:
    """``[ddp deadlock, partial, 0.41 s]`` (a deadlock's kind and how long into the test it was
    diagnosed), ``[ddp failed]``, ``[ddp stopped, rank_exited]``: after the lead, so that pytest's
    one-line summary, cut at the terminal's width, keeps the cause."""
    verdict = run.verdict
    status = verdict.status if verdict.status in _NAMED_STATUSES else "failed"
    words = [status] + ([verdict.kind] if verdict.kind and verdict.kind != status else [])
    if verdict.status == "deadlock":
        words.append(f"{run.elapsed:.2f} s")
    return f"[ddp {', '.join(words)}]"


def headline(run: TestRun) -> str:
    """The whole headline of a failure: what happened and who (long or several lines when a rank's
    exception message is), then the verdict's tag."""
    return f"{_lead(run)} {_tag(run)}"


def _headline_lines(run: TestRun) -> list[str]:
    """The headline on one capped line that keeps its tag, and the whole of it below when cut."""
    lead, tag = _lead(run), _tag(run)
    whole = f"{lead} {tag}"
    if not _cut(whole):
        return [capped(whole), ""]
    return [f"{capped(lead, HEADLINE_LIMIT - len(tag) - 1)} {tag}", "", whole, ""]


def injected_lines(states: list[RankState]) -> list[str]:
    """``injected: SIGKILL on rank 1 at all_reduce call 3 (test_x.py:12)``: what the test did on
    purpose, so that its effect is not read as the diagnosis's cause; then a blank line."""
    lines = [f"injected: {event.text} ({event.site})" for state in states for event in state.injected]
    return [*lines, ""] if lines else []


def rank_line(state: RankState) -> str:
    """``rank 0: waiting in barrier #2 (test_x.py:20), in call; peak RSS 310 MB``."""
    return f"rank {state.rank}: {_rank_state(state)}{_memory([state])}"


def rank_lines(states: list[RankState]) -> list[str]:
    """One line per rank; above ``GROUP_ABOVE`` ranks, one per state shared by ranks
    (``ranks 0-62: waiting in all_reduce #12 (train.py:40), in call; peak RSS 180-190 MB``)."""
    if len(states) <= GROUP_ABOVE:
        return [rank_line(s) for s in states]
    alike: dict[str, list[RankState]] = {}
    for state in sorted(states, key=lambda s: s.rank):
        alike.setdefault(_rank_state(state), []).append(state)
    return [f"{rank_list(s.rank for s in group)}: {text}{_memory(group)}" for text, group in alike.items()]


def _megabytes(values: list[int | None]) -> str | None:
    """``310``, or ``300-320`` over several ranks; None when no rank measured it."""
    known = sorted({round(v / 2**20) for v in values if v is not None})
    if not known:
        return None
    return str(known[0]) if len(known) == 1 else f"{known[0]}-{known[-1]}"


def _memory(states: list[RankState]) -> str:
    text = ""
    rss, cuda = _megabytes([s.peak_rss for s in states]), _megabytes([s.peak_cuda for s in states])
    if rss is not None:
        text += f"; peak RSS {rss} MB"
    if cuda is not None:
        text += f", peak CUDA {cuda} MB"
    return text


def _status(state: RankState) -> str:
    """What the rank is doing, in a few words: ``finished (passed)``, ``running (call), outside any
    collective``; "" when it waits in a call."""
    if not state.alive:
        return f"died ({exit_text(state.exit_code)}) during {state.phase}"
    if state.finished:
        return f"finished ({'failed' if state.failed else 'passed'})"
    if state.current_call is not None:
        return ""
    return f"running ({state.phase}), outside any collective"


def _rank_state(state: RankState) -> str:
    status = _status(state)
    last = (state.calls[-1] if state.calls else None) if status else state.current_call  # not a later isend
    where = describe_call(last) if last is not None else "no collective yet"
    return f"{status}; last call {where}" if status else f"waiting in {where}, in {state.phase}"


def format_stack(stack: str, test_file: str) -> str:
    """A faulthandler dump made readable: the test file's lines marked with ``>``,
    the harness frames (pytest, pluggy, pytest-ddp) below the test left out."""
    out = []
    hidden = 0
    for line in stack.splitlines():
        if stack_tree.harness_line(line):
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
    """The whole text of a test no rank ran: the error's first line as its headline, then the
    rest of the error, or all of it when the headline had to cut that line."""
    first, _, rest = failure.error.partition("\n")
    head = f"ddp: {first.rstrip(':')}"
    body = (failure.error if _cut(head) else rest).rstrip()
    return "\n".join([capped(head), "", body]) if body else capped(head)


def unfinished_teardown_text(end: UnfinishedTeardown, test_file: str) -> str:
    """What is known of a rank that did not report its teardown at its group's stop: how it
    ended in it, or that it was killed still in it with its stacks; then its stderr since."""
    held = "the teardown of the fixtures it still held when its group was stopped"
    if end.exit_code is None:
        lines = [f"did not finish {held} within {end.waited:g} s, and was killed"]
    else:
        lines = [f"died ({exit_text(end.exit_code)}) during {held}"]
    if end.stacks:
        lines += ["", "its Python stacks when killed:", format_stack(end.stacks, test_file)]
    if end.stderr.strip():
        lines += ["", "its stderr:", stderr_tail(end.stderr.rstrip(), test_file)]
    return "\n".join(lines)


def stopped_group_text(failure: StoppedGroupFailure, rank_failures: dict[int, str]) -> str:
    """The text of a stopped group's failed teardown (module or session fixtures)."""
    head = (
        f"ddp: when the rank group ({failure.group}) was stopped after {failure.last_test}, "
        "the teardown of the fixtures its ranks still held failed"
    )
    return "\n".join(_head(head)[:-1] + _grouped_failures(rank_failures))


def failure_text(run: TestRun, rank_failures: dict[int, str], test_file: str) -> str:
    """The whole text of a failed ddp phase."""
    lines = _headline_lines(run)
    groups = group_sequences(run.states)
    if len(run.states) > GROUP_ABOVE and (found := _divergence(run.states, groups)) is not None:
        lines += [divergence_line(found), ""]
    lines += injected_lines(run.states)
    lines += rank_lines(run.states)
    if groups:
        lines += ["", *table(groups)]
    if p2p := p2p_table(run.states):
        lines += ["", *p2p]
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
    lines += _merged_stacks(run)
    stacks = {rank: format_stack(stack, test_file) for rank, stack in run.stacks.items()}
    for ranks, text in _alike(stacks):
        lines += ["", _section(f"{rank_list(ranks)}: Python stacks when stopped"), text]
    tails = {}
    for state in run.states:
        output = run.outputs.get(state.rank, {}).get("stderr", "").rstrip()
        if not state.alive and output:
            tails[state.rank] = f"{exit_text(state.exit_code)}\n{stderr_tail(output, test_file)}"
    for ranks, text in _alike(tails):
        how, tail = text.split("\n", 1)
        lines += ["", _section(f"{rank_list(ranks)}: stderr ({how})"), tail]
    return "\n".join(lines)


def _merged_stacks(run: TestRun) -> list[str]:
    """The ranks' main threads as one tree, where they are not all the same stack: when they are,
    the one section of the ranks' stacks below says it, and the tree would repeat it."""
    tree = stack_tree.merged(run.stacks)
    if not tree.differs():
        return []
    title = _section(f"{rank_list(tree.ranks)}: Python stacks merged (main thread, outermost frame first)")
    return ["", title, *stack_tree.render(tree, run.test_id.split("::")[0])]


def _divergence(states: list[RankState], groups: list[GroupSequences]) -> Divergence | None:
    """Where the ranks part ways; a rank that did not get there is said to be where it is."""
    where = {s.rank: _status(s) or f"waiting in {describe_call(s.current_call or s.calls[-1])}" for s in states}
    return divergence(groups, {r: f"did not enter it, {text}" for r, text in where.items()})


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")  # faulthandler's thread ids differ from rank to rank


def _alike(texts: dict[int, str]) -> list[tuple[list[int], str]]:
    """Ranks whose texts are the same but for addresses, each text once (the lowest rank's),
    in the order of the lowest rank."""
    groups: dict[str, tuple[list[int], str]] = {}
    for rank, text in sorted(texts.items()):
        groups.setdefault(_ADDRESS.sub("0x", text), ([], text))[0].append(rank)
    return list(groups.values())


def _grouped_failures(rank_failures: dict[int, str]) -> list[str]:
    """Each rank's traceback, ranks with the very same text shown once."""
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(rank_failures.items()):
        by_text.setdefault(text, []).append(rank)
    lines: list[str] = []
    for text, ranks in by_text.items():
        lines += ["", _section(f"{rank_list(ranks)}: failed"), text.rstrip()]
    return lines


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
        "divergence": _divergence_json(run.states),
        "stack_tree": stack_tree.to_json(tree) if (tree := stack_tree.merged(run.stacks)).ranks else None,
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


def _divergence_json(states: list[RankState]) -> dict[str, Any] | None:
    """Where the ranks part ways (see :func:`pytest_ddp.report.sequences.divergence`), at any world size."""
    found = _divergence(states, group_sequences(states))
    if found is None:
        return None
    return {
        "group": found.group,
        "seq": found.seq,
        "call": found.call,
        "minority": found.minority,
        "sides": [{"ranks": ranks, "did": did} for did, ranks in found.sides],
        "text": divergence_line(found),
    }


def write_json(directory: str, run: TestRun | StartFailure, rank_failures: dict[int, str]) -> Path:
    """``<test>.json``, and beside it the same as a Chrome trace (``<test>.trace.json``) and as a
    page with its timeline (``<test>.html``); the JSON's path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    name = file_name(run.test_id)
    # As a reader gets it, every string in it one that UTF-8 can encode.
    report = printable_data(json.loads(json.dumps(run_to_json(run, rank_failures), default=str)))
    target = path / f"{name}.json"
    target.write_text(json.dumps(report, indent=2))
    (path / f"{name}.trace.json").write_text(timeline.trace_json(report))
    test_file = report["test"].split("::")[0]
    page = picture.page(report, lambda text: format_stack(text, test_file))
    (path / f"{name}.html").write_text(page, encoding="utf-8")
    return target

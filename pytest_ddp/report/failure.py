"""The failure text: a report (:mod:`pytest_ddp.report.model`) as pytest shows it, and the texts
of a test no rank ran and of a stopped group's failed teardown.

One order, so that people learn where to look (:func:`render` writes it; docs/guide.md's
"Reading a hang report" tells it).  Above ``GROUP_ABOVE`` ranks, so that a 64-rank report fits
on a screen, ranks in the same state share a line and alike sequence columns a column;
identical tracebacks, stacks and stderr tails are shown once with their ranks at any size.  The
JSON keeps every rank.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from itertools import groupby

from pytest_ddp.diagnose.consistency import difference_line, unfinished_line, unreceived_line
from pytest_ddp.diagnose.phrases import grouped, rank_list
from pytest_ddp.diagnose.state import RankState, exit_text
from pytest_ddp.groups.group import UnfinishedTeardown
from pytest_ddp.groups.runner import StartFailure, StoppedGroupFailure, TestRun
from pytest_ddp.report import stack_tree
from pytest_ddp.report.model import RankFacts, Report, build
from pytest_ddp.report.sequences import GROUP_ABOVE, divergence_line, table

OUTPUT_TAIL_LINES = 40
HEADLINE_LIMIT = 200  # characters of a failure's first line; the body says a lead it cut in full


def failure_text(run: TestRun, rank_failures: dict[int, str], test_file: str) -> str:
    """The text of ``run``'s report (:func:`pytest_ddp.report.model.build`), its stacks marking
    ``test_file``'s lines."""
    return render(build(run, rank_failures, test_file))


def render(report: Report) -> str:
    """The whole text of a failed ddp phase."""
    lines = [headline(report.lead, report.tag), ""]
    if len(report.ranks) > GROUP_ABOVE and report.divergence is not None:
        lines += [divergence_line(report.divergence), ""]
    lines += injected_lines(report.run.states)
    lines += rank_lines(report.ranks)
    lines += in_full(report.lead, report.tag)
    if report.sequences:
        lines += ["", *table(report.sequences)]
    if report.p2p:
        lines += ["", *report.p2p]
    if report.run.sequence_differences:
        lines += ["", "the ranks' collective sequences differ:"]
        lines += ["  " + difference_line(d) for d in report.run.sequence_differences]
    if report.run.unfinished_work:
        lines += ["", "asynchronous work still in flight after the test:"]
        lines += ["  " + unfinished_line(w) for w in report.run.unfinished_work]
    if report.run.unreceived_messages:
        lines += ["", "messages sent and never received (MPI drops them silently when the program ends):"]
        lines += ["  " + unreceived_line(m) for m in report.run.unreceived_messages]
    lines += _failed({r.rank: r.failure for r in report.ranks if r.failure is not None})
    lines += _merged_stacks(report)
    stacks = {
        r.rank: ("Python stacks when stopped", format_dump(r.stack, report.test_file))
        for r in report.ranks
        if r.stack is not None
    }
    lines += _sections(stacks, _without_addresses)
    tails = {
        r.rank: (f"stderr ({exit_text(r.state.exit_code)})", stderr_tail(r.stderr, report.test_file))
        for r in report.ranks
        if not r.state.alive and r.stderr
    }
    lines += _sections(tails, _without_addresses)
    return "\n".join(lines)


def headline(lead: str, tag: str = "") -> str:
    """The first line: ``lead`` on one line, cut where it would push ``tag`` past
    ``HEADLINE_LIMIT`` characters (:func:`in_full` then puts the whole lead in the body)."""
    line = _cut(lead, tag) or " ".join(lead.split())
    return f"{line} {tag}" if tag else line


def in_full(lead: str, tag: str = "") -> list[str]:
    """The whole of a lead that :func:`headline` cut, for the body (a blank line first); [] when
    it did not cut it."""
    if _cut(lead, tag) is None:
        return []
    return ["", "the headline in full:", *("  " + line for line in lead.strip().splitlines())]


def _cut(lead: str, tag: str = "") -> str | None:
    """``lead`` on one line cut short, with "...", where it leaves ``tag`` no room; None where it does."""
    line = " ".join(lead.split())
    room = HEADLINE_LIMIT - (len(tag) + 1 if tag else 0)
    return line[: room - 3].rstrip() + "..." if len(line) > room else None


def injected_lines(states: list[RankState]) -> list[str]:
    """``injected: SIGKILL on rank 1 at all_reduce call 3 (test_x.py:12)``: what the test did on
    purpose, so that its effect is not read as the diagnosis's cause; then a blank line."""
    lines = [f"injected: {event.text} ({event.site})" for state in states for event in state.injected]
    return [*lines, ""] if lines else []


def rank_line(rank: RankFacts) -> str:
    """``rank 0: waiting in barrier #2 (test_x.py:20), in call; peak RSS 310 MB``."""
    return f"rank {rank.rank}: {rank.doing}{_memory([rank.state])}"


def rank_lines(ranks: list[RankFacts]) -> list[str]:
    """One line per rank; above ``GROUP_ABOVE`` ranks, one per state shared by ranks
    (``ranks 0-62: waiting in all_reduce #12 (train.py:40), in call; peak RSS 180-190 MB``)."""
    if len(ranks) <= GROUP_ABOVE:
        return [rank_line(r) for r in ranks]
    facts = {r.rank: r for r in ranks}
    alike = grouped(facts, lambda r: facts[r].doing)
    return [f"{rank_list(same)}: {doing}{_memory([facts[r].state for r in same])}" for doing, same in alike]


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


def _failed(rank_failures: dict[int, str]) -> list[str]:
    """Each rank's traceback, ranks with the very same text shown once."""
    return _sections({rank: ("failed", text.rstrip()) for rank, text in rank_failures.items()}, str)


def _merged_stacks(report: Report) -> list[str]:
    """The ranks' main threads as one tree, unless all the same stack (the stacks below say it)."""
    tree = report.tree
    if not tree.differs():
        return []
    title = _section(f"{rank_list(tree.ranks)}: Python stacks merged (main thread, outermost frame first)")
    return ["", title, *stack_tree.render(tree, report.run.test_id.split("::")[0])]


def _section(title: str) -> str:
    return f"{'-' * 20} {title} {'-' * 20}"


def _sections(texts: dict[int, tuple[str, str]], same: Callable[[str], str]) -> list[str]:
    """A section per rank's (title, text); ranks whose titles are equal and texts the ``same``
    share one, with the lowest rank's text, in the order of the lowest rank."""
    lines: list[str] = []
    for (title, _), ranks in grouped(texts, lambda r: (texts[r][0], same(texts[r][1]))):
        lines += ["", _section(f"{rank_list(ranks)}: {title}"), texts[ranks[0]][1]]
    return lines


def _without_addresses(text: str) -> str:
    return re.sub(r"0x[0-9a-fA-F]+", "0x", text)  # faulthandler's thread ids differ from rank to rank


def format_dump(dump: str, test_file: str) -> str:
    """A rank's faulthandler dump made readable (:func:`format_stack`): its main thread, the
    test's, first; pytest-ddp's own threads left out, idle library threads said in one line."""
    threads, main, threads_cut = stack_tree.threads(dump)
    if main is None:
        return format_stack(dump, test_file)
    others = [(thread, stack_tree.thread_kind(thread)) for i, thread in enumerate(threads) if i != main]
    shown = [threads[main], *(thread for thread, kind in others if kind == "other")]
    idle = Counter(stack_tree.idle_label(thread) for thread, kind in others if kind == "idle")
    texts = [format_stack("\n".join([t.header, *t.lines]).rstrip(), test_file) for t in shown]
    if idle:
        count = idle.total()
        each = "; ".join(label + (f" (x{n})" if n > 1 else "") for label, n in idle.items())
        texts.append(f"({count} idle library thread{'s' * (count > 1)}: {each})")
    if threads_cut:
        texts.append("(more threads not dumped: faulthandler writes 100 at most)")
    return "\n\n".join(texts)


def format_stack(stack: str, test_file: str) -> str:
    """A faulthandler dump made readable: the test file's lines marked with ``>``,
    the harness frames (pytest, pluggy, pytest-ddp) below the test left out."""
    out = []
    for harness, lines in groupby(stack.splitlines(), stack_tree.harness_line):
        if harness:
            out.append(f"  ({len(list(lines))} pytest and pytest-ddp frames hidden)")
        else:
            out += [("> " + line.lstrip()) if test_file and test_file in line else line for line in lines]
    return "\n".join(out)


FATAL_CONTEXT = 5  # lines kept before "Fatal Python error" (what C++ printed, e.g. "terminate called ...")


def stderr_tail(stderr: str, test_file: str) -> str:
    """The end of a dead rank's stderr made readable (:func:`format_stack`): its last lines, or
    from just before the last ``Fatal Python error`` (the test's frames follow it)."""
    lines = format_stack(stderr, test_file).splitlines()
    if len(lines) <= OUTPUT_TAIL_LINES:
        return "\n".join(lines)
    fatal = max((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), default=None)
    start = len(lines) - OUTPUT_TAIL_LINES
    if fatal is not None and fatal - FATAL_CONTEXT < start:
        start = max(0, fatal - FATAL_CONTEXT)
    end = start + OUTPUT_TAIL_LINES
    kept = lines[start:end]
    if start:
        kept.insert(0, f"({start} earlier lines left out)")
    if end < len(lines):
        kept.append(f"({len(lines) - end} later lines left out)")
    return "\n".join(kept)


def start_failure_text(failure: StartFailure) -> str:
    """The text of a test no rank ran: the error's first line as headline, then the rest (all of
    it when the headline cut that line)."""
    first, _, rest = failure.error.partition("\n")
    head = f"ddp: {first.rstrip(':')}"
    body = (rest if _cut(head) is None else failure.error).rstrip()
    return "\n".join([headline(head), "", body]) if body else headline(head)


def unfinished_teardown_text(end: UnfinishedTeardown, test_file: str) -> str:
    """What is known of a rank that did not report its teardown at its group's stop: how it
    ended in it, or that it was killed still in it with its stacks; then its stderr since."""
    held = "the teardown of the fixtures it still held when its group was stopped"
    if end.exit_code is None:
        lines = [f"did not finish {held} within {end.waited:g} s, and was killed"]
    else:
        lines = [f"died ({exit_text(end.exit_code)}) during {held}"]
    if end.stacks:
        lines += ["", "its Python stacks when killed:", format_dump(end.stacks, test_file)]
    if end.stderr.strip():
        lines += ["", "its stderr:", stderr_tail(end.stderr.rstrip(), test_file)]
    return "\n".join(lines)


def stopped_group_text(failure: StoppedGroupFailure, rank_failures: dict[int, str]) -> str:
    """The text of a stopped group's failed teardown (module or session fixtures)."""
    head = (
        f"ddp: when the rank group ({failure.group}) was stopped after {failure.last_test}, "
        "the teardown of the fixtures its ranks still held failed"
    )
    return "\n".join([headline(head), *in_full(head), *_failed(rank_failures)])

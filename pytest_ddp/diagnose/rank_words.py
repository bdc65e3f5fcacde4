"""A rank in words: how it failed (its error in one line, each peer's copy of one Gloo error alike),
what it is doing, for the verdicts' words (:mod:`pytest_ddp.diagnose.wording`) and each rank's line
of the report."""

from __future__ import annotations

import re

from pytest_ddp.diagnose import mpi_matching, own_lines
from pytest_ddp.diagnose.phrases import describe_call
from pytest_ddp.diagnose.state import LeftBy, RankState, exit_text


def _short_error(state: RankState) -> str:
    """A failed rank's error in one line: its last call's if that raised (an earlier one was
    handled), else its failed report's, else ``failed``."""
    last = state.last_raised
    if last is not None:
        error = last.error or "error"
        return plain_error(error.strip().splitlines()[0])  # C++ messages run over many lines
    for report in state.reports.values():
        if report.get("outcome") == "failed":
            message = _report_message(report.get("data"))
            if message:
                return plain_error(message)
    return "failed"


# Gloo's message of a broken connection: the C++ source it came from, the peer's address and port
# (each peer's copy names its own) and advice that is the same every time.
_SOURCE = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|h):\d+\] ")
_ADDRESS = re.compile(r" ?\[[0-9A-Fa-f.:]+\]:\d+")
_ADVICE = re.compile(r"\.? This is typically caused by .*")


def plain_error(line: str) -> str:
    """An error's line without what differs between peers' copies of one Gloo error or repeats in
    each: ``RuntimeError: Read error: Connection reset by peer``."""
    return _ADVICE.sub("", _ADDRESS.sub("", _SOURCE.sub("", line)))


def _report_message(data: object) -> str | None:
    """The first line of the error in a serialized pytest report, or in a ``run()`` result."""
    if not isinstance(data, dict):
        return None
    longrepr = data.get("longrepr")
    candidates = [data.get("exception"), data.get("message"), longrepr]
    if isinstance(longrepr, dict):
        candidates.append((longrepr.get("reprcrash") or {}).get("message"))
    for text in candidates:
        if isinstance(text, str) and text.strip():
            lines = [line for line in text.splitlines() if line.strip()]
            if text is not longrepr:  # a message starts with its error
                return lines[0].strip()
            # A plain-text longrepr marks its error lines "E   " (a missing fixture's ends with
            # its location); else it ends with its error.
            marked = [line[1:].strip() for line in lines if line.startswith("E ")]
            return marked[0] if marked else lines[-1].strip()
    return None


def failed_outside_calls(state: RankState) -> tuple[str, str | None] | None:
    """A live rank that failed with no call of its raising: (its error in one line, the line of
    the test's file it raised at, where its traceback has one); None for any other rank."""
    last = state.calls[-1] if state.calls else None
    if not state.alive or not state.failed or (last is not None and last.state == "raised"):
        return None
    return _short_error(state), own_lines.raised_at(state.reports)


def thread_raised(state: RankState) -> str:
    """``thread Thread-3 (worker) raised OSError: corrupt shard at t.py:9``: the first of the
    test's threads that raised out of its function; "" where none did."""
    if not state.thread_raised:
        return ""
    first = state.thread_raised[0]
    at = f" at {first.site}" if first.site else ""
    return f"thread {first.thread} raised {plain_error(first.error)}{at}"


def how_it_failed(state: RankState) -> str:
    """``died (killed by SIGABRT) in all_reduce #1 (t.py:3)``, ``raised TypeError: ... in
    all_gather_object #2 (t.py:9)``, ``failed (ValueError: boom) at t.py:7``, ``returned from its
    test``, ``called MPI_Abort (errorcode 7) at t.py:5``, ``died (exit code 1; its code's exit at
    t.py:8)``."""
    last = state.calls[-1] if state.calls else None
    if (abort := mpi_matching.mpi_abort(state)) is not None:
        return f"called MPI_Abort (errorcode {abort.extra.get('errorcode')}) at {abort.site}"
    if not state.alive:
        inside = f" in {describe_call(last)}" if last is not None and last.state == "running" else ""
        exited = f"; its code's exit at {state.exited_at}" if state.exited_at else ""
        return f"died ({exit_text(state.exit_code)}{exited}){inside}"
    if last is not None and last.state == "raised":
        return f"raised {_short_error(state)} in {describe_call(last)}"
    failed = failed_outside_calls(state)
    if failed is not None:
        error, line = failed
        at = f" at {line}" if line else ""
        return f"failed{at}" if error == "failed" else f"failed ({error}){at}"
    return f"returned from its test{left_by(state)}"


def left_by(state: RankState) -> str:
    """`` by t.py:6 in a branch for it alone``, `` by t.py:6 under a test of a value that differs
    between ranks (t.py:5)``: the break or return a rank that returned left by (own_lines.left_by);
    "" where its code does not tell."""
    left = state.left_by
    return "" if left is None else f" by {left.site}{tested(left)}"


def tested(left: LeftBy) -> str:
    """How a way out is tested: `` in a branch for it alone``, `` under a test of a value that differs
    between ranks (t.py:5)``."""
    if left.value_test is None:
        return " in a branch for it alone"
    return f" under a test of a value that differs between ranks ({left.value_test})"


def rank_status(state: RankState) -> str:
    """What the rank is doing, in a few words: ``finished (passed)``, ``running (call), outside any
    collective``, ``stopped (state T in /proc: ...)``; "" when it waits in a call."""
    if not state.alive:
        return f"died ({exit_text(state.exit_code)}) during {state.phase}"
    if state.finished:
        return f"finished ({'failed' if state.failed else 'passed'})"
    if state.process is not None and state.process.stopped:
        inside = "" if state.current_call is not None else ", outside any collective"
        return f"{state.process.text} during {state.phase}{inside}"
    if state.current_call is not None:
        return ""
    return f"running ({state.phase}), outside any collective"


def rank_doing(state: RankState, at: str | None = None) -> str:
    """``waiting in barrier #2 (test_x.py:20), in call``, ``finished (passed); last call all_reduce
    #3 (t.py:9)``, ``running (call), outside any collective, at t.py:81; ...``: the rank's status and
    its current or last call (``at``: the line of the test a rank outside any call stood at, from its
    stack); why no stack came, where none did."""
    status = rank_status(state)
    if at is not None and status and not state.finished and state.current_call is None:
        status += f", at {at}"
    last = (state.calls[-1] if state.calls else None) if status else state.current_call  # not a later isend
    where = describe_call(last) if last is not None else "no collective yet"
    doing = f"{status}; last call {where}" if status else f"waiting in {where}, in {state.phase}"
    raised = failed_outside_calls(state)
    if raised is not None and raised[1] is not None:
        doing += f"; raised at {raised[1]}"
    if state.thread_raised:
        doing += f"; its {thread_raised(state)}"
    if not state.stack_missing:
        return doing
    return f"{doing}; {'no Python stack came' if state.process is None else state.process.no_stack}"


def not_entered(state: RankState) -> str:
    """What to say of a rank that did not make the collective where the ranks part ways: where it is."""
    status = rank_status(state) or f"waiting in {describe_call(state.current_call or state.calls[-1])}"
    return f"did not enter it, {status}"

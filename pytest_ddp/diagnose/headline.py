"""The headline of a failed test's report: what happened and to whom (the verdict's summary, else
what failed a test whose ranks all passed), then the verdict's tag."""

from __future__ import annotations

from pytest_ddp.diagnose.verdicts import Verdict

_NAMED_STATUSES = ("deadlock", "stopped", "timeout")  # a tag's first word; any other status: "failed"


def lead(
    verdict: Verdict,
    *,
    unfinished: bool,
    unreceived: bool,
    differ: bool,
    not_fired: list[str],
    stop_teardown: bool,
) -> str:
    """What happened and to whom: the verdict's summary, or what failed a test whose ranks all
    passed (work left in flight, messages never received, sequences that differ, faults that never
    fired, a failed teardown at the group's stop)."""
    if verdict.summary:
        return verdict.summary
    if unfinished:
        return "asynchronous work left in flight"
    if unreceived:
        return "messages sent and never received"
    if differ:
        return "the ranks' collective sequences differ"
    if not_fired:
        return f"injected faults never fired: {'; '.join(not_fired)}"
    if stop_teardown:
        return "the ranks failed in the teardown of the fixtures they still held when their group was stopped"
    return "failed"


def tag(verdict: Verdict, elapsed: float) -> str:
    """``[ddp deadlock, partial, 0.41 s]`` (a deadlock's kind and how long into the test it was
    diagnosed), ``[ddp failed]``, ``[ddp stopped, rank_exited]``: after the lead, so that pytest's
    one-line summary, cut at the terminal's width, keeps the cause."""
    status = verdict.status if verdict.status in _NAMED_STATUSES else "failed"
    words = [status] + ([verdict.kind] if verdict.kind and verdict.kind != status else [])
    if verdict.status == "deadlock":
        words.append(f"{elapsed:.2f} s")
    return f"[ddp {', '.join(words)}]"

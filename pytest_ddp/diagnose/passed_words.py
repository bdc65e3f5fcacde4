"""The words of what fails a test whose ranks all passed (:mod:`pytest_ddp.diagnose.consistency`'s
findings): collective sequences that differ, asynchronous work unfinished, messages never received;
for the report, the JSON and ``run()``."""

from __future__ import annotations

from pytest_ddp.diagnose.consistency import (
    CallDifference,
    SequenceDifference,
    UnfinishedWork,
    UnreceivedMessage,
)
from pytest_ddp.diagnose.phrases import describe_call, grouped, rank_list, signature_text


def unfinished_line(work: UnfinishedWork) -> str:
    """``rank 1: irecv #1 from 0 (test_x.py:12): Timed out waiting ...``."""
    what = describe_call(work.call) if work.call is not None else f"call {work.index}"
    return f"rank {work.rank}: {what}: {work.error}"


def unreceived_line(message: UnreceivedMessage) -> str:
    """``rank 2: Send #1 to 0 (tag 0) (test_x.py:12): sent, never received``."""
    return f"rank {message.rank}: {describe_call(message.call)}: sent, never received"


def difference_line(difference: SequenceDifference) -> str:
    """``group WORLD: rank 0 made 2 collectives, rank 1 made 1 collective``, or the first
    collective where a rank's call differs from the lowest member's."""
    d = difference
    if isinstance(d, CallDifference):
        reductions = d.reference.reduction != d.theirs.reduction
        return (
            f"group {d.group}, collective #{d.position}: rank {d.reference_rank} "
            f"{signature_text(d.reference, reductions)} ({d.reference.site}) vs rank {d.rank} "
            f"{signature_text(d.theirs, reductions)} ({d.theirs.site})"
        )
    made = [
        f"{rank_list(group_ranks)} made {n} collective{'' if n == 1 else 's'}"
        for n, group_ranks in grouped(d.counts, d.counts.get)
    ]
    return f"group {d.group}: " + ", ".join(made)

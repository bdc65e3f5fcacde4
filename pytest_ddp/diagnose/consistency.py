"""The after-test check of a passing test: do the ranks' collective sequences agree,
did every rank's asynchronous work complete, was every MPI message sent received?  Its findings,
and each one's line for the report, the JSON and ``run()``.  Pure: data in, data out."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_ddp.diagnose import mpi_matching
from pytest_ddp.diagnose.phrases import describe_call, said, signature_text
from pytest_ddp.diagnose.state import Call, RankState


@dataclass(frozen=True)
class UnfinishedWork:
    """Asynchronous work a rank left unfinished when its test ended."""

    rank: int
    call: Call | None  # None: a call the log does not hold
    index: int
    error: str  # why it did not complete: what waiting for it raised ("Timed out waiting ...")


@dataclass(frozen=True)
class CountDifference:
    """The members of a group made different numbers of collectives on it."""

    group: str
    counts: dict[int, int]  # rank -> collectives made


@dataclass(frozen=True)
class CallDifference:
    """The first collective of a group where a rank's call differs from the lowest member's."""

    group: str
    position: int  # 1-based
    reference_rank: int
    reference: Call
    rank: int
    theirs: Call


SequenceDifference = CountDifference | CallDifference


def unfinished_work(ranks: list[RankState]) -> list[UnfinishedWork]:
    found = []
    for state in sorted(ranks, key=lambda s: s.rank):
        for work in state.in_flight:
            call = state.calls[work["i"]] if work["i"] < len(state.calls) else None
            found.append(UnfinishedWork(state.rank, call, work["i"], work["err"]))
    return found


# A message never received: its send returned (its data buffered), and MPI drops it silently when
# the program ends.
UnreceivedMessage = mpi_matching.Message


def unreceived_messages(ranks: list[RankState]) -> list[UnreceivedMessage]:
    """The MPI messages whose send returned and that no receive took, in rank order."""
    left = mpi_matching.match({s.rank: s for s in ranks}).left
    return sorted((m for m in left if m.call.state == "ok"), key=lambda m: m.rank)


def compare_sequences(ranks: list[RankState]) -> list[SequenceDifference]:
    """How the ranks' collective sequences differ, per group, against the lowest member's
    (:meth:`Call.signature`, and their number); [] when they agree.  Only each rank's first
    difference: later ones are usually the same shift."""
    sequences: dict[str, dict[int, list[Call]]] = {}
    members: dict[str, tuple[int, ...]] = {}
    for state in sorted(ranks, key=lambda s: s.rank):
        for call in state.calls:
            if call.is_collective and call.group != "?":  # "?": a group the recorder could not name
                sequences.setdefault(call.group, {}).setdefault(state.rank, []).append(call)
                members.setdefault(call.group, call.group_ranks)
    present = sorted(s.rank for s in ranks)
    differences: list[SequenceDifference] = []
    for group, per_rank in sequences.items():
        listed = [r for r in present if not members[group] or r in members[group]]
        differences += _compare_group(group, {r: per_rank.get(r, []) for r in listed})
    return differences


def _compare_group(group: str, sequences: dict[int, list[Call]]) -> list[SequenceDifference]:
    differences: list[SequenceDifference] = []
    counts = {r: len(calls) for r, calls in sequences.items()}
    if len(set(counts.values())) > 1:
        differences.append(CountDifference(group, counts))
    keys = {r: [c.signature() for c in calls] for r, calls in sequences.items()}
    reference, *others = sorted(sequences)
    for rank in others:
        if keys[rank] == keys[reference]:
            continue
        for position, (expected, theirs) in enumerate(zip(sequences[reference], sequences[rank]), 1):
            if keys[reference][position - 1] != keys[rank][position - 1]:
                differences.append(CallDifference(group, position, reference, expected, rank, theirs))
                break
    return differences


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
    made = said(d.counts, lambda r: f"made {d.counts[r]} collective{'' if d.counts[r] == 1 else 's'}", ", ")
    return f"group {d.group}: {made}"

"""Mismatches: ranks whose calls at one place of their sequences disagree.  Pure: no processes, no I/O.

Some disagreements can never complete (another op, root or byte count): a certain mismatch while
the ranks wait (:func:`inflight_mismatch`, :func:`p2p_mismatch`).  Others complete without an
error on Gloo and MPICH (a [2, 5] tensor against a [10] one, another reduce op) and are found in
the recorded calls afterwards (:func:`finished_mismatch`).  Which ranks departed is
:mod:`pytest_ddp.diagnose.majority`'s word.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from itertools import compress, count, islice
from operator import attrgetter, ne

from pytest_ddp.common.dtypes import ELEMENT_SIZES
from pytest_ddp.common.ops import COLLECTIVES
from pytest_ddp.diagnose import majority, waits
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import Disagreement, MembersDiffer, Verdict


def wire_size(call: Call) -> tuple[object, ...]:
    """What goes over the wire per tensor: bytes where the dtype is known, else shape and dtype
    (to tell mismatches that cannot complete from those Gloo lets through: [2, 5] against [10])."""
    sizes: list[object] = []
    for shape, dtype in zip(call.shapes, call.dtypes):
        numel = 1
        for dim in shape:
            numel *= dim
        if dtype in ELEMENT_SIZES:
            sizes.append(numel * ELEMENT_SIZES[dtype])
        else:
            sizes.append((tuple(shape), dtype))
    return tuple(sizes)


def _completion_key(call: Call) -> tuple[object, ...]:
    """What two ranks must agree on for Gloo to complete a collective at all."""
    sizes = () if call.kind.uneven else wire_size(call)
    return call.op, call.root, sizes


# -- while the ranks wait -----------------------------------------------------


def inflight_mismatch(ranks: dict[int, RankState]) -> Verdict | None:
    """A rank blocked, dead or raised inside a collective that a peer entered in a way that can
    never complete with it.  The peer may have returned from it: Gloo's size check aborts only the
    rank that receives too much, and MPICH raises "message truncated" on it alone."""
    # (group, number, members) -> each member that entered it -> its completion key: worked out
    # once for all the ranks blocked in it, so O(ranks) per collective, not O(ranks^2).
    entered: dict[tuple[str, int, tuple[int, ...]], dict[int, tuple[object, ...]]] = {}
    for rank in sorted(ranks):
        state = ranks[rank]
        call = state.blocked_call or state.died_in or state.last_raised
        if call is None or not call.is_collective:
            continue
        position = (call.group, call.seq, call.group_ranks)
        if position not in entered:
            entered[position] = {m: _completion_key(c) for m, c in waits.entered(call, ranks).items()}
        own = _completion_key(call)
        if any(key != own for member, key in entered[position].items() if member != rank):
            return mismatch_verdict("deadlock", ranks, call, _completion_key)
    return None


def new_group_members(status: str, ranks: dict[int, RankState]) -> Verdict | None:
    """The first new_group every rank made (its k-th), without use_local_synchronization, whose
    members differ between ranks: looked for once a rank is blocked, and after a test that
    passed.  torch names every rank's k-th group alike and makes it of the members that rank
    passed ("All processes must pass the identical ranks list"), so the ranks meet in groups that
    are not one: a hang, or a pass by chance (pytorch#130102).  The ranks of the rarer members departed; at
    a tie every rank is named."""
    made = {r: state.new_groups() for r, state in ranks.items()}
    for k in range(min(map(len, made.values()), default=0)):
        calls = {r: mine[k] for r, mine in made.items()}
        if any(c.extra.get("local") or "ranks" not in c.extra for c in calls.values()):
            return None  # made by its members only: the calls after it need not line up
        odd, agreeing = majority.minority(calls, lambda c: (tuple(c.extra["ranks"]),))
        if odd:  # at a tie, every rank
            call = calls[odd[0]]
            finding = MembersDiffer(calls, k + 1, odd if agreeing else [])
            return Verdict(status, "mismatch", odd, agreeing, call.op, call.label, finding)
    return None


def p2p_mismatch(status: str, ranks: dict[int, RankState]) -> Verdict | None:
    """A send and the receive it pairs with whose messages differ in size: Gloo's receive raises,
    or takes part and a later call raises; the rank that raised is not therefore the culprit.
    Looked for in the call a rank is blocked in, and over every call of a rank that raised."""
    # Each peer's sends and receives, indexed once however many ranks wait for that peer.
    indexes: dict[int, dict[tuple[str, bool, int | None, int], Call]] = {}
    for rank in sorted(ranks):
        for call in _compared_p2p(rank, ranks):
            peer = call.peer
            assert peer is not None  # _compared_p2p keeps calls whose peer is a rank
            if peer not in indexes:
                calls = ranks[peer].calls
                indexes[peer] = {(c.group, c.is_recv, c.peer, c.seq): c for c in calls if c.is_p2p}
            theirs = indexes[peer].get((call.group, not call.is_recv, rank, call.seq))
            if theirs is None or not theirs.shapes:
                continue
            if wire_size(theirs) != wire_size(call):
                entered = {rank: call, peer: theirs}
                likely, after = majority.likely(ranks, entered, wire_size)
                overflow = _overflow(entered)
                # the sender, where nothing recorded says otherwise (its history may say so too)
                if overflow is not None and not after and set(likely) <= {overflow[0]}:
                    sender, sent, held = overflow
                    send = entered[sender]
                    finding = Disagreement(call, entered, likely, odd=[sender], overflow=(sent, held))
                    return Verdict(status, "mismatch", [sender], [r for r in entered if r != sender], send.op,
                                   send.label, finding)
                finding = Disagreement(call, entered, likely, after)
                return Verdict(status, "mismatch", sorted(entered), [], call.op, call.label, finding)
    return None


def _overflow(entered: dict[int, Call]) -> tuple[int, int, int] | None:
    """(the sender, the bytes it sent, the bytes the receive holds) where a send's message is larger
    than the receive's buffer: the receive was posted for what its rank was told to expect (a
    pipeline stage's declared shapes, a preallocated buffer), and the sender sent more
    (pytorch#126732: a stage widened, its declared output not; MPP-LLaVA#25: a sequence longer than
    the buffer).  Gloo receives a shorter message without a word."""
    sender = next((r for r, c in entered.items() if not c.is_recv), None)
    receiver = next((r for r, c in entered.items() if c.is_recv), None)
    if sender is None or receiver is None:
        return None
    sent, held = _bytes(entered[sender]), _bytes(entered[receiver])
    if sent is None or held is None:
        return None  # a dtype of unknown size
    return (sender, sent, held) if sent > held else None


def _bytes(call: Call) -> int | None:
    """The bytes a call's tensors take on the wire; None where a dtype's size is not known."""
    sizes = wire_size(call)
    known = [size for size in sizes if isinstance(size, int)]
    return sum(known) if len(known) == len(sizes) else None


def aborted_on_sizes(status: str, ranks: dict[int, RankState]) -> Verdict | None:
    """A rank that Gloo aborted (SIGABRT) inside a collective whose tensors may differ in size
    between ranks (``all_to_all``), where its tensors' shapes differ from those its peers, all
    alike, entered it with: the sizes did not line up, and it is the odd rank (dion#74: an empty
    ``(0, D)`` shard among shards of a row each).  Shapes alone tell nothing of such a call in
    correct code; the abort inside it does."""
    for state in ranks.values():
        call = state.died_in
        if call is None or state.exit_code != -signal.SIGABRT or not call.kind.uneven:
            continue
        entered = waits.entered(call, ranks)
        culprits, agreeing = majority.minority(entered, _shapes)
        if culprits == [state.rank] and agreeing:
            return mismatch_verdict(status, ranks, call, _shapes)
    return None


def _shapes(call: Call) -> tuple[object, ...]:
    return call.op, tuple(tuple(shape) for shape in call.shapes), tuple(call.dtypes)


def _compared_p2p(rank: int, ranks: dict[int, RankState]) -> list[Call]:
    """The rank's sends and receives to compare with their peers': all where its last call raised;
    else the one it is blocked in or died inside (Gloo aborts a rank whose receive meets a message
    of another size).  torch's only: MPI pairs by tag (:mod:`pytest_ddp.diagnose.mpi_matching`)."""
    state = ranks[rank]
    if state.last_raised is not None:
        mine = [c for c in state.calls if c.is_p2p]
    else:
        inside = state.blocked_call or state.died_in
        mine = [inside] if inside is not None and inside.is_p2p else []
    return [c for c in mine if c.kind.api == "torch" and c.peer in ranks and c.peer != rank and c.shapes]


# -- in the calls the ranks made ----------------------------------------------

# Calls equal in these are the same call (Call.signature reads a subset of them).
_SAME_CALL = attrgetter("group", "seq", "op", "shapes", "dtypes", "root", "reduction")


def shared_prefix(sequences: Sequence[Sequence[Call]]) -> int:
    """The number of leading positions at which every sequence's call is the first sequence's:
    the part of a long run that the check below and the report can skip.  Compared in the
    interpreter's C code (``map``, ``compress``): a Python loop over every call of 512 ranks of
    10,000 calls took seconds.  No list is kept per rank, so the garbage collector does not walk
    millions of tuples."""
    if not sequences:
        return 0
    shared = min(len(s) for s in sequences)
    reference = list(map(_SAME_CALL, islice(sequences[0], shared)))
    for other in sequences[1:]:
        shared = next(compress(count(), map(ne, map(_SAME_CALL, islice(other, shared)), reference)), shared)
    return shared


def finished_mismatch(status: str, ranks: dict[int, RankState]) -> Verdict | None:
    """The first collective two ranks entered with different signatures (:meth:`Call.signature`),
    whether or not it completed: read after the test, or once a rank failed."""
    made = {rank: ranks[rank].calls for rank in sorted(ranks)}
    # The calls the ranks made alike from the first are alike by signature: only what follows can
    # differ, unless a (group, number) made there comes again (a group made anew: compare all).
    shared = shared_prefix(list(made.values()))
    first = next(iter(made.values()), [])
    skipped = {(c.group, c.seq) for c in _collectives(first[:shared])}
    rest = [(rank, call) for rank, calls in made.items() for call in _collectives(calls[shared:])]
    if any((call.group, call.seq) in skipped for _, call in rest):
        rest = [(rank, call) for rank, calls in made.items() for call in _collectives(calls)]
    by_position: dict[tuple[str, int], dict[int, Call]] = {}
    for rank, call in rest:
        by_position.setdefault((call.group, call.seq), {})[rank] = call
    for entered in by_position.values():
        if len({Call.signature(c) for c in entered.values()}) > 1:
            return mismatch_verdict(status, ranks, entered[min(entered)], Call.signature)
    return None


def _collectives(calls: list[Call]) -> list[Call]:
    """The collectives among ``calls``, but those on a group the recorder could not name ("?")."""
    return [c for c in calls if c.op in COLLECTIVES and c.group != "?"]


def mismatch_verdict(status: str, ranks: dict[int, RankState], call: Call, key: majority.Key) -> Verdict:
    """The verdict on the members that entered ``call``'s collective: those whose call differs
    by ``key`` from most are named; in a tie every one is, with what tells its likely culprits
    (:func:`pytest_ddp.diagnose.majority.likely`)."""
    entered = waits.entered(call, ranks)
    culprits, agreeing = majority.minority(entered, key)
    likely: dict[int, Call] = {}
    after: dict[int, tuple[Call, Call]] = {}
    if not agreeing:  # a tie
        likely, after = majority.likely(ranks, entered, key)
    finding = Disagreement(call, entered, likely, after, odd=culprits if agreeing else [])
    if len({entered[r].op for r in culprits}) > 1:  # a tie between different operations: none is named
        return Verdict(status, "mismatch", culprits, agreeing, None, None, finding)
    odd = entered[culprits[0]]
    return Verdict(status, "mismatch", culprits, agreeing, odd.op, odd.label, finding)

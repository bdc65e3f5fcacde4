"""Who waits for whom: each blocked rank's wait, and the ranks that can never progress.
Pure: the watchdog's first half (:mod:`pytest_ddp.diagnose.watchdog` turns it into a verdict).

A rank blocked in a collective needs the members of its group that have not
entered the same collective (same group, same sequence number); a rank blocked
in ``recv`` needs its sender, and a blocked ``send`` its receiver (MPI's calls
by MPI's matching rules, :mod:`pytest_ddp.diagnose.mpi_matching`).  The *doomed* ranks
are the greatest fixpoint of "blocked, and some needed rank is gone or doomed".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from pytest_ddp.common.ops import INIT, NEW_GROUP
from pytest_ddp.diagnose import mpi_matching
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import Wait

# -- what the ranks have entered ----------------------------------------------


def _took_part(state: RankState, call: Call) -> bool:
    """A call that raised never took part (an unpicklable object raises before any
    communication), and one whose process died inside it will never do its part."""
    return call.state == "ok" or (call.state == "running" and state.alive)


def collective_at(state: RankState, group: str, seq: int) -> Call | None:
    """The collective number ``seq`` on ``group`` of this rank, if it has entered it (scanned back
    from the latest call: numbers only grow, so an older one ends the search)."""
    for call in reversed(state.calls):
        if call.is_collective and call.group == group:
            if call.seq == seq:
                return call
            if call.seq < seq:
                return None
    return None


def first_missed(waiter: RankState, absent: RankState, call: Call) -> Call:
    """The first collective of ``call``'s group, up to ``call``, that ``waiter`` made and
    ``absent`` never entered (earlier than ``call`` with async work in flight); else ``call``."""
    first = call
    if not call.is_collective:
        return first
    for made in reversed(waiter.calls[: call.index]):
        if made.is_collective and made.group == call.group:
            # Numbers that do not fall: a group made again under the name.  One the absent rank
            # entered: so did it every earlier one.
            if made.seq >= first.seq or collective_at(absent, made.group, made.seq) is not None:
                break
            first = made
    return first


def group_members(call: Call, ranks: dict[int, RankState]) -> list[int] | None:
    """Every member of the call's group in this test; None when the group's members are unknown."""
    if call.group_ranks:
        listed: Iterable[int] = call.group_ranks
    elif call.group == "WORLD":
        listed = ranks
    else:
        return None
    return [m for m in listed if m in ranks]


def entered(call: Call, ranks: dict[int, RankState]) -> dict[int, Call]:
    """Each member of the call's group that entered its collective -> its call there."""
    found = {}
    for member in group_members(call, ranks) or []:
        theirs = collective_at(ranks[member], call.group, call.seq)
        if theirs is not None:
            found[member] = theirs
    return found


class _Seen:
    """What one judgement asks again and again, worked out once (a collective's absent members, a
    rank's count of sends or receives): a look at many ranks blocked in one collective is O(ranks)."""

    def __init__(self, ranks: dict[int, RankState]) -> None:
        self._ranks = ranks
        self._absent: dict[tuple[str, int, tuple[int, ...]], list[int] | None] = {}
        self._p2p: dict[int, tuple[Iterator[Call], dict[tuple[str, bool, int | None], int]]] = {}

    def absent(self, call: Call) -> list[int] | None:
        """The members of the call's group that have not taken part in its collective (in the
        group's order); None when the group's members are unknown."""
        key = (call.group, call.seq, call.group_ranks)
        if key not in self._absent:
            listed = group_members(call, self._ranks)
            self._absent[key] = None if listed is None else [
                m for m in listed
                if (theirs := collective_at(self._ranks[m], call.group, call.seq)) is None
                or not _took_part(self._ranks[m], theirs)
            ]
        return self._absent[key]

    def p2p_count(self, rank: int, group: str, recv: bool, peer: int | None) -> int:
        """How many receives from (sends to) ``peer`` on ``group`` the rank has entered: the
        number of the latest, as the recorder numbers them per (group, direction, peer)."""
        if rank not in self._p2p:
            self._p2p[rank] = (reversed(self._ranks[rank].calls), {})
        calls, latest = self._p2p[rank]
        key = (group, recv, peer)
        while key not in latest:
            call = next(calls, None)
            if call is None:
                return 0
            if call.is_p2p:
                latest.setdefault((call.group, call.is_recv, call.peer), call.seq)
        return latest[key]


# -- who waits for whom -------------------------------------------------------


def waits_of(ranks: dict[int, RankState]) -> dict[int, Wait]:
    """Each blocked rank's wait; blocked ranks about which nothing is certain are left out."""
    waits = {}
    mpi = mpi_matching.P2P(ranks)  # MPI's matching rules, for MPI's sends and receives
    seen = _Seen(ranks)
    for rank, state in ranks.items():
        call = state.blocked_call
        if call is None:
            continue
        wait: Wait | None
        if call.op == INIT:
            wait = _init_wait(rank, call, ranks)
        elif call.op == NEW_GROUP and not call.extra.get("local"):
            wait = _new_group_wait(rank, call, ranks)
        elif mpi_matching.is_mpi_p2p(call):
            wait = mpi.wait(rank, call)
        elif call.is_p2p:
            wait = _p2p_wait(rank, call, ranks, seen)
        elif call.is_collective:
            absent = seen.absent(call)  # the rank itself took part: it is in the call
            wait = None if absent is None else Wait(call, [m for m in absent if m != rank])
        else:  # destroy_process_group, batch_isend_irecv, a new_group made by its members only
            wait = None
        if wait is not None:
            waits[rank] = wait
    return waits


def _p2p_wait(rank: int, call: Call, ranks: dict[int, RankState], seen: _Seen) -> Wait | None:
    """My k-th receive from P pairs with P's k-th send to me, and the other way round."""
    if call.peer is None:
        return _any_source_wait(rank, call, ranks, seen)
    peer = call.peer
    if peer not in ranks or peer == rank:
        return None
    if call.is_recv:
        entered = seen.p2p_count(peer, call.group, recv=False, peer=rank)
    else:  # the peer's receives from any source may take my send too
        entered = seen.p2p_count(peer, call.group, True, rank) + seen.p2p_count(peer, call.group, True, None)
    return Wait(call, [] if entered >= call.seq else [peer])


def _any_source_wait(rank: int, call: Call, ranks: dict[int, RankState], seen: _Seen) -> Wait | None:
    """A receive from any source is stuck only if no member can still send: OR semantics."""
    listed = group_members(call, ranks)
    members = None if listed is None else [m for m in listed if m != rank]
    mine = [c for c in ranks[rank].calls if c.is_p2p and c.group == call.group and c.is_recv]
    # An earlier irecv may still be unmatched, so a send cannot be told to be this one's.
    if members is None or any(c.is_async for c in mine):
        return None
    sent = sum(seen.p2p_count(m, call.group, recv=False, peer=rank) for m in members)
    return Wait(call, [] if sent >= len(mine) else members, any_of=True)


def _init_wait(rank: int, call: Call, ranks: dict[int, RankState]) -> Wait:
    """init_process_group needs every process to have entered init as often as this one."""
    return _entered_as_often(rank, call, ranks, list(ranks), lambda s: [c for c in s.calls if c.op == INIT])


def _new_group_wait(rank: int, call: Call, ranks: dict[int, RankState]) -> Wait | None:
    """new_group (but one made by its members only) needs every member of the new group to have
    made as many: torch names it by that count, and Gloo connects its members under the name (the
    other processes are not waited for: no barrier unless ``TORCH_DIST_INIT_BARRIER=1``)."""
    members = call.extra.get("ranks")
    if members is None:
        return None
    return _entered_as_often(
        rank, call, ranks, [m for m in members if m in ranks],
        lambda state: [c for c in state.new_groups() if not c.extra.get("local")],
    )


def _entered_as_often(
    rank: int,
    call: Call,
    ranks: dict[int, RankState],
    needed: list[int],
    made: Callable[[RankState], list[Call]],
) -> Wait:
    """``call`` waits for each of ``needed`` that has not taken part in as many of the calls ``made``
    gives (the rank's own among them)."""
    count = len(made(ranks[rank]))

    def joined(state: RankState) -> bool:
        theirs = made(state)
        return len(theirs) >= count and _took_part(state, theirs[count - 1])

    return Wait(call, [m for m in needed if m != rank and not joined(ranks[m])])


def doomed_ranks(ranks: dict[int, RankState], waits: dict[int, Wait]) -> set[int]:
    """Blocked ranks that cannot progress whatever the running ranks do: the greatest fixpoint
    of "some needed rank is gone or doomed" ("every candidate" for a receive from any source)."""
    doomed = {rank for rank, wait in waits.items() if wait.peers}

    def hopeless(peer: int) -> bool:
        return ranks[peer].finished or peer in doomed

    changed = True
    while changed:
        changed = False
        for rank in sorted(doomed):
            wait = waits[rank]
            # A collective needs all its missing members: one that never comes is enough.
            if not (all if wait.any_of else any)(hopeless(p) for p in wait.peers):
                doomed.discard(rank)
                changed = True
    return doomed


def reaches(start: int, target: int, edges: dict[int, list[int]]) -> bool:
    seen: set[int] = set()
    todo = list(edges[start])
    while todo:
        node = todo.pop()
        if node == target:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(edges[node])
    return False

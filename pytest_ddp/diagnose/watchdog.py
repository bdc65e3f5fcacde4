"""The watchdog: from a snapshot of every rank to a verdict.  Pure: no processes, no I/O.

The question, many times a second: can any rank still make progress?  The blocked ranks that
cannot, whatever the running ranks do, are the *doomed* set (:mod:`pytest_ddp.diagnose.waits`);
if it is not empty the deadlock is certain.  Calls that can never complete together, or that
completed though they differ, are mismatches (:mod:`pytest_ddp.diagnose.mismatches`).  The
verdict is data (:mod:`pytest_ddp.diagnose.verdicts`); :mod:`pytest_ddp.diagnose.wording` words it.
"""

from __future__ import annotations

from pytest_ddp.diagnose import code_ties, failed_ranks, majority, mpi_matching, own_lines
from pytest_ddp.diagnose.init_faults import init_fault
from pytest_ddp.diagnose.mismatches import (
    aborted_on_sizes,
    finished_mismatch,
    inflight_mismatch,
    new_group_members,
    p2p_mismatch,
)
from pytest_ddp.diagnose.source_text import Source
from pytest_ddp.diagnose.state import RankState, Snapshot
from pytest_ddp.diagnose.verdicts import (
    Cycle,
    Departed,
    Disagreement,
    ExtraCall,
    InitFault,
    NoSuchPeer,
    TimedOut,
    Verdict,
    Wait,
)
from pytest_ddp.diagnose.waits import (
    collective_at,
    doomed_ranks,
    first_missed,
    reaches,
    waits_of,
)

# -- certain deadlocks --------------------------------------------------------


def _deadlock(ranks: dict[int, RankState], waits: dict[int, Wait]) -> Verdict | None:
    doomed = doomed_ranks(ranks, waits)
    if not doomed:
        return None
    gone = _gone_verdict(ranks, waits, doomed)
    if gone is None:
        return _cycle_verdict(ranks, waits, doomed)
    if gone.kind == "rank_exited":
        # Calls recorded on both sides that disagree are the cause of the rank's error: Gloo lets
        # calls of one size in other shapes through, and a rank trips on the data after them.
        return finished_mismatch("deadlock", ranks) or aborted_on_sizes("deadlock", ranks) or gone
    return gone


def _gone_verdict(ranks: dict[int, RankState], waits: dict[int, Wait], doomed: set[int]) -> Verdict | None:
    """Doomed ranks wait for ranks that left the test: rank_exited or partial."""
    needs = {r: [p for p in waits[r].peers if ranks[p].finished or p in doomed] for r in doomed}
    left = {r: [p for p in needs[r] if ranks[p].finished] for r in doomed}
    gone = sorted({p for peers in left.values() for p in peers})
    if not gone:
        return None
    victims = _victims(gone, ranks, waits, left)
    woken = _woken_by_peer(gone, ranks)  # their dead peers are culprits, though no rank waits for them
    victims |= set(woken)
    for r in doomed:  # ... and are left behind by the ranks that wait for those they woke
        left[r] += sorted({woken[g] for g in left[r] if g in woken} - set(left[r]))
    culprits = [g for g in sorted(set(gone) | set(woken.values())) if g not in victims] or gone
    kind = "rank_exited" if any(not ranks[g].alive or ranks[g].failed for g in culprits) else "partial"
    center = majority.broken_center(ranks)
    if center is not None and ranks[center].finished:  # the others were woken by its broken connections
        kind = "rank_exited"
        culprits = [center]
        victims = set(gone) - {center}
        for r in doomed:  # ... and leave behind those waiting for them
            if set(left[r]) & victims and center not in left[r]:
                left[r].append(center)
    broken: list[int] = []
    if center is None and kind == "rank_exited" and len(culprits) == 1:
        broken = majority.broken_pair(ranks, culprits[0])
    alike: list[int] = []
    if kind == "partial" and not victims:
        extra = majority.extra_call(culprits, doomed, waits)
        if extra is None:
            extra = majority.extra_message(culprits, doomed, ranks, waits)
        if extra is not None:
            return extra
        # No majority (2 ranks): where the waiting went on as they had, it is a tie.
        no_majority = len(ranks) == 2 * len(doomed) == 2 * len(culprits)
        if no_majority and majority.as_before(ranks, {r: waits[r].call for r in doomed}):
            alike = sorted(doomed)

    waiter = min(r for r in doomed if left[r])
    first = first_missed(ranks[waiter], ranks[left[waiter][0]], waits[waiter].call)
    finding = Departed(culprits, sorted(victims), sorted(doomed), needs, left, waits, broken, alike)
    # A broken connection's end still in the test is named too.
    named = sorted(set(culprits) | set(broken) | set(alike))
    waiting = [r for r in sorted(doomed) if r not in named]
    return Verdict("deadlock", kind, named, waiting, first.op, first.label, finding)


def _victims(
    gone: list[int], ranks: dict[int, RankState], waits: dict[int, Wait], left: dict[int, list[int]]
) -> set[int]:
    """Gone ranks that raised inside the very collective others wait in, while another gone rank
    died outside it: the death broke the collective for them (Gloo: "Connection closed by peer")."""
    raised_inside = set()
    for rank, peers in left.items():
        call = waits[rank].call
        for g in peers:
            theirs = collective_at(ranks[g], call.group, call.seq) if call.is_collective else None
            if theirs is not None and theirs.state == "raised":
                raised_inside.add(g)
    deaths = [g for g in gone if not ranks[g].alive and g not in raised_inside]
    return raised_inside if deaths else set()


def _woken_by_peer(gone: list[int], ranks: dict[int, RankState]) -> dict[int, int]:
    """Gone ranks whose last call, a send or receive, raised while its peer had died (Gloo:
    "Connection closed by peer") -> that peer: the death broke the exchange for them."""
    woken = {}
    for g in gone:
        last = ranks[g].last_raised
        if last is None or not last.is_p2p or last.peer not in ranks:
            continue
        if not ranks[last.peer].alive:
            woken[g] = last.peer
    return woken


def _cycle_verdict(ranks: dict[int, RankState], waits: dict[int, Wait], doomed: set[int]) -> Verdict:
    """Blocked ranks wait for each other: every doomed rank needs another doomed one, so there is
    a cycle.  The ranks on it are the culprits; the others wait behind it."""
    needs = {r: [p for p in waits[r].peers if p in doomed] for r in doomed}
    culprits = sorted(r for r in doomed if reaches(r, r, needs))
    waiting = sorted(doomed - set(culprits))
    p2p = any(waits[r].call.is_p2p for r in culprits)
    # Ranks in a send or receive that a rank in a collective must match: no call of theirs will.
    unmatched = []
    for r in culprits:
        if waits[r].call.is_p2p and any(not waits[p].call.is_p2p for p in needs[r]):
            unmatched.append(r)
    if not p2p:
        culprits, waiting = majority.out_of_order(culprits, waiting, waits)
    first = waits[(waiting or unmatched or culprits)[0]].call
    if unmatched:
        kind = "p2p_unmatched"
    elif p2p:
        kind = "p2p_cycle"
    else:
        kind = "mismatch"
    after = {}
    if p2p and len(culprits) == 2:
        after = majority.new_paths(ranks, {r: waits[r].call for r in culprits})
    elif p2p:
        after = majority.branched(ranks, culprits)
    if unmatched:
        # Those and the ranks they wait for are the cycle; a rank on it only by its send or receive
        # with one of them waits behind it (mpifileutils#26: rank 2's send to rank 0, which
        # receives from rank 1 first, while rank 1's barrier waits for both). The first call and
        # what tells the ranks apart are worked out on the whole cycle, above, on purpose: a rank
        # that left a line by a new way is told among all the ranks it passed.
        core = set(unmatched) | {p for r in unmatched for p in needs[r]}
        waiting = sorted(set(waiting) | set(culprits) - core)
        culprits = sorted(core)
        after = {r: paths for r, paths in after.items() if r in core}
    cycle = Cycle(culprits, waiting, needs, waits, p2p, unmatched, after)
    return Verdict("deadlock", kind, culprits, waiting, first.op, first.label, cycle)


def _no_such_peer(ranks: dict[int, RankState], waits: dict[int, Wait]) -> Verdict | None:
    """Ranks blocked in a torch send or receive whose peer is no member of its group (``rank - 1``
    on rank 0, ``rank + 1`` on the last): no rank can ever match it (Gloo waits for that rank's
    address in the store until the group's timeout, measured); the ranks waiting for them wait
    behind them."""
    members, stuck = {}, {}
    for rank, state in sorted(ranks.items()):
        call = state.blocked_call
        if call is None or not call.is_p2p or mpi_matching.is_mpi_p2p(call) or call.peer is None:
            continue
        group = list(call.group_ranks) if call.group_ranks else sorted(ranks)
        if call.peer not in group:
            members[rank], stuck[rank] = group, Wait(call, [])
    if not members:
        return None
    culprits = sorted(members)
    behind = {r: w for r, w in waits.items() if r not in members and set(w.peers) & set(culprits)}
    call = stuck[culprits[0]].call
    finding = NoSuchPeer(culprits, members, {**stuck, **behind})
    return Verdict("deadlock", "p2p_unmatched", culprits, sorted(behind), call.op, call.label, finding)


# -- the verdict --------------------------------------------------------------

# A certain deadlock is reported at once unless some ranks are still running or finishing a
# collective: they get this long to finish or block too, so the report names every culprit.
SETTLE = 0.5


class Watch:
    """The verdict policy over one test's life: timeout and grace (applied by :func:`judge`) and
    the settle time of a certain deadlock."""

    def __init__(self, source: Source = lambda file: None) -> None:
        self._certain_since: float | None = None
        self._source = source

    def verdict(self, snap: Snapshot) -> Verdict | None:
        """The final verdict on the test, or None while the controller should wait."""
        verdict = judge(snap)
        if verdict.status == "deadlock" and (_may_time_out_itself(snap) or _may_yet_answer(snap, verdict)):
            return None
        if verdict.status == "deadlock":
            self._certain_since = self._certain_since or snap.now
            moving = _moving(snap, verdict) or _tie_others_may_break(snap, verdict)
            if moving and snap.now - self._certain_since < _settle_time(snap, verdict):
                return None
        if verdict.status == "wait":
            return None
        if verdict.kind is None:  # passed: no culprit to read the code of
            return verdict
        ranks = {s.rank: s for s in snap.ranks}
        for state in snap.ranks:  # how a rank that left outside any call left, as its code tells
            state.exited_at = own_lines.exited_at(state, ranks, self._source)
            state.left_by = own_lines.left_by(state, ranks, self._source)
        return (
            majority.settings_differ(verdict, ranks)
            or majority.cut_on_purpose(verdict, ranks)
            or code_ties.skipped_in_code(verdict, ranks, self._source)
            or code_ties.one_rank_call(verdict, ranks, self._source)
            or code_ties.one_rank_branch_tie(verdict, ranks, self._source)
            or code_ties.ranks_branch_cycle(verdict, ranks, self._source)
            or code_ties.own_group_forgotten(verdict, ranks, self._source)
            or code_ties.collective_before_send(verdict, ranks, self._source)
            or code_ties.left_by_own_branch(verdict, ranks, self._source)
            or verdict
        )


def _may_time_out_itself(snap: Snapshot) -> bool:
    """A rank blocked in a call of a group the test gave a timeout shorter than the grace, not yet
    past (and the settle time after it): Gloo raises that call by itself then, as a test may
    expect (torch's test_barrier_timeout_full_group: a barrier of a group of 0.5 s that its peer
    left).  A group's timeout of minutes, common in training code, is not waited for."""
    for state in snap.ranks:
        call = state.blocked_call
        if call is None or snap.now - call.enter >= snap.grace + SETTLE:
            continue  # past any timeout shorter than the grace: not looked up on every look
        timeout = state.group_timeout(call.group)
        if timeout is None or timeout >= snap.grace:
            continue
        if snap.now - call.enter < timeout + SETTLE:
            return True
    return False


def _may_yet_answer(snap: Snapshot, verdict: Verdict) -> bool:
    """A rendezvous dialled at an address no host of the group has, entered less than the grace
    ago: it may still route back to a store here (:func:`pytest_ddp.diagnose.init_faults.
    init_fault`'s unserved), where a rendezvous completes in milliseconds."""
    finding = verdict.finding
    if not isinstance(finding, InitFault) or finding.check != "unserved":
        return False
    calls = [call for state in snap.ranks if state.rank in finding.blocked and (call := state.blocked_call)]
    return any(snap.now - call.enter < snap.grace for call in calls)


def _disconnected(snap: Snapshot) -> bool:
    """A rank's connections were broken on purpose (:func:`pytest_ddp.faults.disconnect`)."""
    return any(f.action == "disconnect" for s in snap.ranks for f in s.injected)


def _settle_time(snap: Snapshot, verdict: Verdict) -> float:
    """How long ranks still moving get: the settle time, or the grace where connections were cut on
    purpose (the cut rank may raise after its woken peers), a peer ended the group a rank waits in
    (it raises when Gloo sees the connection gone, which a loaded machine may take longer than the
    settle time to tell) or members on their way may break a tie."""
    if _disconnected(snap) or _ended_under(snap) or _tie_others_may_break(snap, verdict):
        return max(SETTLE, snap.grace)
    return SETTLE


def _ended_under(snap: Snapshot) -> bool:
    """A rank that finished ended (destroy_process_group) the group, or the world, that a rank
    still waits in a call of: that call raises next."""
    ended = [s for s in snap.ranks if s.finished and s.ends]
    return any(s.blocked_call is not None and any(e.ended(s.blocked_call.group) for e in ended)
               for s in snap.ranks if not s.finished)


def _tie_others_may_break(snap: Snapshot, verdict: Verdict) -> bool:
    """A tied mismatch while unnamed members of its groups run outside any call or in an earlier
    collective there: their calls, once they come, make a majority."""
    if verdict.kind != "mismatch" or verdict.waiting:
        return False
    finding = verdict.finding
    if isinstance(finding, Disagreement):
        calls = [finding.call]
    elif isinstance(finding, Cycle) and not finding.p2p:
        calls = [wait.call for wait in finding.waits.values()]
    else:
        return False
    everyone = [s.rank for s in snap.ranks]
    members = {r for c in calls for r in c.group_ranks or everyone} - set(verdict.culprits)
    for state in snap.ranks:
        if state.rank not in members or state.finished:
            continue
        now = state.current_call
        if now is None:
            return True
        if now.is_collective and any(now.group == c.group and now.seq < c.seq for c in calls):
            return True
    return False


def _moving(snap: Snapshot, verdict: Verdict) -> bool:
    """Some unfinished rank may still finish or block elsewhere, so the verdict would name more
    ranks: it runs outside any call; it is finishing a collective every member entered; a rank was
    cut on purpose (every rank in a call is about to raise); it is the center of the broken
    connections (it raises next); or it is in an MPI send, which may return with its message
    buffered; or a peer ended the group it waits in (it raises next)."""
    waits = verdict.finding.waits if isinstance(verdict.finding, (Departed, ExtraCall, Cycle)) else {}
    disconnected = _disconnected(snap)
    center = majority.broken_center({s.rank: s for s in snap.ranks})

    def may_move(state: RankState) -> bool:
        call = state.current_call
        return (
            call is None
            or (state.rank in waits and not waits[state.rank].peers)
            or disconnected
            or state.rank == center
            or mpi_matching.may_return_alone(call)
        )

    return _ended_under(snap) or any(not s.finished and may_move(s) for s in snap.ranks)


def _blocked(snap: Snapshot) -> bool:
    return any(state.blocked_call is not None for state in snap.ranks)


def judge(snap: Snapshot) -> Verdict:
    """What the controller should do now about this test."""
    ranks = {s.rank: s for s in snap.ranks}
    if all(s.finished for s in snap.ranks):
        return failed_ranks.done(ranks)
    waits = waits_of(ranks)
    timed_out = snap.now - snap.started >= snap.timeout
    verdict = (
        init_fault(ranks, snap.store)
        or (_blocked(snap) and new_group_members("deadlock", ranks))
        or inflight_mismatch(ranks)
        or p2p_mismatch("deadlock", ranks)
        or _no_such_peer(ranks, waits)
        or _deadlock(ranks, waits)
    )
    # Peers of a rank killed on purpose may still recover (their collective raises, at once or
    # at their own timeout); only the test's timeout makes the deadlock final.
    if verdict is not None and (timed_out or not failed_ranks.only_injected_deaths(verdict.culprits, ranks)):
        return verdict
    if timed_out:
        return _timeout(snap, ranks, waits)
    return failed_ranks.stopped(snap, ranks, waits) or Verdict("wait")


def _timeout(snap: Snapshot, ranks: dict[int, RankState], waits: dict[int, Wait]) -> Verdict:
    """Culprits: the running ranks that blocked ranks wait for, else every unfinished rank."""
    unfinished = [r for r in sorted(ranks) if not ranks[r].finished]
    blocked = [r for r in unfinished if ranks[r].blocked_call is not None]
    running = set(unfinished) - set(blocked)
    awaited = sorted({p for wait in waits.values() for p in wait.peers if p in running})
    culprits = awaited or unfinished
    described = sorted(set(culprits) & running) + blocked
    first = ranks[blocked[0]].blocked_call if blocked else None
    return Verdict(
        "timeout", "timeout", culprits, blocked,
        first.op if first else None, first.label if first else None,
        TimedOut(snap.timeout, described, waits),
    )

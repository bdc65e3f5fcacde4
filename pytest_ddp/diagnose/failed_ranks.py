"""The verdicts on ranks that failed: which ranks are faulty, the peers a death or a leaving woke,
the slow ranks a ``monitored_barrier`` names, the end of a failed rank's grace, and why a test that
every rank finished failed.  Pure (:mod:`pytest_ddp.diagnose.watchdog` asks it)."""

from __future__ import annotations

import re

from pytest_ddp.common.ops import DESTROY, MONITORED_BARRIER
from pytest_ddp.diagnose import majority, mpi_matching, rank_words
from pytest_ddp.diagnose.mismatches import aborted_on_sizes, finished_mismatch, p2p_mismatch
from pytest_ddp.diagnose.state import Call, RankState, Snapshot
from pytest_ddp.diagnose.verdicts import (
    Failures,
    GraceOver,
    LeftMidCall,
    NoneFinished,
    SlowRanks,
    Verdict,
    Wait,
)
from pytest_ddp.diagnose.waits import entered, group_members


def only_injected_deaths(culprits: list[int], ranks: dict[int, RankState]) -> bool:
    return bool(culprits) and all(ranks[r].died_as_injected for r in culprits)


def _faulty(state: RankState) -> bool:
    """A failed report, or a process that ended with an error or in an MPI_Abort."""
    if state.failed:
        return True
    if state.alive:
        return False
    return state.exit_code != 0 or mpi_matching.mpi_abort(state) is not None


# torch's message when a monitored_barrier times out: "Rank 1 failed to pass monitoredBarrier
# in 1000 ms", or with wait_all_ranks=True "Ranks 1, 2 failed to pass monitoredBarrier ...".
_SLOW_RANKS = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def _monitored_barrier_timeout(status: str, ranks: dict[int, RankState]) -> Verdict | None:
    """The ranks a raised monitored_barrier names as late are the culprits, not those that waited."""
    reporters: dict[int, Call] = {}
    slow: set[int] = set()
    for rank, state in sorted(ranks.items()):
        last = state.calls[-1] if state.calls else None
        if last is None or last.op != MONITORED_BARRIER:
            continue
        found = _SLOW_RANKS.search(last.error or "")
        if found is not None:
            reporters[rank] = last
            slow.update(int(r) for r in found.group(1).replace(",", " ").split())
    named = sorted(slow & set(ranks))
    if not named:
        return None
    call = reporters[min(reporters)]
    return Verdict(
        status, "timeout", named, sorted(reporters), call.op, call.label, SlowRanks(named, reporters)
    )


def stopped(snap: Snapshot, ranks: dict[int, RankState], waits: dict[int, Wait]) -> Verdict | None:
    """A rank failed, nothing is certain about the others, and the grace period is over."""
    culprits = [r for r in sorted(ranks) if _faulty(ranks[r])]
    waiting = [r for r in sorted(ranks) if not ranks[r].finished and r not in culprits]
    if not culprits or not waiting or only_injected_deaths(culprits, ranks):
        return None
    times = [ranks[r].failed_at or ranks[r].died_at for r in culprits]
    first_failure = min((t for t in times if t is not None), default=snap.now)
    if snap.now - first_failure < snap.grace:
        return None
    slow = _monitored_barrier_timeout("stopped", ranks)
    if slow is not None:
        return slow
    # Calls recorded on both sides that disagree are the cause, whichever rank's error came first
    # (Gloo's size check aborts one rank of a functional all_reduce; its peer goes on, async).
    mismatch = finished_mismatch("stopped", ranks) or aborted_on_sizes("stopped", ranks)
    if mismatch is not None:
        return mismatch
    unfinished = [r for r in sorted(ranks) if not ranks[r].finished]
    woken = _woken(culprits, ranks)
    culprits = [r for r in culprits if r not in woken]
    finding = GraceOver(culprits, snap.grace, unfinished, waits, woken)
    return Verdict("stopped", "rank_exited", culprits, sorted(waiting + woken), finding=finding)


def _woken(failed: list[int], ranks: dict[int, RankState]) -> list[int]:
    """The failed ranks whose last call raised while a rank had died, or that raised in a send or
    receive with the dead :func:`~pytest_ddp.diagnose.majority.broken_center`: woken by the death
    ("Connection closed by peer"), not at fault."""
    if all(ranks[r].alive for r in failed):
        return []
    center = majority.broken_center(ranks)  # a dead rank every send or receive that raised was with

    def woken(state: RankState) -> bool:
        if state.last_raised is not None:
            return True
        if center is None or ranks[center].alive:
            return False
        return any(c.is_p2p and c.state == "raised" and c.peer == center for c in state.calls)

    return [r for r in failed if ranks[r].alive and woken(ranks[r])]


def done(ranks: dict[int, RankState]) -> Verdict:
    """Every rank finished: passed, or why some failed."""
    failed = [r for r in sorted(ranks) if _faulty(ranks[r])]
    if not failed or only_injected_deaths(failed, ranks):  # the survivors passed, if any
        if all(state.finished_at is None for state in ranks.values()):  # every rank's process ended
            return Verdict("done", "rank_exited", sorted(ranks), finding=NoneFinished(sorted(ranks)))
        return Verdict("done")
    found = (
        finished_mismatch("done", ranks)
        or p2p_mismatch("done", ranks)
        or aborted_on_sizes("done", ranks)
        or _monitored_barrier_timeout("done", ranks)
        or _left_mid_call(failed, ranks)
        or _raised_then_left(failed, ranks)
    )
    if found is not None:
        return found
    dead = [r for r in failed if not ranks[r].alive]
    if not dead:
        return Verdict("done", "failed", failed, [], finding=Failures(failed))
    # Ranks whose last call raised were woken by the death ("Connection closed by peer"); the
    # ranks an MPI_Abort's launcher killed died of it.
    woken = [r for r in sorted(ranks) if r not in dead and ranks[r].last_raised is not None]
    aborted = [r for r in dead if mpi_matching.mpi_abort(ranks[r]) is not None]
    if aborted:
        woken = sorted(woken + [r for r in dead if r not in aborted])
        dead = aborted
    finding = Failures(dead, woken)
    died_in = [call for call in (ranks[r].died_in for r in dead) if call is not None]
    if died_in:
        shown = died_in[0]
    elif woken:
        shown = ranks[woken[0]].calls[-1]
    else:
        return Verdict("done", "rank_exited", dead, woken, finding=finding)
    return Verdict("done", "rank_exited", dead, woken, shown.op, shown.label, finding)


def _left_mid_call(failed: list[int], ranks: dict[int, RankState]) -> Verdict | None:
    """Every failed rank raised in a collective, past its argument checks, that members who passed
    never entered, and as many or more raised as left: those left without it and ended the group
    under it (with more leaving than raising, the few made a call more: their failure stands)."""
    woken: dict[int, Call] = {}
    left: set[int] = set()
    for r in failed:
        call = _raised_in_collective(ranks[r])
        if call is None:
            return None
        absent = [m for m in _absent(call, ranks) if not ranks[m].failed and ranks[m].finished]
        if not absent:
            return None
        woken[r] = call
        left.update(absent)
    if len(left) > len(woken):
        return None
    culprits = sorted(left)
    call = woken[min(woken)]
    ended = {r: ends[-1] for r in culprits if (ends := ranks[r].ends)}
    alike = sorted(woken) if len(left) == len(woken) and majority.as_before(ranks, woken) else []
    named = sorted(set(culprits) | set(alike))
    finding = LeftMidCall(culprits, call, woken, ended, alike)
    waiting = [r for r in sorted(woken) if r not in named]
    return Verdict("done", "partial", named, waiting, call.op, call.label, finding)


def _raised_then_left(failed: list[int], ranks: dict[int, RankState]) -> Verdict | None:
    """Some ranks failed by an error of their own, raised outside any call, and every other failed
    rank raised in a collective, past its argument checks, that one of them never entered, after
    that one left (failed, or ended the group): those were woken by the first leaving the group
    (torchtitan#1342: ``destroy_process_group()`` in a ``finally:`` after a trainer raised), as if
    it had died; the first are at fault.  An error of their own that reads as a timeout or a
    connection's may itself be what a peer's call more caused: no verdict then."""
    raised = {r: _raised_last_on_its_group(ranks[r]) for r in failed}
    own = [r for r in failed if ranks[r].alive and raised[r] is None]
    for r in own:
        error = rank_words.failed_outside_calls(ranks[r])
        if error is not None and _CAUSED.search(error[0]):
            return None
    woken: dict[int, Call] = {}
    for r in (r for r in failed if r not in own):
        call = _raised_in_collective(ranks[r])
        if call is None:
            return None
        left = [m for m in _absent(call, ranks) if m in own]
        if not any(call.exit is not None and call.exit >= _left_at(ranks[m], call) for m in left):
            return None
        woken[r] = call
    if not own or not woken:
        return None
    call, peers = woken[min(woken)], sorted(woken)
    return Verdict("done", "rank_exited", own, peers, call.op, call.label, Failures(own, peers))


# An error that a peer's hang may have caused: a wait that timed out, a connection that broke.
_CAUSED = re.compile(r"(?i)timed? ?out|connection|broken pipe")


def _left_at(state: RankState, call: Call) -> float:
    """When a rank that failed outside any call left the call's group: its end of the group, else
    its failure."""
    ended = [c.enter for c in state.ends if c.group == call.group]
    return min(ended) if ended else state.failed_at or 0.0


def _raised_in_collective(state: RankState) -> Call | None:
    """The live rank's last call on its group (:func:`_raised_last_on_its_group`), where it is a
    collective that raised past its argument checks: the backend had it, so a peer's leaving may
    have raised it."""
    call = _raised_last_on_its_group(state) if state.alive else None
    if call is None or not call.is_collective or call.before_backend:
        return None
    return call


def _absent(call: Call, ranks: dict[int, RankState]) -> list[int]:
    """The members of the call's group that never entered its collective."""
    there = entered(call, ranks)
    return [m for m in group_members(call, ranks) or [] if m not in there]


def _raised_last_on_its_group(state: RankState) -> Call | None:
    """The rank's last call that raised, where it made no later call on that call's group but its
    end (a test harness's exchanges after the test are on a group of their own: torch's
    MultiProcessTestCase; a ``finally:`` may destroy the group the call raised in)."""
    for position in range(len(state.calls) - 1, -1, -1):
        call = state.calls[position]
        if call.state == "raised":
            later = state.calls[position + 1:]
            return None if any(c.group == call.group and c.op != DESTROY for c in later) else call
    return None

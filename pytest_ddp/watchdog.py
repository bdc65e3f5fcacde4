"""The watchdog: from a snapshot of every rank to a verdict.  Pure: no processes, no I/O.

The question it answers, every few milliseconds while a test runs: can any
rank still make progress?  A rank blocked in a collective waits for the
members of its group that have not entered the same collective (same group,
same sequence number); a rank blocked in ``recv`` waits for its sender.  A
waited-for rank that has left the test (finished it, or died) will never come;
a waited-for rank that is itself blocked comes only if *it* can progress.  The
ranks that cannot progress whatever happens form the *doomed* set, found as a
greatest fixpoint; if it is not empty, the deadlock is certain and the
verdict says who is at fault.

Kinds of verdict (``Verdict.kind``):

``rank_exited``  a rank raised or died while others wait for it
``partial``      a rank finished its test normally without calling the
                 collective its peers wait in (only some ranks call it)
``mismatch``     ranks entered the same collective with different op, shape,
                 dtype or root, or wait for each other in different collectives
``p2p_cycle``    point-to-point calls wait for each other in a cycle
``init``         ``init_process_group`` cannot complete (duplicate rank, rank
                 out of range, a rank that never arrives, world sizes differ)
``timeout``      the test ran out of time without a certain deadlock
``failed``       every rank finished, some raised, no distributed fault seen
"""

from __future__ import annotations

import signal
from collections import Counter
from dataclasses import dataclass, field

from .state import Call, RankState, Snapshot

INIT_OP = "init_process_group"
# Bytes per element, to tell mismatches that cannot complete (different sizes on
# the wire) from those Gloo lets through (a [2, 5] tensor against a [10] one).
ELEMENT_SIZES = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "float32": 4, "int64": 8, "float64": 8, "complex64": 8, "complex128": 16,
}


@dataclass
class Verdict:
    status: str  # "wait" | "done" | "deadlock" | "stopped" | "timeout"
    kind: str | None = None
    culprits: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    collective: str | None = None  # op name of the call at fault
    call: str | None = None  # its label, e.g. "all_reduce #3"
    summary: str = ""


# -- phrases shared with the report -------------------------------------------


def rank_list(ranks: list[int]) -> str:
    """``rank 2``, ``ranks 0, 3``, ``ranks 1-3``."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def describe_call(call: Call) -> str:
    """``all_reduce #3 (test_x.py:12)``."""
    return f"{call.label} ({call.site})"


def _verb(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def exit_description(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _short_error(state: RankState) -> str:
    """What went wrong on a rank, in one line."""
    raised = [c for c in state.calls if c.state == "raised"]
    if raised:
        return f"raised {raised[-1].error} in {describe_call(raised[-1])}"
    for when in ("setup", "call", "teardown"):
        report = state.reports.get(when)
        if report is not None and report["outcome"] == "failed":
            message = _report_message(report.get("data"))
            return f"raised {message}" if message else f"failed in {when}"
    if not state.alive:
        return f"died ({exit_description(state.exit_code)})"
    return "failed"


def _report_message(data: object) -> str | None:
    """The exception line of a serialized pytest report, or of a run() result."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("exception"), str):
        return data["exception"]
    longrepr = data.get("longrepr")
    if isinstance(longrepr, dict):
        crash = (longrepr.get("reprcrash") or {}).get("message")
        if crash:
            return crash.splitlines()[0]
    return None


def _left_how(state: RankState) -> str:
    """How a rank that others wait for left the test."""
    if not state.alive:
        return f"died ({exit_description(state.exit_code)})"
    if state.failed:
        return _short_error(state)
    return "returned from its test"


# -- waiting ------------------------------------------------------------------


def _is_recv(call: Call) -> bool:
    return "recv" in call.op


def _p2p_index(calls: list[Call], call: Call) -> int:
    """Which of this rank's sends (or recvs) to/from that peer on that group ``call`` is."""
    return sum(
        1
        for c in calls[: call.index + 1]
        if c.is_p2p and c.group == call.group and c.peer == call.peer and _is_recv(c) == _is_recv(call)
    )


def _matching_p2p_entered(peer: RankState, me: int, call: Call, index: int) -> bool:
    """Has ``peer`` entered the send (recv) that pairs with my ``index``-th recv (send)?
    A recv from any source (peer None) pairs with a send from anyone."""
    count = sum(
        1
        for c in peer.calls
        if c.is_p2p and c.group == call.group and c.peer in (me, None) and _is_recv(c) != _is_recv(call)
    )
    return count >= index


def _wire_size(call: Call) -> tuple[object, ...]:
    """What goes over the wire per tensor: bytes where the dtype is known, else shape and dtype."""
    sizes: list[object] = []
    for shape, dtype in zip(call.shapes, call.dtypes):
        numel = 1
        for dim in shape:
            numel *= dim
        sizes.append(numel * ELEMENT_SIZES[dtype] if dtype in ELEMENT_SIZES else (tuple(shape), dtype))
    return tuple(sizes)


def _cannot_complete(mine: Call, theirs: Call) -> bool:
    """Two ranks in the same collective that can never complete it together."""
    return (mine.op, mine.root, _wire_size(mine)) != (theirs.op, theirs.root, _wire_size(theirs))


def _collective_call(state: RankState, group: str, seq: int) -> Call | None:
    for c in state.calls:
        if c.is_collective and c.group == group and c.seq == seq:
            return c
    return None


@dataclass
class _Wait:
    """What one blocked rank waits for."""

    rank: int
    call: Call
    peers: list[int]  # ranks that have not arrived yet
    any_of: bool = False  # True: one of ``peers`` suffices (recv from any source)


def _waits(ranks: dict[int, RankState]) -> tuple[dict[int, _Wait], list[tuple[int, int, Call, Call]]]:
    """Each blocked rank's wait, and the mismatches seen (rank, peer, my call, its call)."""
    waits: dict[int, _Wait] = {}
    mismatches: list[tuple[int, int, Call, Call]] = []
    for rank, state in ranks.items():
        call = state.current_call
        if call is None or call.op == INIT_OP:
            continue
        members = [m for m in (call.group_ranks or tuple(ranks)) if m != rank and m in ranks]
        if call.is_collective:
            missing = []
            for member in members:
                theirs = _collective_call(ranks[member], call.group, call.seq)
                # A call that raised (an unpicklable object, say) never took part.
                if theirs is None or theirs.state == "raised":
                    missing.append(member)
                elif _cannot_complete(call, theirs):
                    mismatches.append((rank, member, call, theirs))
                # Same size on the wire but another shape or dtype: Gloo completes it;
                # compare_sequences reports it after the test.
            waits[rank] = _Wait(rank, call, missing)
        elif call.is_p2p and call.peer is not None:
            index = _p2p_index(state.calls, call)
            peer = ranks.get(call.peer)
            arrived = peer is None or _matching_p2p_entered(peer, rank, call, index)
            waits[rank] = _Wait(rank, call, [] if arrived else [call.peer])
        elif call.is_p2p:
            # From any source: satisfied as soon as any member has entered a send to us.
            senders = [m for m in members if any(c.is_p2p and not _is_recv(c) and c.peer == rank for c in ranks[m].calls)]
            waits[rank] = _Wait(rank, call, [] if senders else members, any_of=True)
    return waits, mismatches


def _doomed(ranks: dict[int, RankState], waits: dict[int, _Wait]) -> set[int]:
    """Blocked ranks that cannot progress whatever the running ranks do (greatest fixpoint)."""
    doomed = {rank for rank, wait in waits.items() if wait.peers}

    def stuck(peer: int) -> bool:
        return ranks[peer].finished or peer in doomed

    changed = True
    while changed:
        changed = False
        for rank in sorted(doomed):
            wait = waits[rank]
            # A collective needs every missing peer; a recv from any source needs one.
            can_come = [not stuck(p) for p in wait.peers]
            if any(can_come) if wait.any_of else all(can_come):
                doomed.discard(rank)
                changed = True
    return doomed


def _deadlock(snap: Snapshot) -> Verdict | None:
    ranks = {s.rank: s for s in snap.ranks}
    verdict = _init_fault(ranks)
    if verdict is not None:
        return verdict
    waits, mismatches = _waits(ranks)
    if mismatches:
        return _mismatch_verdict(ranks, mismatches)
    doomed = _doomed(ranks, waits)
    if not doomed:
        return None
    gone = sorted({p for r in doomed for p in waits[r].peers if ranks[p].finished})
    waiting = sorted(doomed)
    first = waits[waiting[0]].call
    if gone:
        kind = "rank_exited" if any(not ranks[g].alive or ranks[g].failed for g in gone) else "partial"
        causes = "; ".join(f"{rank_list([g])} {_left_how(ranks[g])}" for g in gone)
        if kind == "partial":
            missing = f"the {'send' if _is_recv(first) else 'recv'} that {first.label} needs" if first.is_p2p else first.label
            causes = f"{rank_list(gone)} returned from {'its' if len(gone) == 1 else 'their'} test without calling {missing}"
        summary = f"{causes}; {rank_list(waiting)} {_verb(waiting)} in {describe_call(first)} for {'it' if len(gone) == 1 else 'them'}."
        return Verdict("deadlock", kind, gone, waiting, first.op, first.label, summary)
    p2p = any(waits[r].call.is_p2p for r in doomed)
    parts = [f"rank {r} waits in {describe_call(waits[r].call)}" for r in waiting]
    ending = "a point-to-point cycle" if p2p else "the ranks disagree on the order of collectives"
    summary = " and ".join(parts) + f": {ending}."
    return Verdict("deadlock", "p2p_cycle" if p2p else "mismatch", waiting, [], first.op, first.label, summary)


def _signature_text(call: Call) -> str:
    shapes = [list(s) for s in call.shapes]
    text = f"{call.op} shapes {shapes} {','.join(sorted(set(call.dtypes)))}".rstrip()
    if call.root is not None:
        text += f" root {call.root}"
    return text


def _mismatch_verdict(ranks: dict[int, RankState], mismatches: list[tuple[int, int, Call, Call]]) -> Verdict:
    rank, _, call, _ = mismatches[0]
    entered = {
        r: c
        for r in ranks
        if (c := _collective_call(ranks[r], call.group, call.seq)) is not None and r in (call.group_ranks or ranks)
    }
    culprits, majority = _minority(entered)
    details = ", ".join(f"rank {r} {_signature_text(c)}" for r, c in sorted(entered.items()))
    summary = f"{rank_list(sorted(entered))} disagree on collective #{call.seq} of group {call.group}: {details}."
    return Verdict("deadlock", "mismatch", culprits, majority, call.op, call.label, summary)


def _minority(entered: dict[int, Call]) -> tuple[list[int], list[int]]:
    """(culprits, the rest): ranks whose call differs from the most common one; on a tie,
    the signature of the lowest rank counts as the expected one."""
    counts = Counter(c.signature() for c in entered.values())
    lowest = entered[min(entered)].signature()
    best = max(counts.values())
    expected = lowest if counts[lowest] == best else next(s for s, n in counts.items() if n == best)
    culprits = sorted(r for r, c in entered.items() if c.signature() != expected)
    return culprits, sorted(r for r in entered if r not in culprits)


# -- init ---------------------------------------------------------------------


def _init_fault(ranks: dict[int, RankState]) -> Verdict | None:
    """Certain faults of init_process_group in tests that call it themselves."""
    inits = {r: c for r, s in ranks.items() for c in s.calls if c.op == INIT_OP}
    blocked = sorted(r for r, c in inits.items() if c.state == "running" and ranks[r].alive)
    if not blocked:
        return None
    site = describe_call(inits[blocked[0]])

    def verdict(culprits: list[int], reason: str) -> Verdict:
        waiting = [r for r in blocked if r not in culprits]
        who = f"{rank_list(waiting)} {_verb(waiting)}" if waiting else "the others wait"
        return Verdict("deadlock", "init", sorted(culprits), waiting, INIT_OP, INIT_OP, f"{reason}; {who} in {site}.")

    by_rank: dict[object, list[int]] = {}
    for r, c in sorted(inits.items(), key=lambda item: item[1].enter):
        by_rank.setdefault(c.extra.get("rank"), []).append(r)
    for given, slots in by_rank.items():
        if given is not None and len(slots) > 1:
            # Which of them got in first is a race: all of them are at fault.
            slots = sorted(slots)
            return verdict(slots, f"processes {', '.join(map(str, slots))} all called init_process_group with rank {given}")
    sizes = {r: c.extra.get("world_size") for r, c in inits.items() if c.extra.get("world_size") is not None}
    if len(set(sizes.values())) > 1:
        counts = Counter(sizes.values())
        common = counts.most_common(1)[0][0]
        odd = sorted(r for r, n in sizes.items() if n != common)
        return verdict(odd, f"world sizes differ: {', '.join(f'process {r} says {n}' for r, n in sorted(sizes.items()))}")
    for r, c in inits.items():
        given, size = c.extra.get("rank"), c.extra.get("world_size")
        if isinstance(given, int) and isinstance(size, int) and not 0 <= given < size:
            return verdict([r], f"process {r} called init_process_group with rank {given}, out of range for world size {size}")
    raised = sorted(r for r, c in inits.items() if c.state == "raised")
    if raised:
        return verdict(raised, "; ".join(f"process {r} raised {inits[r].error} in init_process_group" for r in raised))
    never = sorted(r for r, s in ranks.items() if r not in inits and s.finished)
    if never:
        how = "; ".join(f"process {r} {_left_how(ranks[r])} without calling init_process_group" for r in never)
        return verdict(never, how)
    return None


# -- the verdict --------------------------------------------------------------


def judge(snap: Snapshot) -> Verdict:
    """What the controller should do now about this test."""
    if all(s.finished for s in snap.ranks):
        return _done(snap)
    deadlock = _deadlock(snap)
    if deadlock is not None:
        return deadlock
    if snap.now - snap.started >= snap.timeout:
        return _timeout(snap)
    failed_at = [s.failed_at for s in snap.ranks if s.failed_at is not None]
    if failed_at and snap.now - min(failed_at) >= snap.grace:
        culprits = [s.rank for s in snap.ranks if s.failed]
        others = [s.rank for s in snap.ranks if not s.finished]
        causes = "; ".join(f"rank {s.rank} {_left_how(s)}" for s in snap.ranks if s.failed)
        summary = f"{causes}; {rank_list(others)} still busy {snap.grace:g} s later."
        return Verdict("stopped", "rank_exited", culprits, others, summary=summary)
    return Verdict("wait")


def _timeout(snap: Snapshot) -> Verdict:
    """Out of time: the running ranks others wait for are the culprits (else every running
    rank, else every blocked one)."""
    ranks = {s.rank: s for s in snap.ranks}
    waits, _ = _waits(ranks)
    blocked = sorted(s.rank for s in snap.ranks if s.current_call is not None)
    running = sorted(s.rank for s in snap.ranks if not s.finished and s.current_call is None)
    waited_for = sorted({p for w in waits.values() for p in w.peers if p in running})
    culprits = waited_for or running or blocked
    parts = []
    if running:
        parts.append(f"{rank_list(running)} {'is' if len(running) == 1 else 'are'} running outside any collective")
    parts += [f"rank {r} waits in {describe_call(ranks[r].current_call)}" for r in blocked]  # type: ignore[arg-type]
    first = ranks[blocked[0]].current_call if blocked else None
    return Verdict(
        "timeout", "timeout", culprits, [r for r in blocked if r not in culprits],
        first.op if first else None, first.label if first else None,
        f"timed out after {snap.timeout:g} s: " + "; ".join(parts) + ".",
    )


def _done(snap: Snapshot) -> Verdict:
    failed = [s for s in snap.ranks if s.failed or (not s.alive and s.exit_code != 0)]
    if not failed:
        return Verdict("done")
    ranks = {s.rank: s for s in snap.ranks}
    mismatch = _finished_mismatch(ranks)
    if mismatch is not None:
        return mismatch
    dead = [s for s in snap.ranks if not s.alive and s.exit_code != 0]
    if dead:
        culprits = [s.rank for s in dead]
        waiting = [s.rank for s in snap.ranks if s.alive and s.calls and s.calls[-1].state == "raised"]
        causes = "; ".join(f"rank {s.rank} died ({exit_description(s.exit_code)})" + (f" in {describe_call(s.calls[-1])}" if s.calls and s.calls[-1].state == "running" else "") for s in dead)
        after = f"; {rank_list(waiting)} then failed in {describe_call(ranks[waiting[0]].calls[-1])}" if waiting else ""
        first = dead[0].calls[-1] if dead[0].calls else None
        return Verdict(
            "done", "rank_exited", culprits, waiting, first.op if first else None, first.label if first else None,
            causes + after + ".",
        )
    summary = "; ".join(f"rank {s.rank} {_short_error(s)}" for s in failed) + "."
    return Verdict("done", "failed", [s.rank for s in failed], [], summary=summary)


def _finished_mismatch(ranks: dict[int, RankState]) -> Verdict | None:
    """Ranks that entered the same collective with different signatures, whatever became of them."""
    for state in ranks.values():
        for call in state.calls:
            if not call.is_collective:
                continue
            for member in call.group_ranks or tuple(ranks):
                if member == state.rank or member not in ranks:
                    continue
                theirs = _collective_call(ranks[member], call.group, call.seq)
                if theirs is not None and theirs.signature() != call.signature():
                    verdict = _mismatch_verdict(ranks, [(state.rank, member, call, theirs)])
                    verdict.status = "done"
                    return verdict
    return None


def compare_sequences(ranks: list[RankState]) -> list[str]:
    """After a passing test: how the ranks' collective sequences differ per group ([] if not)."""
    differences = []
    by_group: dict[str, dict[int, list[Call]]] = {}
    members: dict[str, tuple[int, ...]] = {}
    for state in ranks:
        for call in state.calls:
            if call.is_collective:
                by_group.setdefault(call.group, {}).setdefault(state.rank, []).append(call)
                members.setdefault(call.group, call.group_ranks)
    for group, per_rank in by_group.items():
        group_ranks = [s.rank for s in ranks if not members[group] or s.rank in members[group]]
        sequences = {r: per_rank.get(r, []) for r in group_ranks}
        counts = {r: len(calls) for r, calls in sequences.items()}
        if len(set(counts.values())) > 1:
            differences.append(
                f"group {group}: "
                + ", ".join(f"rank {r} made {n} collective{'' if n == 1 else 's'}" for r, n in counts.items())
            )
        reference = group_ranks[0]
        for position in range(min(counts.values())):
            expected = sequences[reference][position]
            for r in group_ranks[1:]:
                theirs = sequences[r][position]
                if theirs.signature() != expected.signature():
                    differences.append(
                        f"group {group}, collective #{position + 1}: rank {reference} {_signature_text(expected)} "
                        f"({expected.site}) vs rank {r} {_signature_text(theirs)} ({theirs.site})"
                    )
    return differences

"""The watchdog: from a snapshot of every rank to a verdict.  Pure: no processes, no I/O.

The question it answers, many times a second while a test runs: can any rank
still make progress?  A rank blocked in a collective needs the members of its
group that have not entered the same collective (same group, same sequence
number); a rank blocked in ``recv`` needs its sender, and a blocked ``send``
its receiver.  A needed rank that has left the test (finished it, or died)
will never come; a needed rank that is itself blocked comes only if *it* can
progress.  The blocked ranks that cannot progress whatever the running ranks
do form the *doomed* set, found as a greatest fixpoint; if it is not empty,
the deadlock is certain and the verdict says who is at fault.  Ranks that
entered the same collective in ways that can never complete together (another
op or root, another number of bytes) are a certain mismatch at once; a [2, 5]
tensor against a [10] one completes on Gloo, and is left to
:func:`compare_sequences` after the test.

Kinds of verdict (``Verdict.kind``):

``rank_exited``  a rank raised or died while others wait for it
``partial``      a rank finished its test normally without calling the
                 collective its peers wait in (only some ranks call it)
``mismatch``     ranks entered the same collective with a different op, size
                 or root, or wait for each other in different collectives
``p2p_cycle``    point-to-point calls wait for each other in a cycle
``init``         ``init_process_group`` cannot complete (duplicate rank, rank
                 out of range, world sizes differ, a process never arrives)
``timeout``      the test ran out of time without a certain deadlock
``failed``       every rank finished, some failed, no distributed fault seen
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from .ops import INIT
from .state import Call, RankState, Snapshot, exit_text

# Bytes per element, to tell mismatches that cannot complete (different sizes on
# the wire) from those Gloo lets through (a [2, 5] tensor against a [10] one).
ELEMENT_SIZES = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "float32": 4, "int64": 8, "float64": 8, "complex64": 8, "complex128": 16,
}


@dataclass
class Verdict:
    """What the controller should do about a test now, and why."""

    status: str  # "wait" | "done" | "deadlock" | "stopped" | "timeout"
    kind: str | None = None  # see the module docstring; None for "wait" and for a "done" with no failure
    culprits: list[int] = field(default_factory=list)  # ranks at fault
    waiting: list[int] = field(default_factory=list)  # ranks stuck waiting for them
    collective: str | None = None  # op of the call at fault: "all_reduce"
    call: str | None = None  # its label: "all_reduce #3"
    summary: str = ""  # one or two sentences a human can act on


# -- phrases, shared with the report -------------------------------------------


def rank_list(ranks: Iterable[int], noun: str = "rank") -> str:
    """``rank 2``, ``ranks 0, 3``, ``ranks 0-3, 6``; ``processes 1, 2`` with ``noun="process"``."""
    ordered = sorted(set(ranks))
    plural = noun + ("es" if noun.endswith("s") else "s")
    if len(ordered) == 1:
        return f"{noun} {ordered[0]}"
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    # Runs of three or more read better as a range; "0, 1" stays as it is.
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return f"{plural} {', '.join(parts)}" if parts else f"no {plural}"


def describe_call(call: Call) -> str:
    """``all_reduce #3 (test_x.py:12)``; group set-up calls are not numbered: ``init_process_group (t.py:4)``."""
    return f"{_call_name(call)} ({call.site})"


def _call_name(call: Call) -> str:
    return call.label if call.seq else call.op


def _verb(ranks: Iterable[int], one: str, many: str) -> str:
    return one if len(set(ranks)) == 1 else many


def _short_error(state: RankState) -> str:
    """A failed rank's error in one line: from its last call if that raised, else from its
    failed report, else ``failed``.  (A call that raised and was followed by others was handled.)"""
    if state.calls and state.calls[-1].state == "raised":
        return state.calls[-1].error or "error"
    for report in state.reports.values():
        if report.get("outcome") == "failed":
            message = _report_message(report.get("data"))
            if message:
                return message
    return "failed"


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
            # A plain-text longrepr ends with its error; a message starts with it.
            return (lines[-1] if text is longrepr else lines[0]).strip()
    return None


def _how_it_failed(state: RankState) -> str:
    """``died (killed by SIGABRT) in all_reduce #1 (t.py:3)``, ``raised TypeError: ... in
    all_gather_object #2 (t.py:9)``, ``failed (ValueError: boom)``, ``returned from its test``."""
    last = state.calls[-1] if state.calls else None
    if not state.alive:
        inside = f" in {describe_call(last)}" if last is not None and last.state == "running" else ""
        return f"died ({exit_text(state.exit_code)}){inside}"
    if last is not None and last.state == "raised":
        return f"raised {_short_error(state)} in {describe_call(last)}"
    if state.failed:
        error = _short_error(state)
        return "failed" if error == "failed" else f"failed ({error})"
    return "returned from its test"


def _signature_text(call: Call) -> str:
    """``all_reduce shapes [[10]] float32``, ``broadcast shapes [[3]] float32 root 0``."""
    parts = [call.op]
    if call.shapes:
        parts.append(f"shapes {[list(s) for s in call.shapes]}")
    if call.dtypes:
        parts.append(",".join(sorted(set(call.dtypes))))
    if call.root is not None:
        parts.append(f"root {call.root}")
    return " ".join(parts)


K = TypeVar("K", bound=Hashable)


def _grouped(ranks: Iterable[int], key: Callable[[int], K]) -> list[tuple[K, list[int]]]:
    """Ranks with the same key together, groups in the order of their lowest rank."""
    groups: dict[K, list[int]] = {}
    for r in sorted(ranks):
        groups.setdefault(key(r), []).append(r)
    return list(groups.items())


def _joined(clauses: list[str]) -> str:
    return " and ".join(clauses) if len(clauses) == 2 else "; ".join(clauses)


# -- what the ranks have entered ----------------------------------------------


def _blocked_in(state: RankState) -> Call | None:
    """The call a rank is blocked in; none once it is out of the test, whatever its log says."""
    return None if state.finished else state.current_call


def _took_part(state: RankState, call: Call) -> bool:
    """A call that raised never took part (an unpicklable object raises before any
    communication), and one whose process died inside it will never do its part."""
    return call.state == "ok" or (call.state == "running" and state.alive)


def _collective_at(state: RankState, group: str, seq: int) -> Call | None:
    """The collective number ``seq`` on ``group`` of this rank, if it has entered it.

    Scans back from the latest call: ranks are usually close together, and sequence
    numbers only grow along a rank's calls, so an older number ends the search."""
    for call in reversed(state.calls):
        if call.is_collective and call.group == group:
            if call.seq == seq:
                return call
            if call.seq < seq:
                return None
    return None


def _p2p_count(state: RankState, group: str, recv: bool, peer: int | None) -> int:
    """How many receives from (sends to) ``peer`` on ``group`` this rank has entered: the
    number of the latest, as the recorder numbers them per (group, direction, peer)."""
    for call in reversed(state.calls):
        if call.is_p2p and call.group == group and call.is_recv == recv and call.peer == peer:
            return call.seq
    return 0


def _members(rank: int, call: Call, ranks: dict[int, RankState]) -> list[int] | None:
    """The other ranks of the call's group; None when the group's members are unknown."""
    if call.group_ranks:
        listed: Iterable[int] = call.group_ranks
    elif call.group == "WORLD":
        listed = ranks
    else:
        return None
    return [m for m in listed if m != rank and m in ranks]


# -- who waits for whom -------------------------------------------------------


@dataclass
class _Wait:
    """What a blocked rank needs before its call can complete."""

    call: Call
    peers: list[int]  # ranks it still needs; empty: all arrived, the call is just in progress
    any_of: bool = False  # one of ``peers`` suffices (a receive from any source)


def _waits(ranks: dict[int, RankState]) -> dict[int, _Wait]:
    """Each blocked rank's wait; blocked ranks about which nothing is certain are left out."""
    waits = {}
    for rank, state in ranks.items():
        call = _blocked_in(state)
        if call is None:
            continue
        if call.op == INIT:
            wait = _init_wait(rank, call, ranks)
        elif call.is_p2p:
            wait = _p2p_wait(rank, call, ranks)
        elif call.is_collective:
            wait = _collective_wait(rank, call, ranks)
        else:  # new_group, destroy_process_group, batch_isend_irecv
            wait = None
        if wait is not None:
            waits[rank] = wait
    return waits


def _collective_wait(rank: int, call: Call, ranks: dict[int, RankState]) -> _Wait | None:
    members = _members(rank, call, ranks)
    if members is None:
        return None
    missing = []
    for member in members:
        theirs = _collective_at(ranks[member], call.group, call.seq)
        if theirs is None or not _took_part(ranks[member], theirs):
            missing.append(member)
    return _Wait(call, missing)


def _p2p_wait(rank: int, call: Call, ranks: dict[int, RankState]) -> _Wait | None:
    """My k-th receive from P pairs with P's k-th send to me, and the other way round."""
    if call.peer is None:
        return _any_source_wait(rank, call, ranks)
    peer = ranks.get(call.peer)
    if peer is None or call.peer == rank:
        return None
    if call.is_recv:
        entered = _p2p_count(peer, call.group, recv=False, peer=rank)
    else:  # the peer's receives from any source may take my send too
        entered = _p2p_count(peer, call.group, True, rank) + _p2p_count(peer, call.group, True, None)
    return _Wait(call, [] if entered >= call.seq else [call.peer])


def _any_source_wait(rank: int, call: Call, ranks: dict[int, RankState]) -> _Wait | None:
    """A receive from any source is stuck only if no member can still send: OR semantics."""
    members = _members(rank, call, ranks)
    mine = [c for c in ranks[rank].calls if c.is_p2p and c.group == call.group and c.is_recv]
    # An earlier irecv may still be unmatched, so a send cannot be told to be this one's.
    if members is None or any(c.is_async for c in mine):
        return None
    sent = sum(_p2p_count(ranks[m], call.group, recv=False, peer=rank) for m in members)
    return _Wait(call, [] if sent >= len(mine) else members, any_of=True)


def _init_wait(rank: int, call: Call, ranks: dict[int, RankState]) -> _Wait:
    """init_process_group needs every process to have entered init as often as this one."""
    count = sum(1 for c in ranks[rank].calls if c.op == INIT)

    def joined(state: RankState) -> bool:
        inits = [c for c in state.calls if c.op == INIT]
        return len(inits) >= count and _took_part(state, inits[count - 1])

    return _Wait(call, [m for m, state in ranks.items() if m != rank and not joined(state)])


def _doomed(ranks: dict[int, RankState], waits: dict[int, _Wait]) -> set[int]:
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
            stuck = [hopeless(p) for p in wait.peers]
            # A collective needs all its missing members: one that never comes is enough.
            if not (all(stuck) if wait.any_of else any(stuck)):
                doomed.discard(rank)
                changed = True
    return doomed


def _reaches(start: int, target: int, edges: dict[int, list[int]]) -> bool:
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


def _wait_clauses(
    described: list[int], ranks: dict[int, RankState], waits: dict[int, _Wait], needs: dict[int, list[int]]
) -> str:
    """``ranks 0, 1 wait in all_reduce #1 (t.py:3) for rank 2``, grouped by call and needed ranks."""

    def key(r: int) -> tuple[str, tuple[int, ...], bool]:
        call = _blocked_in(ranks[r])
        assert call is not None
        wait = waits.get(r)
        named = call.is_p2p and call.peer is not None  # the label already names the peer
        return describe_call(call), () if named else tuple(needs.get(r, [])), bool(wait and wait.any_of)

    clauses = []
    for (where, needed, any_of), group in _grouped(described, key):
        clause = f"{rank_list(group)} {_verb(group, 'waits', 'wait')} in {where}"
        if needed:
            clause += f" for {'any of ' if any_of and len(needed) > 1 else ''}{rank_list(needed)}"
        clauses.append(clause)
    return _joined(clauses)


# -- certain deadlocks --------------------------------------------------------


def _deadlock(ranks: dict[int, RankState], waits: dict[int, _Wait]) -> Verdict | None:
    doomed = _doomed(ranks, waits)
    if not doomed:
        return None
    return _gone_verdict(ranks, waits, doomed) or _cycle_verdict(ranks, waits, doomed)


def _gone_verdict(ranks: dict[int, RankState], waits: dict[int, _Wait], doomed: set[int]) -> Verdict | None:
    """Doomed ranks wait for ranks that left the test: rank_exited or partial."""
    needs = {r: [p for p in waits[r].peers if ranks[p].finished or p in doomed] for r in doomed}
    left = {r: [p for p in needs[r] if ranks[p].finished] for r in doomed}
    gone = sorted({p for peers in left.values() for p in peers})
    if not gone:
        return None
    victims = _victims(gone, ranks, waits, left)
    culprits = [g for g in gone if g not in victims] or gone
    kind = "rank_exited" if any(not ranks[g].alive or ranks[g].failed for g in culprits) else "partial"

    def waited_by(g: int) -> tuple[int, Call]:
        waiter = min(r for r in doomed if g in left[r])
        return waiter, waits[waiter].call

    def reason(g: int, plural: bool = False) -> str:
        return _left_reason(ranks[g], *waited_by(g), plural)

    causes = [f"{rank_list(group)} {reason(group[0], len(group) > 1)}" for _, group in _grouped(culprits, reason)]
    causes += [f"rank {v} {reason(v)}" for v in sorted(victims)]
    first = waits[min(r for r in doomed if left[r])].call
    summary = "; ".join(causes) + "; " + _wait_clauses(sorted(doomed), ranks, waits, needs) + "."
    return Verdict("deadlock", kind, culprits, sorted(doomed), first.op, _call_name(first), summary)


def _victims(
    gone: list[int], ranks: dict[int, RankState], waits: dict[int, _Wait], left: dict[int, list[int]]
) -> set[int]:
    """Gone ranks that raised inside the very collective others wait in, while another gone rank
    died outside it: the death broke the collective for them (Gloo: "Connection closed by peer")."""
    raised_inside = set()
    for rank, peers in left.items():
        call = waits[rank].call
        for g in peers:
            theirs = _collective_at(ranks[g], call.group, call.seq) if call.is_collective else None
            if theirs is not None and theirs.state == "raised":
                raised_inside.add(g)
    deaths = [g for g in gone if not ranks[g].alive and g not in raised_inside]
    return raised_inside if deaths else set()


def _left_reason(state: RankState, waiter: int, waited: Call, plural: bool) -> str:
    """How a rank others wait for left the test: what it did, or what it never did."""
    if not state.alive or state.failed:
        return _how_it_failed(state)
    test = "their test" if plural else "its test"
    if waited.is_p2p:
        exchange = "sending to" if waited.is_recv else "receiving from"
        return f"returned from {test} without {exchange} rank {waiter}"
    return f"returned from {test} without calling {_call_name(waited)}"


def _cycle_verdict(ranks: dict[int, RankState], waits: dict[int, _Wait], doomed: set[int]) -> Verdict:
    """Blocked ranks wait for each other: every doomed rank needs another doomed one, so there is
    a cycle.  The ranks on it are the culprits; the others wait behind it."""
    needs = {r: [p for p in waits[r].peers if p in doomed] for r in doomed}
    culprits = sorted(r for r in doomed if _reaches(r, r, needs))
    waiting = sorted(doomed - set(culprits))
    p2p = any(waits[r].call.is_p2p for r in culprits)
    ending = "a point-to-point cycle" if p2p else "the ranks disagree on the order of collectives"
    summary = f"{_wait_clauses(culprits, ranks, waits, needs)}: {ending}"
    if waiting:
        summary += f"; {_wait_clauses(waiting, ranks, waits, needs)}"
    first = waits[(waiting or culprits)[0]].call
    kind = "p2p_cycle" if p2p else "mismatch"
    return Verdict("deadlock", kind, culprits, waiting, first.op, _call_name(first), summary + ".")


# -- mismatches ---------------------------------------------------------------


def _wire_size(call: Call) -> tuple[object, ...]:
    """What goes over the wire per tensor: bytes where the dtype is known, else shape and dtype."""
    sizes: list[object] = []
    for shape, dtype in zip(call.shapes, call.dtypes):
        numel = 1
        for dim in shape:
            numel *= dim
        sizes.append(numel * ELEMENT_SIZES[dtype] if dtype in ELEMENT_SIZES else (tuple(shape), dtype))
    return tuple(sizes)


def _completion_key(call: Call) -> tuple[object, ...]:
    """What two ranks must agree on for Gloo to complete a collective at all."""
    sizes = () if call.kind.uneven else _wire_size(call)
    return call.op, call.root, sizes


def _inflight_mismatch(ranks: dict[int, RankState]) -> Verdict | None:
    """A blocked rank whose collective a peer entered in a way that can never complete with it."""
    for rank in sorted(ranks):
        call = _blocked_in(ranks[rank])
        if call is None or not call.is_collective:
            continue
        for member in _members(rank, call, ranks) or []:
            theirs = _collective_at(ranks[member], call.group, call.seq)
            if theirs is not None and _completion_key(theirs) != _completion_key(call):
                return _mismatch_verdict("deadlock", ranks, call, _completion_key)
    return None


def _finished_mismatch(ranks: dict[int, RankState]) -> Verdict | None:
    """After the test: two ranks that entered the same collective with different signatures."""
    by_position: dict[tuple[str, int], dict[int, Call]] = {}
    for rank in sorted(ranks):
        for call in ranks[rank].calls:
            if call.is_collective and call.group != "?":  # "?": a group the recorder could not name
                by_position.setdefault((call.group, call.seq), {})[rank] = call
    for entered in by_position.values():
        if len({Call.signature(c) for c in entered.values()}) > 1:
            return _mismatch_verdict("done", ranks, entered[min(entered)], Call.signature)
    return None


def _mismatch_verdict(
    status: str, ranks: dict[int, RankState], call: Call, key: Callable[[Call], tuple[object, ...]]
) -> Verdict:
    members = sorted(set(call.group_ranks or ranks) & set(ranks))
    entered = {}
    for r in members:
        theirs = _collective_at(ranks[r], call.group, call.seq)
        if theirs is not None:
            entered[r] = theirs
    culprits, agreeing = _minority(entered, key)
    shown = entered[(agreeing or culprits)[0]]
    same_op = len({c.op for c in entered.values()}) == 1
    what = _call_name(call) if same_op else f"collective #{call.seq}" + (
        "" if call.group == "WORLD" else f" on group {call.group} {list(call.group_ranks)}"
    )
    details = ", ".join(
        f"{rank_list(group)} {text}" for text, group in _grouped(entered, lambda r: _signature_text(entered[r]))
    )
    summary = f"{rank_list(entered)} disagree on {what}: {details}."
    return Verdict(status, "mismatch", culprits, agreeing, shown.op, _call_name(shown), summary)


def _minority(entered: dict[int, Call], key: Callable[[Call], tuple[object, ...]]) -> tuple[list[int], list[int]]:
    """(culprits, the rest): the ranks whose call differs from the most common one.  On a tie the
    lowest rank's call counts as the expected one, so the culprits never include the lowest rank."""
    counts = Counter(key(c) for c in entered.values())
    lowest = key(entered[min(entered)])
    best = max(counts.values())
    expected = lowest if counts[lowest] == best else next(k for k, n in counts.items() if n == best)
    culprits = sorted(r for r, c in entered.items() if key(c) != expected)
    return culprits, sorted(r for r in entered if r not in culprits)


# -- init ---------------------------------------------------------------------

# What an init check finds: (culprit processes, why).
_InitFinding = tuple[list[int], str]


@dataclass
class _Inits:
    """What the init checks look at.  Processes are slots (RankState.rank); the rank and world
    size each one *passed* to init_process_group are in its call's ``extra``."""

    ranks: dict[int, RankState]
    calls: dict[int, Call]  # each slot's latest init_process_group
    blocked: list[int]  # slots blocked in it


def _init_fault(ranks: dict[int, RankState]) -> Verdict | None:
    """Certain faults of init_process_group, in tests that call it themselves."""
    blocked = sorted(r for r, s in ranks.items() if (c := _blocked_in(s)) is not None and c.op == INIT)
    if not blocked:
        return None
    inits = _Inits(ranks, {r: c for r, s in ranks.items() for c in s.calls if c.op == INIT}, blocked)
    for check in (_init_out_of_range, _init_duplicate, _init_world_sizes, _init_raised, _init_never):
        found = check(inits)
        if found is not None:
            culprits, reason = found
            call = _blocked_in(ranks[blocked[0]])
            assert call is not None
            waits = f"{rank_list(blocked, 'process')} {_verb(blocked, 'waits', 'wait')} in {describe_call(call)}"
            waiting = [r for r in blocked if r not in culprits]
            return Verdict("deadlock", "init", sorted(culprits), waiting, INIT, INIT, f"{reason}; {waits}.")
    return None


def _given(call: Call, name: str) -> int | None:
    value = call.extra.get(name)
    return value if isinstance(value, int) else None


def _init_out_of_range(inits: _Inits) -> _InitFinding | None:
    reasons = {}
    for r, c in sorted(inits.calls.items()):
        given, size = _given(c, "rank"), _given(c, "world_size")
        if given is not None and size is not None and not 0 <= given < size:
            reasons[r] = f"process {r} called init_process_group with rank {given}, out of range for world_size {size}"
    return (sorted(reasons), "; ".join(reasons.values())) if reasons else None


def _init_duplicate(inits: _Inits) -> _InitFinding | None:
    """Two processes with one rank: which of them gets in is a race, so blame the one that passed
    a rank other than its own slot number (it took another's rank), else the later ones to enter."""
    by_rank: dict[int, list[int]] = {}
    for r, c in sorted(inits.calls.items(), key=lambda item: (item[1].enter, item[0])):
        if (given := _given(c, "rank")) is not None:
            by_rank.setdefault(given, []).append(r)
    for given, slots in sorted(by_rank.items()):
        if len(slots) < 2 or not set(slots) & set(inits.blocked):
            continue
        impostors = [s for s in slots if s != given]
        culprits = impostors if 0 < len(impostors) < len(slots) else slots[1:]
        others = [s for s in slots if s not in culprits]
        return culprits, (
            f"{rank_list(culprits, 'process')} called init_process_group with rank {given}, "
            f"as {rank_list(others, 'process')} did"
        )
    return None


def _init_world_sizes(inits: _Inits) -> _InitFinding | None:
    """World sizes differ: the minority is at fault.  On a tie, the size that matches the number of
    processes wins, else the size of the first to enter."""
    sizes = {r: s for r, c in inits.calls.items() if (s := _given(c, "world_size")) is not None}
    if len(set(sizes.values())) < 2:
        return None
    counts = Counter(sizes.values())
    best = max(counts.values())
    tied = [s for s, n in counts.items() if n == best]
    first = sizes[min(sizes, key=lambda r: (inits.calls[r].enter, r))]
    processes = len(inits.ranks)
    expected = processes if processes in tied else first if first in tied else tied[0]
    culprits = sorted(r for r, s in sizes.items() if s != expected)
    said = ", ".join(f"{rank_list(group, 'process')} passed {size}" for size, group in _grouped(sizes, sizes.get))
    return culprits, f"init_process_group world sizes differ: {said}"


def _init_raised(inits: _Inits) -> _InitFinding | None:
    raised = {r: c for r, c in sorted(inits.calls.items()) if c.state == "raised"}
    if not raised:
        return None
    return sorted(raised), "; ".join(f"process {r} raised {c.error} in {describe_call(c)}" for r, c in raised.items())


def _init_never(inits: _Inits) -> _InitFinding | None:
    never = sorted(r for r, s in inits.ranks.items() if r not in inits.calls and s.finished)
    if not never:
        return None
    how = [f"process {r} {_how_it_failed(inits.ranks[r])} without calling init_process_group" for r in never]
    return never, "; ".join(how)


# -- the verdict --------------------------------------------------------------


def judge(snap: Snapshot) -> Verdict:
    """What the controller should do now about this test."""
    ranks = {s.rank: s for s in snap.ranks}
    if all(s.finished for s in snap.ranks):
        return _done(ranks)
    waits = _waits(ranks)
    verdict = _init_fault(ranks) or _inflight_mismatch(ranks) or _deadlock(ranks, waits)
    if verdict is not None:
        return verdict
    if snap.now - snap.started >= snap.timeout:
        return _timeout(snap, ranks, waits)
    return _stopped(snap, ranks, waits) or Verdict("wait")


def _faulty(state: RankState) -> bool:
    return state.failed or (not state.alive and state.exit_code != 0)


def _activity(described: list[int], ranks: dict[int, RankState], waits: dict[int, _Wait]) -> str:
    """What unfinished ranks are doing: running outside any call, or waiting in one."""
    running = [r for r in described if _blocked_in(ranks[r]) is None]
    blocked = [r for r in described if _blocked_in(ranks[r]) is not None]
    parts = []
    if running:
        parts.append(f"{rank_list(running)} {_verb(running, 'is', 'are')} running outside any collective")
    if blocked:
        parts.append(_wait_clauses(blocked, ranks, waits, {r: w.peers for r, w in waits.items()}))
    return "; ".join(parts)


def _timeout(snap: Snapshot, ranks: dict[int, RankState], waits: dict[int, _Wait]) -> Verdict:
    """Culprits: the running ranks that blocked ranks wait for, else every unfinished rank."""
    unfinished = [r for r in sorted(ranks) if not ranks[r].finished]
    blocked = [r for r in unfinished if _blocked_in(ranks[r]) is not None]
    running = set(unfinished) - set(blocked)
    awaited = sorted({p for wait in waits.values() for p in wait.peers if p in running})
    culprits = awaited or unfinished
    described = sorted(set(culprits) & running) + blocked
    first = _blocked_in(ranks[blocked[0]]) if blocked else None
    return Verdict(
        "timeout", "timeout", culprits, blocked,
        first.op if first else None, _call_name(first) if first else None,
        f"timed out after {snap.timeout:g} s: {_activity(described, ranks, waits)}.",
    )


def _stopped(snap: Snapshot, ranks: dict[int, RankState], waits: dict[int, _Wait]) -> Verdict | None:
    """A rank failed, nothing is certain about the others, and the grace period is over."""
    culprits = [r for r in sorted(ranks) if _faulty(ranks[r])]
    waiting = [r for r in sorted(ranks) if not ranks[r].finished and r not in culprits]
    if not culprits or not waiting:
        return None
    times = [t for r in culprits if (t := ranks[r].failed_at or ranks[r].died_at) is not None]
    if snap.now - min(times, default=snap.now) < snap.grace:
        return None
    unfinished = [r for r in sorted(ranks) if not ranks[r].finished]
    summary = f"{_failures(culprits, ranks)}; {snap.grace:g} s later {_activity(unfinished, ranks, waits)}."
    return Verdict("stopped", "rank_exited", culprits, waiting, summary=summary)


def _failures(failed: list[int], ranks: dict[int, RankState]) -> str:
    """``rank 1 died (exit code 1); ranks 2, 3 failed (ValueError: boom)``."""
    return "; ".join(
        f"{rank_list(group)} {how}" for how, group in _grouped(failed, lambda r: _how_it_failed(ranks[r]))
    )


def _done(ranks: dict[int, RankState]) -> Verdict:
    """Every rank finished: passed, or why some failed."""
    failed = [r for r in sorted(ranks) if _faulty(ranks[r])]
    if not failed:
        return Verdict("done")
    mismatch = _finished_mismatch(ranks)
    if mismatch is not None:
        return mismatch
    dead = [r for r in failed if not ranks[r].alive]
    if not dead:
        return Verdict("done", "failed", failed, [], summary=_failures(failed, ranks) + ".")
    # Ranks whose last call raised were woken by the death ("Connection closed by peer").
    woken = [r for r in sorted(ranks) if r not in dead and ranks[r].calls and ranks[r].calls[-1].state == "raised"]
    summary = _failures(dead, ranks)
    if woken:
        summary += f"; then {_failures(woken, ranks)}"
    died_in = [ranks[r].calls[-1] for r in dead if ranks[r].calls and ranks[r].calls[-1].state == "running"]
    shown = died_in[0] if died_in else ranks[woken[0]].calls[-1] if woken else None
    return Verdict(
        "done", "rank_exited", dead, woken,
        shown.op if shown else None, _call_name(shown) if shown else None, summary + ".",
    )


# -- after a passing test -----------------------------------------------------


def unfinished_work(ranks: list[RankState]) -> list[str]:
    """The asynchronous calls whose work a rank left unfinished, one line each:
    ``rank 1: irecv #1 from 0 (test_x.py:12): Timed out waiting ...``."""
    lines = []
    for state in sorted(ranks, key=lambda s: s.rank):
        for work in state.in_flight:
            call = state.calls[work["i"]] if work["i"] < len(state.calls) else None
            what = describe_call(call) if call is not None else f"call {work['i']}"
            lines.append(f"rank {state.rank}: {what}: {work['err']}")
    return lines


def compare_sequences(ranks: list[RankState]) -> list[str]:
    """How the ranks' collective sequences differ, per group: [] when they agree.

    Per group, each member's collectives (not point-to-point, not group set-up) are compared by
    position with the lowest member's: op, shapes, dtypes and root (only op, dtypes and root for
    all_to_all, whose splits may be uneven), and their number.  For each rank only the first
    difference is reported: later ones are usually the same shift."""
    sequences: dict[str, dict[int, list[Call]]] = {}
    members: dict[str, tuple[int, ...]] = {}
    for state in sorted(ranks, key=lambda s: s.rank):
        for call in state.calls:
            if call.is_collective and call.group != "?":  # "?": a group the recorder could not name
                sequences.setdefault(call.group, {}).setdefault(state.rank, []).append(call)
                members.setdefault(call.group, call.group_ranks)
    present = sorted(s.rank for s in ranks)
    differences = []
    for group, per_rank in sequences.items():
        listed = [r for r in present if not members[group] or r in members[group]]
        differences += _compare_group(group, {r: per_rank.get(r, []) for r in listed})
    return differences


def _compare_group(group: str, sequences: dict[int, list[Call]]) -> list[str]:
    lines = []
    counts = {r: len(calls) for r, calls in sequences.items()}
    if len(set(counts.values())) > 1:
        made = [
            f"{rank_list(group_ranks)} made {n} collective{'' if n == 1 else 's'}"
            for n, group_ranks in _grouped(counts, counts.get)
        ]
        lines.append(f"group {group}: " + ", ".join(made))
    keys = {r: [Call.signature(c) for c in calls] for r, calls in sequences.items()}
    reference, *others = sorted(sequences)
    for rank in others:
        if keys[rank] == keys[reference]:
            continue
        for position, (expected, theirs) in enumerate(zip(sequences[reference], sequences[rank]), 1):
            if keys[reference][position - 1] != keys[rank][position - 1]:
                lines.append(
                    f"group {group}, collective #{position}: rank {reference} {_signature_text(expected)} "
                    f"({expected.site}) vs rank {rank} {_signature_text(theirs)} ({theirs.site})"
                )
                break
    return lines

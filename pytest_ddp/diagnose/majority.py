"""Who departed, where the ranks disagree: the majority decides.  Pure.

Ranks that run the same code make the same calls; where some differ, the many are taken for
the program and the few for the ranks that departed from it.  With as many on each side
(2 ranks) there is no majority: every side is named, and where its history tells, one as
likely (:func:`departures`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from typing import TypeVar

from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import (
    CutOnPurpose,
    Departed,
    ExtraCall,
    Failures,
    GraceOver,
    SettingDiffers,
    Verdict,
    Wait,
)

T = TypeVar("T")
# What two calls are compared by: equal keys agree.
Key = Callable[[Call], tuple[object, ...]]


def extra_call(returned: list[int], doomed: set[int], waits: dict[int, Wait]) -> Verdict | None:
    """Every doomed rank waits in one collective that more of its members returned without: the
    few made a call more (a step more), rather than the many a call less.  Not with 2 ranks."""
    call = waits[min(doomed)].call
    if len(returned) <= len(doomed) or not call.is_collective:
        return None
    if any((waits[r].call.group, waits[r].call.seq) != (call.group, call.seq) for r in doomed):
        return None
    callers = sorted(doomed)
    finding = ExtraCall(callers, returned, {r: waits[r] for r in callers})
    return Verdict("deadlock", "partial", callers, [], call.op, call.label, finding)


def extra_message(returned: list[int], doomed: set[int], ranks: dict[int, RankState],
                  waits: dict[int, Wait]) -> Verdict | None:
    """The few doomed ranks waiting for a returned rank each wait in a send or receive numbered one
    more than most ranks' latest of that direction, while their peers made the usual count of the
    other: they made a message more.  The other doomed ranks wait behind them.  Not with 2 ranks."""
    callers = sorted(r for r in doomed if any(p in returned for p in waits[r].peers))
    if not callers or 2 * len(callers) >= len(ranks) or not all(waits[r].call.is_p2p for r in callers):
        return None
    # A p2p call's number counts its direction's calls to its peer; read from the end (long runs).
    latest = {recv: {r: _latest(state, recv) for r, state in ranks.items()} for recv in (False, True)}
    usual = {recv: _most(latest[recv][r] for r in ranks if r not in callers) for recv in (False, True)}
    for r in callers:
        call = waits[r].call
        own, peer = usual[call.is_recv], usual[not call.is_recv]
        if not own or peer is None or call.seq != own + 1:  # not own: none exchange messages
            return None
        if any(p not in returned or latest[not call.is_recv][p] != peer for p in waits[r].peers):
            return None
    call = waits[callers[0]].call
    finding = ExtraCall(callers, returned, {r: waits[r] for r in callers})
    behind = sorted(doomed - set(callers))
    return Verdict("deadlock", "partial", callers, behind, call.op, call.label, finding)


def _latest(state: RankState, recv: bool) -> int:
    """The number of the rank's latest send (receive) to (from) its peer; 0 if it made none."""
    return next((c.seq for c in reversed(state.calls) if c.is_p2p and c.is_recv == recv), 0)


def _most(counts: Iterable[int]) -> int | None:
    """The count that more than half of the ranks made; None where none did."""
    made = list(counts)
    count, ranks = Counter(made).most_common(1)[0] if made else (0, 0)
    return count if 2 * ranks > len(made) else None


def broken_center(ranks: dict[int, RankState]) -> int | None:
    """The one rank at an end of every raised send or receive of the failed or dead ranks, where
    two or more raised: its connections broke and it woke its peers ("Connection closed by peer");
    None where no one rank is (a pair: each end blames the other)."""
    ends = []
    for r, state in ranks.items():
        if state.alive and not state.failed:
            continue
        for c in state.calls:
            if c.is_p2p and c.state == "raised" and c.peer is not None:
                ends.append({r, c.peer})
    if len(ends) < 2:
        return None
    common = set.intersection(*ends)
    return common.pop() if len(common) == 1 else None


def broken_pair(ranks: dict[int, RankState], gone: int) -> list[int]:
    """The two ends of the one connection the gone rank's sends or receives raised on, where both
    are alive and the other end raised on it too, or is still in a send or receive to it (Gloo
    raises "Connection closed by peer" on both ends): either may have lost it; [] otherwise."""
    peers = {c.peer for c in ranks[gone].calls if c.is_p2p and c.state == "raised"}
    if not ranks[gone].alive or len(peers) != 1:
        return []
    other = peers.pop()
    if other not in ranks or other == gone or not ranks[other].alive:
        return []
    raised_with = {c.peer for c in ranks[other].calls if c.is_p2p and c.state == "raised"}
    call = ranks[other].blocked_call
    still_in = call is not None and call.is_p2p and call.peer == gone
    if raised_with == {gone} or (not raised_with and still_in):
        return sorted((gone, other))
    return []


def out_of_order(
    culprits: list[int], waiting: list[int], waits: dict[int, Wait]
) -> tuple[list[int], list[int]]:
    """A cycle where most ranks wait in one call: the fewer, each in another call, took the
    collectives in another order (culprits).  Without such a majority every rank stays, and so
    where some wait in a call of no number (new_group): its place among the collectives is not
    recorded, so no order tells who departed."""
    if any(not waits[r].call.is_collective for r in culprits):
        return culprits, waiting
    by_call: dict[tuple[str, int], list[int]] = {}
    for r in culprits:
        by_call.setdefault((waits[r].call.group, waits[r].call.seq), []).append(r)
    most = max(by_call.values(), key=len)
    if 2 * len(most) <= len(culprits):
        return culprits, waiting
    return [r for r in culprits if r not in most], sorted([*waiting, *most])


def settings_differ(verdict: Verdict, ranks: dict[int, RankState]) -> Verdict | None:
    """Where a failed or hung test's ranks gave differently a value they must give alike (a
    pipeline schedule's microbatch count), the first where they part: the ranks of the rarer value
    departed (every rank at a tie).  None where they agree or nothing failed; values of different
    things or groups stop the comparison there."""
    given = [s.settings for s in ranks.values() if s.settings]
    if verdict.kind is None or len(given) < 2:
        return None
    for i in range(min(len(settings) for settings in given)):
        values = {s.rank: s.settings[i] for s in ranks.values() if s.settings}
        if len({(v.name, v.group) for v in values.values()}) > 1:
            return None
        if len({v.value for v in values.values()}) > 1:
            culprits, _ = minority(values, lambda setting: (setting.name, setting.value))
            others = sorted({*verdict.culprits, *verdict.waiting} - set(culprits))
            finding = SettingDiffers(values, verdict)
            status, collective, call = verdict.status, verdict.collective, verdict.call
            return Verdict(status, "mismatch", culprits, others, collective, call, finding)
    return None


def cut_on_purpose(verdict: Verdict, ranks: dict[int, RankState]) -> Verdict | None:
    """Of the failed ranks a verdict names, those whose connections the test cut on purpose
    (:func:`pytest_ddp.faults.disconnect`) alone, where the others raised or died in a call with
    one of them: Gloo raises on every end, and a peer often first.  None where nothing changes."""
    cut = {r for r, s in ranks.items() if any(fault.action == "disconnect" for fault in s.injected)}
    finding = verdict.finding
    if not cut:
        return None
    if isinstance(finding, Departed) and cut.isdisjoint(finding.culprits):
        return _woken_by_cut(verdict, ranks, cut)
    if isinstance(finding, Departed):
        return _woke_gone(verdict, finding, ranks, cut)
    if isinstance(finding, (Failures, GraceOver)) and cut & {*finding.failed, *finding.woken}:
        return _woke_failed(verdict, finding, ranks, cut)
    return None


def _woke_gone(
    verdict: Verdict, finding: Departed, ranks: dict[int, RankState], cut: set[int]
) -> Verdict | None:
    """The ranks gone with a cut rank that it woke are its victims, as :func:`broken_center`'s
    are; of a broken connection's two ends (:func:`broken_pair`), the cut one lost it."""
    peers = [g for g in finding.culprits if g not in cut and _woken(ranks[g], cut)]
    broken = [] if cut & set(finding.broken) else finding.broken
    if not peers and broken == finding.broken:
        return None
    culprits = [g for g in finding.culprits if g not in peers]
    victims = sorted({*finding.victims, *peers})
    changed = dataclasses.replace(finding, culprits=culprits, victims=victims, broken=broken)
    named = sorted({*culprits, *broken, *finding.alike})
    waiting = sorted({*verdict.culprits, *verdict.waiting} - {*named, *peers})
    return dataclasses.replace(verdict, culprits=named, waiting=waiting, finding=changed)


def _woke_failed(
    verdict: Verdict, finding: Failures | GraceOver, ranks: dict[int, RankState], cut: set[int]
) -> Verdict | None:
    """The failed ranks a cut rank woke are told as woken, the cut rank failed, whichever raised first."""
    peers = [r for r in finding.failed if r not in cut and _woken(ranks[r], cut)]
    if not peers:
        return None
    failed = sorted({*finding.failed, *(cut & set(finding.woken))} - set(peers))
    changed = dataclasses.replace(finding, failed=failed, woken=sorted({*finding.woken, *peers} - cut))
    culprits = sorted({*verdict.culprits, *(cut & set(finding.woken))} - set(peers))
    waiting = sorted({*verdict.waiting, *peers} - set(culprits))
    return dataclasses.replace(verdict, culprits=culprits, waiting=waiting, finding=changed)


def _woken_by_cut(verdict: Verdict, ranks: dict[int, RankState], cut: set[int]) -> Verdict | None:
    """A deadlock whose departed ranks each raised or died in a call with a cut rank still in the
    test (it raises last on a loaded machine): the cut ranks are named, those they woke wait."""
    gone = [r for r in verdict.culprits if r not in cut]  # a cut end of a broken pair may be named too
    if not gone or not all(_woken(ranks[r], cut) for r in gone):
        return None
    named = sorted(cut)
    waiting = sorted({*verdict.waiting, *gone} - cut)
    then = verdict
    if isinstance(verdict.finding, Departed) and cut & set(verdict.finding.broken):  # the cut end lost it
        then = dataclasses.replace(verdict, finding=dataclasses.replace(verdict.finding, broken=[]))
    return Verdict(verdict.status, verdict.kind, named, waiting, verdict.collective, verdict.call,
                   CutOnPurpose(named, then))


def _woken(state: RankState, cut: set[int]) -> bool:
    """The rank's last call raised, or it died (Gloo aborts a process whose asynchronous send or
    receive failed, even between calls), in a call with a cut rank."""
    last = state.last_raised
    if not state.alive:  # its last call, or the call it died inside
        last = state.died_in or (state.calls[-1] if state.calls else None)
    if last is None:
        return False
    if last.is_p2p:
        return last.peer in cut
    return last.is_collective and bool(cut & set(last.group_ranks))


def minority(entered: dict[int, T], key: Callable[[T], tuple[object, ...]]) -> tuple[list[int], list[int]]:
    """(culprits, the rest): the ranks whose call differs from the most common one; at a tie
    every rank is named."""
    counts = Counter(key(c) for c in entered.values())
    best = max(counts.values())
    common = [k for k, n in counts.items() if n == best]
    if len(common) > 1:
        return sorted(entered), []
    culprits = sorted(r for r, c in entered.items() if key(c) != common[0])
    return culprits, sorted(r for r in entered if r not in culprits)


def departures(ranks: dict[int, RankState], entered: dict[int, Call], key: Key) -> dict[int, Call]:
    """In a tie: a rank whose call differs from every earlier call from its line (a smaller last
    batch, another dtype), while each other rank's is what its line always made -> that earlier
    call.  Empty when nothing tells (a line with no history may be a step more on the peer)."""
    before: dict[str, set[tuple[object, ...]]] = {}
    earlier: dict[str, Call] = {}
    for _, made in _made_before(ranks, entered):
        for call in made:
            before.setdefault(call.site, set()).add(key(call))
            earlier[call.site] = call
    usual = {r: next(iter(before[c.site])) for r, c in entered.items() if len(before.get(c.site, ())) == 1}
    if len(usual) < len(entered):  # a line with no history, or one that made calls of several kinds
        return {}
    departing = {r: earlier[c.site] for r, c in entered.items() if key(c) != usual[r]}
    return departing if 0 < len(departing) < len(entered) else {}


def likely(ranks: dict[int, RankState], entered: dict[int, Call], key: Key
           ) -> tuple[dict[int, Call], dict[int, tuple[Call, Call]]]:
    """A tie's likely culprits: (:func:`departures`, else :func:`new_paths`), one of them empty."""
    departing = departures(ranks, entered, key)
    return departing, {} if departing else new_paths(ranks, entered)


def new_paths(ranks: dict[int, RankState], entered: dict[int, Call]) -> dict[int, tuple[Call, Call]]:
    """In a tie :func:`departures` cannot break: a rank whose call came after its previous one by
    a path no rank took before (a call skipped or made more), while each other's came by a known
    path -> the call before it.  A first call, or one from a line with no history, tells nothing
    (a step less on one rank is a step more on the other).  Empty when nothing tells."""
    before, new = paths(ranks, entered)
    if len(before) < len(entered) or new is None:
        return {}
    departed = {r: (before[r], entered[r]) for r in new}
    return departed if 0 < len(departed) < len(entered) else {}


def branched(ranks: dict[int, RankState], cycle: list[int]) -> dict[int, tuple[Call, Call]]:
    """On a p2p cycle of more than 2 ranks (where :func:`new_paths` finds the skipped send a call
    too late): the one rank that once left a line by a new path no rank took at any other time ->
    that path's two calls.  Empty unless exactly one rank did (a loop's end is taken by all)."""
    made = dict(_made_before(ranks, {}))
    taken = Counter((a.site, b.site) for calls in made.values() for a, b in pairwise(calls))
    found: dict[int, tuple[Call, Call]] = {}
    for rank in cycle:
        left: dict[str, str] = {}  # line -> the line the rank's calls went to first from there
        for a, b in pairwise(made[rank]):
            if left.setdefault(a.site, b.site) != b.site and taken[a.site, b.site] == 1:
                found[rank] = (a, b)
                break
    return found if len(found) == 1 else {}


def as_before(ranks: dict[int, RankState], entered: dict[int, Call]) -> bool:
    """Every rank's call came after its previous one by a path taken before (:func:`new_paths`):
    the ranks went on as they had, round the same code once more."""
    before, new = paths(ranks, entered)
    return len(before) == len(entered) and new == set()


def paths(ranks: dict[int, RankState], entered: dict[int, Call]) -> tuple[dict[int, Call], set[int] | None]:
    """(each entered rank's call before its entered one, the ranks whose entered call came from
    it by a path no rank took before); None for the second where an entered call's line made no
    call before."""
    taken: set[tuple[str, str]] = set()
    lines: set[str] = set()
    before: dict[int, Call] = {}
    for rank, made in _made_before(ranks, entered):
        taken.update((a.site, b.site) for a, b in pairwise(made))
        lines.update(c.site for c in made)
        if rank in entered and made:
            before[rank] = made[-1]
    if any(c.site not in lines for c in entered.values()):
        return before, None
    return before, {r for r, c in entered.items() if r in before and (before[r].site, c.site) not in taken}


def _made_before(ranks: dict[int, RankState], entered: dict[int, Call]) -> Iterator[tuple[int, list[Call]]]:
    """Each rank's collectives and sends or receives from a known line, before its call in
    ``entered`` (all of them for a rank not in it): what the ranks did before they parted."""
    for rank, state in ranks.items():
        end = entered[rank].index if rank in entered else len(state.calls)
        yield rank, [c for c in state.calls[:end] if (c.is_collective or c.is_p2p) and c.site]

"""The words of a failed test's report: the watchdog's findings (each rank in words:
:mod:`pytest_ddp.diagnose.rank_words`; init_process_group's faults:
:mod:`pytest_ddp.diagnose.init_words`; the headline: :mod:`pytest_ddp.diagnose.headline`).

The watchdog (:mod:`pytest_ddp.diagnose.watchdog`) returns data; this module words it once per
failing test, for the report, the JSON and ``run()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pytest_ddp.diagnose import mpi_matching
from pytest_ddp.diagnose.init_words import init_fault_words
from pytest_ddp.diagnose.phrases import describe_call, grouped, rank_list, said, signature_text, verb
from pytest_ddp.diagnose.rank_words import (
    failed_outside_calls,
    how_it_failed,
    left_by,
    plain_error,
    tested,
    thread_raised,
)
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import (
    CutOnPurpose,
    Cycle,
    Departed,
    Disagreement,
    ExtraCall,
    Failures,
    GraceOver,
    InitFault,
    LeftMidCall,
    MembersDiffer,
    NoneFinished,
    NoSuchPeer,
    SettingDiffers,
    SlowRanks,
    TimedOut,
    Verdict,
    Wait,
)
from pytest_ddp.diagnose.waits import collective_at, first_missed


def _wait_clauses(
    described: list[int], ranks: dict[int, RankState], waits: dict[int, Wait], needs: dict[int, list[int]]
) -> str:
    """``ranks 0, 1 wait in all_reduce #1 (t.py:3) for rank 2``, grouped by call and needed ranks."""

    def key(r: int) -> tuple[str, tuple[int, ...], bool]:
        call = ranks[r].blocked_call
        assert call is not None
        wait = waits.get(r)
        named = call.is_p2p and call.peer is not None  # the label already names the peer
        return describe_call(call), () if named else tuple(needs.get(r, [])), bool(wait and wait.any_of)

    clauses = []
    for (where, needed, any_of), group in grouped(described, key):
        clause = f"{rank_list(group)} {verb(group, 'waits', 'wait')} in {where}"
        if needed:
            clause += f" for {'any of ' if any_of and len(needed) > 1 else ''}{rank_list(needed)}"
        clauses.append(clause)
    return " and ".join(clauses) if len(clauses) == 2 else "; ".join(clauses)


def _left_reason(ranks: dict[int, RankState], rank: int, waiter: int, waited: Call, plural: bool) -> str:
    """How a rank others wait for left the test: what it did, or what it never did."""
    state = ranks[rank]
    if not state.alive or state.failed:
        return how_it_failed(state)
    test = "their test" if plural else "its test"
    mpi_recv = waited.is_recv and mpi_matching.is_mpi_p2p(waited)  # (matching reads every rank's calls)
    missed = mpi_matching.unreceived_from(ranks, rank, waiter, waited.group) if mpi_recv else []
    if missed:  # MPI: it did send, with another tag
        return f"returned from {test}; its {describe_call(missed[0].call)} matches no receive"
    # What it never did first, how it left after: the headline, cut at a terminal's width, keeps the call.
    if waited.is_p2p:
        exchange = "sent to" if waited.is_recv else "received from"
        return f"never {exchange} rank {waiter} (returned from {test})"
    return f"never called {waited.label} (returned from {test}{left_by(state)})"


def _stopped(state: RankState) -> bool:
    return state.process is not None and state.process.stopped


def _activity(described: list[int], ranks: dict[int, RankState], waits: dict[int, Wait]) -> str:
    """What unfinished ranks are doing: stopped, running outside any call, or waiting in one."""
    stopped = [r for r in described if _stopped(ranks[r])]
    running = [r for r in described if r not in stopped and ranks[r].blocked_call is None]
    blocked = [r for r in described if r not in stopped and ranks[r].blocked_call is not None]
    parts = []

    def where(r: int) -> str:
        call = ranks[r].blocked_call
        process = ranks[r].process
        assert process is not None
        inside = f" in {describe_call(call)}" if call is not None else ", outside any collective"
        return f"{process.text}{inside}"

    for text, group in grouped(stopped, where):
        parts.append(f"{rank_list(group)} {verb(group, 'is', 'are')} {text}")
    for thread, group in grouped(running, lambda r: thread_raised(ranks[r])):  # a loader's worker died
        after = f", after {'its' if len(group) == 1 else 'their'} {thread}" if thread else ""
        parts.append(f"{rank_list(group)} {verb(group, 'is', 'are')} running outside any collective{after}")
    if blocked:
        parts.append(_wait_clauses(blocked, ranks, waits, {r: w.peers for r, w in waits.items()}))
    return "; ".join(parts)


def _failures(failed: list[int], ranks: dict[int, RankState], woken: list[int] | None = None) -> str:
    """``rank 1 died (exit code 1); ranks 2, 3 failed (ValueError: boom)``; then how the ranks its
    failures woke failed."""
    text = said(failed, lambda r: how_it_failed(ranks[r]))
    return f"{text}; then {_failures(woken, ranks)}" if woken else text


# -- one function per finding -------------------------------------------------


def _departed(f: Departed, ranks: dict[int, RankState]) -> str:
    def reason(g: int, plural: bool = False) -> str:
        waiter = min(r for r in f.doomed if g in f.left[r])
        missed = first_missed(ranks[waiter], ranks[g], f.waits[waiter].call)
        return _left_reason(ranks, g, waiter, missed, plural)

    causes = [
        f"{rank_list(group)} {reason(group[0], len(group) > 1)}{_matched_elsewhere(group, f.doomed, ranks)}"
        for _, group in grouped(f.culprits, reason)
    ]
    causes += [f"{rank_list(group)} {reason(group[0])}" for _, group in grouped(f.victims, reason)]
    text = "; ".join(causes) + "; " + _wait_clauses(f.doomed, ranks, f.waits, f.needs) + "."
    if f.broken:
        a, b = f.broken
        text += (f" The connection between ranks {a} and {b} broke, and a call of each on it raised:"
                 " either may have lost it.")
    if f.alike:
        text += _tie(f.alike, f.culprits)
    return text


def _matched_elsewhere(few: list[int], others: list[int], ranks: dict[int, RankState]) -> str:
    """``; its barrier #1 (t.py:22) matched ranks 0-2's from t.py:21``: the first collective in
    which the ``few`` (the ranks that returned, or those alone in a call more), each from one line,
    met the others' calls of one other line: the call the few skipped, which their later one stood
    in for, or made more, which the others' later one met; "" where none did."""
    met = _met_elsewhere(few, others, ranks)
    if met is None:
        return ""
    call, site = met
    whose = f"{rank_list(others)}'s" if len(others) > 1 else f"rank {others[0]}'s"
    its = "its" if len(few) == 1 else "their"
    return f"; {its} {describe_call(call)} matched {whose} from {site}"


def _met_elsewhere(
    few: list[int], others: list[int], ranks: dict[int, RankState], before: Call | None = None
) -> tuple[Call, str] | None:
    """(the first of :func:`_matched_elsewhere`'s collectives, made before ``before`` where given,
    the others' line there)."""
    if any(not ranks[r].alive or ranks[r].failed for r in few):
        return None
    made = ranks[few[0]].calls if before is None else ranks[few[0]].calls[:before.index]
    for call in (c for c in made if c.is_collective and c.site):
        theirs = [collective_at(ranks[r], call.group, call.seq) for r in few]
        met = [collective_at(ranks[r], call.group, call.seq) for r in others]
        if any(c is None or c.site != call.site for c in theirs) or any(c is None for c in met):
            continue
        sites = {c.site for c in met if c is not None}
        if len(sites) == 1 and call.site not in sites:
            return call, sites.pop()
    return None


def _left_mid_call(f: LeftMidCall, ranks: dict[int, RankState]) -> str:
    """``rank 1 never called all_reduce #2 and ended the group (destroy_process_group at t.py:9);
    then rank 0 raised RuntimeError: Read error: Connection reset by peer in all_reduce #2 (t.py:8)``."""

    def how(r: int) -> str:
        destroy = f.ended.get(r)
        if destroy is None:
            return "(returned from its test)"
        # A harness's call (torch's MultiProcessTestCase) has no line of a file to name.
        at = "" if destroy.site.startswith("<") else f" at {destroy.site}"
        return f"and ended the group ({destroy.op}{at})"

    def raised(r: int) -> str:
        call = f.woken[r]
        error = plain_error((call.error or "error").strip().splitlines()[0])
        return f"raised {error} in {describe_call(call)}"

    causes = said(f.culprits, lambda r: f"never called {f.call.label} {how(r)}")
    text = f"{causes}; then {said(f.woken, raised)}."
    if f.alike:
        text += _tie(f.alike, f.culprits)
    return text


def _tie(went_on: list[int], returned: list[int]) -> str:
    """What a two-rank tie of a step more or a step less says after the cause."""
    waiting, gone = rank_list(went_on), rank_list(returned)
    they = "they" if len(went_on) > 1 else "it"
    return (f" {waiting} went on as {they} had (the call came after the one"
            f" before it in an order of lines taken before): a step more on {waiting} or a step less on"
            f" {gone}, nothing tells which.")


def _extra_call(f: ExtraCall, ranks: dict[int, RankState]) -> str:
    """``rank 2 alone called all_reduce #4 (t.py:9); ranks 0, 1, 3 returned from their test
    without it``."""
    call = f.waits[f.callers[0]].call
    test = "their test" if len(f.returned) > 1 else "its test"
    if call.is_p2p:  # rank 0 made a send more than most ranks: send #4 to 1 (t.py:9); rank 1 ...
        direction, other = ("receive", "sending") if call.is_recv else ("send", "receiving")
        return (f"{rank_list(f.callers)} made a {direction} more than most ranks: {describe_call(call)}; "
                f"{rank_list(f.returned)} returned from {test} without {other} it.")
    alone = "alone " if len(f.callers) == 1 else ""
    returned = f"{rank_list(f.returned)} returned from {test} without it"
    under = f", in a branch of the code for one rank ({f.condition})" if f.condition else ""
    if f.loop:  # the others made this line's calls too, one fewer: a step more, not alone
        return (f"{rank_list(f.callers)} called {describe_call(call)}, a step more in a loop over values"
                f" that differ between ranks ({f.loop}); {returned}.")
    if f.earlier is not None:  # the call more met the returned rank's next: the caller waits alone at the end
        whose = f"rank {f.returned[0]}'s"
        return (f"{rank_list(f.callers)} alone called {_made(f.earlier, f.made_from)}{under}, and it met"
                f" {whose} from {f.met}; {rank_list(f.returned)} returned from {test}, and"
                f" {rank_list(f.callers)} waits in {describe_call(call)}.")
    matched = _matched_elsewhere(f.callers, f.returned, ranks)
    return f"{rank_list(f.callers)} {alone}called {_made(call, f.made_from)}{under}{matched}; {returned}."


def _made(call: Call, made_from: str | None) -> str:
    """``all_reduce #2 (t.py:23) from t.py:29``: the call, and the user's line that led to it where
    that is not the call's own."""
    return describe_call(call) + (f" from {made_from}" if made_from else "")



def _cycle(f: Cycle, ranks: dict[int, RankState]) -> str:
    if f.sent_after:
        text = _sent_after(f)
    elif f.unmatched:
        text = "; ".join(_unmatched(r, f) for r in f.unmatched)  # the rest of the cycle waits for them
    else:
        finding = "a point-to-point cycle" if f.p2p else "the ranks disagree on the order of collectives"
        likely = sorted(set(f.after) | set(f.skipped))  # what tells is said after; the rank leads
        if likely:
            finding = f"{rank_list(likely)} likely {verb(likely, 'departs', 'depart')}: {finding}"
        elif f.branch:
            finding = f"{rank_list(sorted(f.branch))} {verb(list(f.branch), 'departs', 'depart')}: {finding}"
        text = f"{finding}: {_wait_clauses(f.culprits, ranks, f.waits, f.needs)}"
    if f.waiting:
        text += f"; {_wait_clauses(f.waiting, ranks, f.waits, f.needs)}"
    branch = "".join(
        f" Rank {group[0]}'s call is in a branch of the code for one rank ({where})." if len(group) == 1
        else f" {rank_list(group).capitalize()}' calls are in a branch of the code for them alone ({where})."
        for where, group in grouped(f.branch, lambda r: f.branch[r])
    )
    return text + "." + _new_paths(f.after) + _skipped(f.skipped) + branch


def _new_paths(after: dict[int, tuple[Call, Call]]) -> str:
    """`` Likely rank 0: its send #3 to 1 (t.py:9) came right after a call from t.py:9, an order
    no rank's calls took before; the others' came in an order taken before.``"""
    return "".join(
        f" Likely rank {rank}: its {describe_call(call)} came right after a call from {before.site},"
        " an order no rank's calls took before; the others' came in an order taken before."
        for rank, (before, call) in sorted(after.items())
    )


def _skipped(skipped: dict[int, tuple[Call, Call, list[str]]]) -> str:
    """`` Likely rank 0: its broadcast #3 (t.py:9) came right after its call from t.py:9, and its
    code makes the call of t.py:8 on every way between the two; the others' code has a way.``"""
    return "".join(
        f" Likely rank {rank}: its {describe_call(call)} came right after its call from {before.site},"
        f" and its code makes the call{'s' if len(sites) > 1 else ''} of {', '.join(sites)}"
        " on every way between the two; the others' code has a way."
        for rank, (before, call, sites) in sorted(skipped.items())
    )


def _sent_after(f: Cycle) -> str:
    """``rank 0 entered barrier #1 (t.py:39) from t.py:52 before its send at t.py:54, which rank 1's
    recv #1 from 0 (t.py:32) waits for: rank 1's code reaches t.py:52 only after it``."""
    [(sender, (entered, sent))] = f.sent_after.items()
    [receiver] = f.unmatched
    collective = f.waits[sender].call
    made = _made(collective, None if entered == collective.site else entered)
    return (f"rank {sender} entered {made} before its send at {sent}, which rank {receiver}'s"
            f" {describe_call(f.waits[receiver].call)} waits for: rank {receiver}'s code reaches {entered}"
            " only after it")


def _unmatched(rank: int, f: Cycle) -> str:
    """``no recv matches rank 0's send #2 to 1 (t.py:8): rank 1 waits in barrier #1 (t.py:11)
    for rank 0 instead``."""
    call = f.waits[rank].call
    peers = [p for p in f.needs[rank] if not f.waits[p].call.is_p2p]
    instead = "; ".join(
        f"rank {p} waits in {describe_call(f.waits[p].call)} for rank {rank} instead" for p in peers
    )
    return f"no {'send' if call.is_recv else 'recv'} matches rank {rank}'s {describe_call(call)}: {instead}"


def _no_such_peer(f: NoSuchPeer, ranks: dict[int, RankState]) -> str:
    """``rank 0 waits in recv #1 from -1 (t.py:5), a rank its group (ranks 0-2) does not have: no
    call can match it (Gloo waits ...); rank 2 waits in send #1 to 0 (t.py:8)``."""
    text = "; ".join(
        f"rank {r} waits in {describe_call(f.waits[r].call)}, a rank its group ({rank_list(f.members[r])})"
        " does not have" for r in f.culprits
    )
    text += ": no call can match it (Gloo waits for that rank until the group's timeout)"
    behind = [r for r in f.waits if r not in f.culprits]
    if behind:
        text += f"; {_wait_clauses(behind, ranks, f.waits, {r: w.peers for r, w in f.waits.items()})}"
    return text + "."


def _members_differ(f: MembersDiffer, ranks: dict[int, RankState]) -> str:
    """``ranks 0-3 disagree on the members of new_group #1 (t.py:18): ranks 0, 3 passed [0, 3];
    ranks 1, 2 passed [1, 2]. ...``: torch's rule after the calls."""
    passed = said(f.calls, lambda r: f"passed {list(f.calls[r].extra['ranks'])}")
    what = f"the members of new_group #{f.number} ({', '.join(sorted({c.site for c in f.calls.values()}))})"
    if f.odd:
        rest = [r for r in f.calls if r not in f.odd]
        lead = f"{rank_list(f.odd)} {verb(f.odd, 'departs', 'depart')} from {rank_list(rest)} on {what}"
    else:
        lead = f"{rank_list(f.calls)} disagree on {what}"
    return (f"{lead}: {passed}. Every rank's new_group #{f.number} is one group to torch, named alike:"
            " each rank must pass the same ranks (use_local_synchronization=True: its members only).")


def _disagreement(f: Disagreement, ranks: dict[int, RankState]) -> str:
    call, entered = f.call, f.entered
    same_op = len({c.op for c in entered.values()}) == 1
    if call.is_p2p:
        what = f"the message of {call.label}"
    elif same_op:
        what = call.label
    else:
        on_group = "" if call.group == "WORLD" else f" on group {call.group} {list(call.group_ranks)}"
        what = f"collective #{call.seq}{on_group}"
    reductions = len({c.reduction for c in entered.values()}) > 1
    # The odd ranks lead, else a tie's likely ones (what tells is said after), else the lowest.
    likely = sorted(set(f.likely) | set(f.after) | set(f.skipped))
    named = f.odd or likely
    details = ", ".join(
        f"{rank_list(group)} {text}"
        for text, group in sorted(
            grouped(entered, lambda r: signature_text(entered[r], reductions)),
            key=lambda item: item[1][0] not in named,
        )
    )
    if named:
        rest = [r for r in entered if r not in named]
        how = "" if f.odd else "likely "
        departs = verb(named, "departs", "depart")
        text = f"{rank_list(named)} {how}{departs} from {rank_list(rest)} on {what}: {details}."
        text += _odd_line(f, rest) + _earlier_met(f, rest, ranks)
        if f.own_group is not None:
            text += _own_group(f)
        elif f.condition:
            text += f" Rank {f.odd[0]}'s call is in a branch of the code for one rank ({f.condition})."
        if f.left:
            text += f" Rank {f.odd[0]} left by {f.left.site}{tested(f.left)}, before rank {rest[0]}'s call."
        if f.overflow:
            sent, held = f.overflow
            text += (f" Rank {f.odd[0]} sent {sent} bytes where rank {rest[0]}'s receive holds {held}:"
                     " the receive was posted for what its rank expects.")
        if f.loop:
            text += (f" Rank {f.odd[0]}'s call is in a loop over values that differ between ranks ({f.loop}),"
                     f" which rank {rest[0]} made a call in and left: a step more on rank {f.odd[0]}.")
    else:
        text = f"{rank_list(entered)} disagree on {what}: {details}."
    for rank, usual in sorted(f.likely.items()):
        text += (
            f" Likely rank {rank}: every earlier call from {entered[rank].site} was {signature_text(usual)},"
            f" and rank {rank}'s is the one that departs from it."
        )
    return text + _new_paths(f.after) + _skipped(f.skipped)


def _own_group(f: Disagreement) -> str:
    """`` Ranks 0, 1' calls are in a branch of the code for them alone (t.py:24), right after their
    broadcast_object_list #1 on group 1 [0, 1] (t.py:14): theirs on WORLD was likely meant for that
    group.``"""
    own = f.own_group
    assert own is not None
    whose = rank_list(f.odd).capitalize()
    group = f.entered[f.odd[0]].group
    return (f" {whose}' calls are in a branch of the code for them alone ({f.condition}), right after"
            f" their {own.label} ({own.site}): theirs on {group} was likely meant for that group.")


def _earlier_met(f: Disagreement, rest: list[int], ranks: dict[int, RankState]) -> str:
    """`` Before, rank 0's Split #1 (t.py:32) met rank 1's from t.py:28.``: where the odd ranks and
    the rest had parted ways in an earlier collective (:func:`_met_elsewhere`), each side's from one
    line: the call more or the call skipped is there (cpl-library#7: a wrapper's split, then the
    library's own)."""
    if not f.odd or f.call.is_p2p:
        return ""
    met = _met_elsewhere(f.odd, rest, ranks, before=f.entered[f.odd[0]])
    if met is None:
        return ""
    call, site = met
    whose = f"rank {f.odd[0]}'s" if len(f.odd) == 1 else f"{rank_list(f.odd)}'"
    return f" Before, {whose} {describe_call(call)} met {rank_list(rest)}'s from {site}."


def _odd_line(f: Disagreement, rest: list[int]) -> str:
    """`` Rank 0's call came from t.py:433, the others' from t.py:430.``: where the odd ranks'
    collective came from one line and the rest's from another (a call the others never make); with
    the line of the user's that called the function it is in (``t.py:9 (called at t.py:12)``)."""
    odd = {(f.entered[r].site, f.entered[r].outer[:1]) for r in f.odd}
    others = {f.entered[r].site for r in rest}
    if f.call.is_p2p or len(odd) != 1 or len(others) != 1 or {site for site, _ in odd} == others:
        return ""
    whose = f"Rank {f.odd[0]}'s call" if len(f.odd) == 1 else f"{rank_list(f.odd).capitalize()}' calls"
    [(site, outer)] = odd
    called = f" (called at {outer[0]})" if outer else ""
    return f" {whose} came from {site}{called}, the others' from {others.pop()}."


def _slow_ranks(f: SlowRanks, ranks: dict[int, RankState]) -> str:
    waited = "; ".join(
        f"rank {r}'s {describe_call(call)} timed out" for r, call in sorted(f.reporters.items())
    )
    late = [r for r in f.slow if r not in f.reporters]
    how = f"; {_failures(late, ranks)}" if any(ranks[r].failed for r in late) else ""
    return f"{waited}: torch names {rank_list(f.slow)} as not arriving in time{how}."


def _timed_out(f: TimedOut, ranks: dict[int, RankState]) -> str:
    return f"timed out after {f.seconds:g} s: {_activity(f.described, ranks, f.waits)}."


def _grace_over(f: GraceOver, ranks: dict[int, RankState]) -> str:
    later = _activity(f.unfinished, ranks, f.waits)
    return f"{_failures(f.failed, ranks, f.woken)}; {f.grace:g} s later {later}."


def _failures_text(f: Failures, ranks: dict[int, RankState]) -> str:
    return _failures(f.failed, ranks, f.woken) + "."


def _none_finished(f: NoneFinished, ranks: dict[int, RankState]) -> str:
    injected = [r for r in f.ranks if ranks[r].died_as_injected]
    if injected == f.ranks:
        return (
            f"no rank ran the test to its end: injected faults ended every rank: {_failures(f.ranks, ranks)}."
        )
    ended = f"; {rank_list(injected)} by injected faults" if injected else ""
    return f"no rank ran the test to its end: {_failures(f.ranks, ranks)}{ended}."


def _setting_differs(f: SettingDiffers, ranks: dict[int, RankState]) -> str:
    gave = ", ".join(
        f"{rank_list(group)} gave {value} ({f.values[group[0]].site})"
        for value, group in grouped(f.values, lambda r: f.values[r].value)
    )
    name = f.values[min(f.values)].name
    return f"{rank_list(f.values)} disagree on {name}: {gave}.{_came_of_it(f.then, ranks)}"


def _cut_on_purpose(f: CutOnPurpose, ranks: dict[int, RankState]) -> str:
    injected = "; ".join(
        fault.text for r in f.cut for fault in ranks[r].injected if fault.action == "disconnect"
    )
    return f"{injected} (faults.disconnect).{_came_of_it(f.then, ranks)}"


def _came_of_it(then: Verdict, ranks: dict[int, RankState]) -> str:
    """The verdict a cause was found behind, in words, after that cause."""
    finding = then.finding
    return f" What came of it: {_WORDERS[type(finding)](finding, ranks)}" if finding is not None else ""


_WORDERS: dict[type, Callable[..., str]] = {
    Departed: _departed,
    LeftMidCall: _left_mid_call,
    ExtraCall: _extra_call,
    Cycle: _cycle,
    NoSuchPeer: _no_such_peer,
    MembersDiffer: _members_differ,
    Disagreement: _disagreement,
    InitFault: init_fault_words,
    SlowRanks: _slow_ranks,
    TimedOut: _timed_out,
    GraceOver: _grace_over,
    Failures: _failures_text,
    NoneFinished: _none_finished,
    SettingDiffers: _setting_differs,
    CutOnPurpose: _cut_on_purpose,
}


def _failed_alike(f: Failures, ranks: dict[int, RankState]) -> str | None:
    """Ranks that failed alike, and nothing else: their error first (``fixture 'x' not found (ranks
    0, 1).``), as pytest's short summary shows what fits of it after the test's id; else None."""
    def error(r: int) -> str | None:
        failed = failed_outside_calls(ranks[r])
        return None if failed is None else failed[0]

    [(how, alike), *others] = grouped(f.failed, error)
    if others or f.woken or how is None or how == "failed":
        return None
    return f"{how} ({rank_list(alike)})."  # the line each raised at: in its line of the report


def worded(verdict: Verdict, states: list[RankState]) -> Verdict:
    """The verdict with its summary: its finding in words."""
    finding = verdict.finding
    if finding is None:
        return verdict
    ranks = {s.rank: s for s in states}
    alike = _failed_alike(finding, ranks) if isinstance(finding, Failures) else None
    return dataclasses.replace(verdict, summary=alike or _WORDERS[type(finding)](finding, ranks))

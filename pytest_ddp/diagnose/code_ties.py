"""Ties the user's code breaks, where the run's history cannot: a rank whose code skipped a
call, made a call in a branch for it alone, left by a break of its own, or went a step further
in a loop over its own data.  Pure: the verdict, the ranks and the source text in
(:mod:`pytest_ddp.diagnose.code_paths` walks the ways of a function's code,
:mod:`pytest_ddp.diagnose.rank_tests` says which ranks a line runs on); a verdict that names the
rank out, or None where the code does not tell."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Literal

from pytest_ddp.diagnose import code_paths, majority, own_lines, rank_tests
from pytest_ddp.diagnose.source_text import Source
from pytest_ddp.diagnose.state import Call, LeftBy, RankState, ops_made, site_parts
from pytest_ddp.diagnose.verdicts import Cycle, Departed, Disagreement, ExtraCall, Verdict
from pytest_ddp.diagnose.waits import collective_at


def skipped_in_code(verdict: Verdict, ranks: dict[int, RankState], source: Source) -> Verdict | None:
    """A two-rank tie its history cannot break (:func:`pytest_ddp.diagnose.majority.likely`):
    where one rank's code has no call-free way from its previous call to its current one
    (:mod:`pytest_ddp.diagnose.code_paths`: it skipped a call) while the other's has, that rank is
    the likely culprit."""
    finding = verdict.finding
    if isinstance(finding, Disagreement) and not finding.likely and not finding.after:
        entered = finding.entered
    elif isinstance(finding, Cycle) and finding.p2p and not finding.after:
        entered = {r: finding.waits[r].call for r in finding.culprits}
    else:
        return None
    if len(entered) != 2:
        return None
    before, _ = majority.paths(ranks, entered)
    if len(before) != 2:
        return None
    between = {r: _calls_between(before[r], entered[r], ranks, source) for r in entered}
    skipped = {r: (before[r], entered[r], lines) for r, lines in between.items() if lines}
    if len(skipped) != 1 or None in between.values():
        return None
    return dataclasses.replace(verdict, finding=dataclasses.replace(finding, skipped=skipped))


def one_rank_call(verdict: Verdict, ranks: dict[int, RankState], source: Source) -> Verdict | None:
    """As many ranks wait in one collective as returned without it (no majority: the returned are
    named), and the code makes that call only on one rank (:func:`pytest_ddp.diagnose.rank_tests.
    one_rank_branch`: ``if rank == 0:``, ``if trainer.is_global_zero:``): that rank is at fault,
    in a call its peers never make, as the majority would say with a rank more
    (:func:`pytest_ddp.diagnose.majority.extra_call`).  The field's reports of such code (a
    collective by name under ``if rank == 0:``, a metric's compute or a checkpoint's save under
    ``is_global_zero``) all end with the call taken out of the branch (docs/field.md).  A call
    every rank but one makes (``if rank != 1:``) stays the skip of the one that returned."""
    finding = verdict.finding
    if not isinstance(finding, Departed) or verdict.kind != "partial" or finding.victims or finding.broken:
        return None
    callers = sorted(finding.doomed)
    if len(callers) != len(finding.culprits):
        return None
    call = finding.waits[callers[0]].call
    if any(ranks[r].ended(call.group) for r in finding.culprits):
        return None  # the rank that returned ended the group: it is the cause, whatever branch the call is in
    same = (call.site, call.group, call.seq)
    if not call.is_collective or any((w.call.site, w.call.group, w.call.seq) != same
                                     for w in (finding.waits[r] for r in callers)):
        return None  # the callers are not all in the one call
    waits = {r: finding.waits[r] for r in callers}
    branch = _one_rank_branch(call, callers[0] if len(callers) == 1 else None, source)
    if branch is not None:
        condition, made_from = branch
        extra = ExtraCall(callers, finding.culprits, waits, condition, made_from=made_from)
        return Verdict(verdict.status, "partial", callers, [], call.op, call.label, extra)
    if len(callers) != 1 or len(finding.culprits) != 1:
        return None
    earlier = _met_from_another_line(callers[0], finding.culprits[0], ranks, source)
    if earlier is None:
        return None
    more, (condition, made_from), met = earlier
    extra = ExtraCall(callers, finding.culprits, waits, condition, made_from=made_from, earlier=more, met=met)
    return Verdict(verdict.status, "partial", callers, [], more.op, more.label, extra)


def _met_from_another_line(
    caller: int, returned: int, ranks: dict[int, RankState], source: Source
) -> tuple[Call, tuple[str, str | None], str] | None:
    """(the caller's call, the branch holding it and the line there, the line the returned rank's
    call came from) where the first collective in which the two came by different lines of the
    user's code was the caller's made in a branch of the code for it alone, the other's under no
    test of the rank, and every later call of the caller's on that group came as the other's from
    that one on: the caller made a call more there, which met the other's next one, and so waits
    alone at the end (netket#2275: ``if rank == 0: err = get_stats(stats)``, a helper that
    all-reduces, before every rank's final ``get_stats``); None where they came no such way."""
    if not ranks[returned].alive or ranks[returned].failed:
        return None
    for own in (c for c in ranks[caller].calls if c.is_collective):
        theirs = collective_at(ranks[returned], own.group, own.seq)
        if theirs is None:
            return None
        if (own.site, own.outer) == (theirs.site, theirs.outer):
            continue
        mine, others = (_collectives_on(ranks[r], own.group) for r in (caller, returned))
        at = next(i for i, c in enumerate(mine) if c is own)  # the same place among the other's
        if _ways(mine[at + 1:]) != _ways(others[at:]):  # a call more: the rest of the caller's, one later
            return None
        branch = _one_rank_branch(own, caller, source)
        if branch is None or _under_rank_test(theirs, source) is not False:
            return None
        return own, branch, (theirs.outer or (theirs.site,))[0]
    return None


def _collectives_on(state: RankState, group: str) -> list[Call]:
    """The rank's collectives on ``group``, in order."""
    return [c for c in state.calls if c.is_collective and c.group == group]


def _ways(calls: list[Call]) -> list[tuple[str | None, tuple[str, ...]]]:
    """The line and the user's lines that led to each call."""
    return [(c.site, c.outer) for c in calls]


def left_by_own_branch(verdict: Verdict, ranks: dict[int, RankState], source: Source) -> Verdict | None:
    """Two ranks tied where one, as its code tells, left by a ``break`` or ``return`` in a branch of
    the code for it alone, or under a test of a value that differs between ranks
    (:func:`pytest_ddp.diagnose.code_paths.leaves_in_own_branch`), and the other's call is under no
    test of the rank: the first departed from the code its peer runs, and is named alone, as
    :func:`one_rank_call` names a caller in a branch for it.  Either a step more or a step less
    (``Departed.alike``) whose rank that returned left so after its last call
    (:func:`pytest_ddp.diagnose.own_lines.left_by`; speechbrain#2051: an early stop decided on the
    main process only), or two calls that differ (``Disagreement``) where one rank left so the
    function the other's call is in, before that call (hoomd-blue#54: ``if world.rank == 1:
    return`` before a ``Split`` the other makes, while it waits in the next ``Barrier``), or the
    loop the other's call is in, after a call there (transformers#17478: a patience counter of
    each process's own metric breaks one out of training, to the final barrier).  Where none left
    so, and the rank still in the loop is in one over values that differ between ranks
    (:func:`pytest_ddp.diagnose.rank_tests.uneven_loop`), that rank made a step more."""
    finding = verdict.finding
    if isinstance(finding, Departed) and finding.alike and len(finding.culprits) == 1:
        if any(_under_rank_test(finding.waits[r].call, source) is not False for r in finding.alike):
            return None
        if ranks[finding.culprits[0]].left_by is None:
            found = own_lines.ways_out(ranks[finding.culprits[0]], ranks, source)
            # no way out of its own: the loop's end; several, or the code cannot tell: a tie
            return _step_more(verdict, finding, source) if found is not None and not found[1] else None
        waiting = sorted(set(verdict.waiting) | set(finding.alike))
        return dataclasses.replace(verdict, culprits=finding.culprits, waiting=waiting,
                                   finding=dataclasses.replace(finding, alike=[]))
    if not isinstance(finding, Disagreement) or len(finding.entered) != 2 or _broken_tie(finding):
        return None
    if any(_under_rank_test(call, source) is not False for call in finding.entered.values()):
        return None
    left: dict[int, LeftBy] = {}
    a, b = finding.entered
    for rank, other in ((a, b), (b, a)):
        leave = _left_before(rank, finding.entered[rank], finding.entered[other], ranks, source)
        if leave is False:
            return None
        if leave is not None:
            left[rank] = leave
    if not left:
        return _loop_stayed_in(verdict, finding, ranks, source)
    if len(left) != 1:
        return None
    [(culprit, where)] = left.items()
    return _odd_one(verdict, dataclasses.replace(finding, odd=[culprit], left=where))


def _left_before(
    rank: int, own: Call, call: Call, ranks: dict[int, RankState], source: Source
) -> LeftBy | Literal[False] | None:
    """How ``rank``, now in its call ``own``, left by its code before the peer's ``call``: from the
    start of the function holding it, or, where the rank made a call at its line before, from
    there; None where it took no such way; False where the code cannot tell."""
    file, line = site_parts(call.site)
    text = source(file)
    if text is None or line is None:
        return False
    made = ops_made(ranks.values(), file)
    leaves = code_paths.leaves_in_own_branch(text, line, made, rank, from_entry=True)
    if leaves is None:
        return False
    if not leaves and any(c.site == call.site for c in ranks[rank].calls[:own.index]):
        leaves = code_paths.leaves_in_own_branch(text, line, made, rank) or []
    own_file, own_line = site_parts(own.site)
    # a way out of the loop or function the rank's own call is in is not the way it took
    leaves = [leave for leave in leaves if own_file != file or not (
        own_line is not None and leave.leaves[0] <= own_line <= leave.leaves[1])]
    if not leaves:
        return None
    return own_lines.as_left_by(file, leaves[0])


def _step_more(verdict: Verdict, finding: Departed, source: Source) -> Verdict | None:
    """A step more on the ranks that went on (``Departed.alike``), where each waits in a loop over
    values that differ between ranks (:func:`pytest_ddp.diagnose.rank_tests.uneven_loop`): uneven
    inputs (pytorch#38174)."""
    loops = {_found_at(finding.waits[r].call, source, rank_tests.uneven_loop) for r in finding.alike}
    if len(loops) != 1 or None in loops:
        return None
    callers = finding.alike
    waits = {r: finding.waits[r] for r in callers}
    call = waits[callers[0]].call
    extra = ExtraCall(callers, finding.culprits, waits, loop=loops.pop())
    return Verdict(verdict.status, "partial", callers, [], call.op, call.label, extra)


def _loop_stayed_in(
    verdict: Verdict, finding: Disagreement, ranks: dict[int, RankState], source: Source
) -> Verdict | None:
    """Of two ranks in calls that differ, the one whose call is in a loop over values that differ
    between ranks, which the other made a call in before and left (uneven inputs, then the others'
    barrier at the epoch's end): that rank made a step more."""
    loops = {r: _found_at(call, source, rank_tests.uneven_loop) for r, call in finding.entered.items()}
    found: dict[int, str] = {}
    for rank, call in finding.entered.items():
        [other] = [r for r in finding.entered if r != rank]
        before = ranks[other].calls[:finding.entered[other].index]
        loop = loops[rank]
        if loop is not None and loops[other] != loop and any(c.site == call.site for c in before):
            found[rank] = loop
    if len(found) != 1:
        return None
    [(culprit, loop)] = found.items()
    return _odd_one(verdict, dataclasses.replace(finding, odd=[culprit], loop=loop))


def _odd_one(verdict: Verdict, finding: Disagreement) -> Verdict:
    """The verdict naming the odd ranks of ``finding`` (with what the code tells of them) alone."""
    others = [r for r in finding.entered if r not in finding.odd]
    call = finding.entered[finding.odd[0]]
    return Verdict(verdict.status, verdict.kind, finding.odd, others, call.op, call.label, finding)


def _cycle_naming(verdict: Verdict, cycle: Cycle, named: list[int]) -> Verdict:
    """The verdict naming ``named`` of the cycle (with what the code tells of them) alone, the
    rest of it and the ranks behind it waiting."""
    others = sorted((set(cycle.culprits) | set(cycle.waiting)) - set(named))
    call = cycle.waits[named[0]].call
    return Verdict(verdict.status, verdict.kind, named, others, call.op, call.label, cycle)


def _broken_tie(finding: Disagreement) -> bool:
    """Something recorded or the code already tells the tied ranks apart."""
    return bool(finding.odd or finding.likely or finding.after or finding.skipped or finding.condition)


def one_rank_branch_tie(verdict: Verdict, ranks: dict[int, RankState], source: Source) -> Verdict | None:
    """Ranks that entered one collective in ways that differ, two and tied, or that wait on each other
    in a send or receive no call of the other's will match (p2p_unmatched), where nothing recorded
    tells them apart, and one's call is made in a branch of the code for one rank (:func:`_one_rank_branch`)
    while the others' are under no test of the rank (:func:`_under_rank_test`): the first made a call
    its peers' code never makes there, and is at fault, as :func:`one_rank_call` says where the peer
    returned (accelerate#2785: gather_for_metrics under ``is_main_process`` meets the others'
    ``wait_for_everyone``; Megatron-Bridge#6025: an evaluation schedule run on the last stage only
    waits to receive from a stage in a barrier).  An ``if``/``else`` on the rank stays a tie: each
    side's code is its own."""
    finding = verdict.finding
    if isinstance(finding, Disagreement) and len(finding.entered) == 2:
        if _broken_tie(finding):
            return None
        entered = finding.entered
    elif isinstance(finding, Cycle) and finding.unmatched and not (finding.after or finding.skipped):
        entered = {r: finding.waits[r].call for r in finding.culprits}
    else:
        return None
    branches: dict[int, str] = {}
    for rank, call in entered.items():
        branch = _one_rank_branch(call, rank, source)
        if branch is not None:
            branches[rank] = branch[0]
        elif _under_rank_test(call, source) is not False:
            return None  # on some ranks only, or the code cannot tell
    if len(branches) != 1:
        return None
    [(culprit, where)] = branches.items()
    others = sorted(r for r in entered if r != culprit)
    call = entered[culprit]
    if _both_sides_ran(where, call, [ranks[r] for r in others], ranks[culprit], source):
        return None  # an if/else on the rank both ran before, each its side: a loop's count differs
    if isinstance(finding, Cycle):
        return _cycle_naming(verdict, dataclasses.replace(finding, branch={culprit: where}), [culprit])
    return _odd_one(verdict, dataclasses.replace(finding, odd=[culprit], condition=where))


def ranks_branch_cycle(verdict: Verdict, ranks: dict[int, RankState], source: Source) -> Verdict | None:
    """Ranks that wait for each other in collectives of two kinds (a mismatch of order), where
    nothing recorded tells them apart, and one kind's calls are made in a branch of the code that
    those ranks alone take (:func:`pytest_ddp.diagnose.rank_tests.branch_for_ranks`: ``if rank in
    (0, 1):``), the call's line or a line of the user's that led to it, while the others' calls are
    under no test of the rank: those ranks made a call their peers' code never makes there, and are
    at fault, as :func:`one_rank_branch_tie` says of one rank (llm-compressor#2869: a ``new_group``
    of every rank, made in a context the ranks of a subgroup enter)."""
    finding = verdict.finding
    if not isinstance(finding, Cycle) or finding.p2p or finding.unmatched or finding.after or finding.skipped:
        return None
    calls = {r: finding.waits[r].call for r in finding.culprits}
    kinds: dict[tuple[str, str], list[int]] = {}
    for r in sorted(calls):
        kinds.setdefault((calls[r].site, calls[r].op), []).append(r)
    if len(kinds) != 2:
        return None
    branches: dict[int, str] = {}
    for inside in kinds.values():
        outside = [r for r in calls if r not in inside]
        tested = functools.partial(rank_tests.branch_for_ranks, inside=inside, outside=outside)
        where = _found_at(calls[inside[0]], source, tested)
        if where is not None:
            branches.update((r, where) for r in inside)
        elif _under_rank_test(calls[inside[0]], source) is not False:
            return None  # on some ranks only, or the code cannot tell
    if not branches or len(branches) == len(calls):
        return None
    return _cycle_naming(verdict, dataclasses.replace(finding, branch=branches), sorted(branches))


def collective_before_send(verdict: Verdict, ranks: dict[int, RankState], source: Source) -> Verdict | None:
    """Two ranks, one waiting in a receive from the other, which waits in a collective instead
    (p2p_unmatched), where nothing recorded or the branches of the code tell them apart, and the
    collective came from a line of the user's that the receiving rank's code reaches only after the
    line its receive came from, and with what it received, while the other's code sends after that
    line, having made no send or receive with it from the receive's statement
    (:func:`pytest_ddp.diagnose.code_paths.sends_after`): that rank entered the collective before
    the send its peer needs to get there, and is at fault (sglang#24687: the first pipeline stage
    runs a request's barrier before it forwards the requests to the next stage)."""
    finding = verdict.finding
    if not isinstance(finding, Cycle) or len(finding.unmatched) != 1 or len(finding.culprits) != 2:
        return None
    if finding.after or finding.skipped:
        return None
    [receiver] = finding.unmatched
    [sender] = [r for r in finding.culprits if r != receiver]
    recv, collective = finding.waits[receiver].call, finding.waits[sender].call
    if not recv.is_recv or recv.peer != sender or not collective.is_collective:
        return None
    (file, waited), (other, entered) = (site_parts((c.site, *c.outer)[-1]) for c in (recv, collective))
    text = source(file) if file == other else None
    if text is None or waited is None or entered is None:
        return None
    exchanged = [line for c in ranks[sender].calls if c.is_p2p and c.peer == receiver
                 for f, line in map(site_parts, (c.site, *c.outer)) if f == file and line is not None]
    sent = code_paths.sends_after(text, waited, entered, sender, receiver, exchanged)
    if sent is None:
        return None
    cycle = dataclasses.replace(finding, sent_after={sender: (f"{file}:{entered}", f"{file}:{sent}")})
    return _cycle_naming(verdict, cycle, [sender])


def _both_sides_ran(
    branch: str, call: Call, peers: list[RankState], state: RankState, source: Source
) -> bool:
    """The rank made ``call``'s call from its line before (one of a batch's other calls there does
    not count), in the body of the ``if`` at ``branch`` (``file:line``), and a peer a call from its
    ``else`` (or ``elif``): an if/else on the rank that both went through before, each its own side
    (TensorRT-LLM#9659: a pipeline's send and receive by role, in a loop whose count differs
    between ranks), not code the peers never run there."""
    file, line = site_parts(branch)
    text = source(file)
    orelse = None if text is None or line is None else rank_tests.else_lines(text, line)
    if orelse is None or not any((c.site, c.op) == (call.site, call.op) for c in state.calls[:call.index]):
        return False
    first, last = orelse
    return any(f == file and n is not None and first <= n <= last
               for peer in peers for c in peer.calls for f, n in map(site_parts, (c.site, *c.outer)))


def own_group_forgotten(verdict: Verdict, ranks: dict[int, RankState], source: Source) -> Verdict | None:
    """Ranks that entered one collective in ways that differ, where the most (the majority, not the
    odd few) made their call on a group wider than themselves right after a collective on a group
    of exactly them, in a branch of the code that they alone take (:func:`pytest_ddp.diagnose.
    rank_tests.branch_for_ranks`), the call's line or a line of the user's that led to it, while the
    few's calls are under no test of the rank: the most made a call meant for their own group on
    the wider one, a ``group=`` forgotten, and are at fault, not the ranks outside their branch
    (vllm#3401: broadcast_tensor_dict sends its metadata on the tensor-parallel group, then each
    tensor on the world)."""
    finding = verdict.finding
    if not isinstance(finding, Disagreement) or not finding.odd or finding.own_group or finding.overflow:
        return None
    members = sorted(r for r in finding.entered if r not in finding.odd)
    calls = [finding.entered[r] for r in members]
    call = calls[0]
    if len(members) < 2 or not call.is_collective or any(
            (c.site, c.op, c.group) != (call.site, call.op, call.group) for c in calls):
        return None
    before = [_collective_before(ranks[r], c) for r, c in zip(members, calls)]
    own = before[0]
    if own is None or any(b is None or (b.site, b.group) != (own.site, own.group) for b in before):
        return None
    if sorted(own.group_ranks) != members or not set(members) < set(call.group_ranks):
        return None
    outside = sorted(set(call.group_ranks) - set(members))  # the ranks of its group that do not take it
    tested = functools.partial(rank_tests.branch_for_ranks, inside=members, outside=outside)
    where = _found_at(call, source, tested)
    if where is None or any(_under_rank_test(finding.entered[r], source) is not False for r in finding.odd):
        return None
    return _odd_one(verdict, dataclasses.replace(finding, odd=members, condition=where, own_group=own))


def _collective_before(state: RankState, call: Call) -> Call | None:
    """The rank's last collective before ``call``, on any group; None where it made none."""
    return next((c for c in reversed(state.calls[:call.index]) if c.is_collective), None)


def _one_rank_branch(call: Call, rank: int | None, source: Source) -> tuple[str, str | None] | None:
    """``file:line`` of the branch of the code for one rank (:func:`pytest_ddp.diagnose.rank_tests.
    one_rank_branch`) that holds the call's line, or a line of the user's code that led to it (a
    function called under ``if rank == 0:``, speechbrain#2401), or of a test of a value kept on
    ``rank``, the one caller, alone (:func:`pytest_ddp.diagnose.rank_tests.one_rank_value_test`),
    or passed by the line that led to it to a parameter such a test reads
    (:func:`pytest_ddp.diagnose.rank_tests.one_rank_value_passed`), and ``file:line`` of the line
    it holds where that is not the call's own (None: the call's); None where none does, as far as
    the code tells."""
    inner: tuple[str, int] | None = None  # the text and line of the place before, called from this one
    for place in _places(call, source):
        if place is None:
            inner = None
            continue
        file, text, line = place
        branch = rank_tests.one_rank_branch(text, line)
        kept = None
        if branch is None and rank is not None:  # a value kept on one rank: only the caller's counts
            kept = rank_tests.one_rank_value_test(text, line)
            if kept is None and inner is not None:
                kept = rank_tests.one_rank_value_passed(*inner, text, line)
        if kept is not None and kept[1] == rank:
            branch = kept[0]
        if branch is not None:
            held = f"{file}:{line}"
            return f"{file}:{branch}", None if held == call.site else held
        inner = text, line
    return None


def _under_rank_test(call: Call, source: Source) -> bool | None:
    """Whether the call's line, or a line of the user's code that led to it, is under a test of
    the rank (:func:`pytest_ddp.diagnose.rank_tests.under_rank_test`); None where the code of one
    cannot tell."""
    found: bool | None = False
    for place in _places(call, source):
        under = None if place is None else rank_tests.under_rank_test(place[1], place[2])
        if under:
            return True
        if under is None:
            found = None
    return found


def _found_at(call: Call, source: Source, question: Callable[[str, int], int | None]) -> str | None:
    """``file:line`` of the first answer to ``question`` (of a file's text and a line) about the
    call's line, or a line of the user's code that led to it; None where none answers."""
    for place in _places(call, source):
        answer = None if place is None else question(place[1], place[2])
        if place is not None and answer is not None:
            return f"{place[0]}:{answer}"
    return None


def _places(call: Call, source: Source) -> Iterator[tuple[str, str, int] | None]:
    """The call's line, then each line of the user's code that led to it (``Call.outer``): its
    file, that file's text and the line; None where the text cannot be read."""
    for place in (call.site, *call.outer):
        file, line = site_parts(place)
        text = source(file)
        yield None if text is None or line is None else (file, text, line)


def _calls_between(before: Call, call: Call, ranks: dict[int, RankState], source: Source) -> list[str] | None:
    """The sites of the calls the code makes on every way from ``before`` to ``call`` (one file),
    by the op each line's calls were, made there and not inside a library; None if it cannot tell."""
    (file, start), (other, end) = site_parts(before.site), site_parts(call.site)
    text = source(file) if file == other else None
    if text is None or start is None or end is None:
        return None
    lines = code_paths.calls_between(text, start, end, ops_made(ranks.values(), file))
    return None if lines is None else [f"{file}:{line}" for line in lines]

"""The ranks' collective sequences side by side, where they part ways, and unmatched sends and receives.

Each group's collectives around the first number where the ranks' calls differ (op, shape,
dtype, root, or a rank that did not make it); the *divergence* names that collective, the ranks
on each side and the minority, as the Flight Recorder analyzer does.  The shared prefix is
compared in C (:func:`pytest_ddp.diagnose.mismatches.shared_prefix`), so a long run costs one pass.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from operator import attrgetter, lt

from pytest_ddp.common.ops import COLLECTIVES, TORCH_P2P
from pytest_ddp.diagnose.mismatches import shared_prefix
from pytest_ddp.diagnose.phrases import grouped, rank_list
from pytest_ddp.diagnose.state import Call, RankState

GROUP_ABOVE = 8  # more ranks than this: ranks alike share a line, a column, a stack section
SEQUENCE_CONTEXT = 3  # collectives shown before and after the first divergence


@dataclass
class RankSequence:
    """One rank's collectives on one group, in the order it made them."""

    calls: list[Call]
    seqs: list[int]
    # None while the numbers only grow (found by bisection); else, for a group made again under
    # the same name, each number's latest call.
    latest: dict[int, Call] | None

    @classmethod
    def of(cls, calls: list[Call]) -> RankSequence:
        seqs = list(map(attrgetter("seq"), calls))
        ordered = all(map(lt, seqs, seqs[1:]))
        return cls(calls, seqs, None if ordered else dict(zip(seqs, calls)))

    def at(self, seq: int) -> Call | None:
        """The call numbered ``seq``; the latest such if the numbers started over."""
        if self.latest is not None:
            return self.latest.get(seq)
        i = bisect_left(self.seqs, seq)
        return self.calls[i] if i < len(self.seqs) and self.seqs[i] == seq else None


@dataclass
class GroupSequences:
    """One group's collectives on each of its members."""

    name: str
    members: tuple[int, ...]  # () when the recorder did not list them
    by_rank: dict[int, RankSequence]
    last: int  # the highest number any member reached
    diverges: int | None  # the first number where the members' calls differ


def group_sequences(states: list[RankState]) -> list[GroupSequences]:
    """Each group's sequences, groups in the order they first appear."""
    collectives = {s.rank: [c for c in s.calls if c.op in COLLECTIVES] for s in states}
    members: dict[str, tuple[int, ...]] = {}
    for calls in collectives.values():
        for name in dict.fromkeys(map(attrgetter("group"), calls)):
            if name not in members:
                members[name] = next(c.group_ranks for c in calls if c.group == name)
    groups = []
    for name, listed in members.items():
        by_rank = {}
        for s in states:
            if listed and s.rank not in listed:
                continue
            calls = collectives[s.rank]
            if len(members) > 1:
                calls = [c for c in calls if c.group == name]
            by_rank[s.rank] = RankSequence.of(calls)
        last = max((max(seq.seqs, default=0) for seq in by_rank.values()), default=0)
        if last:
            groups.append(GroupSequences(name, listed, by_rank, last, _first_divergence(by_rank, last)))
    return groups


def _first_divergence(by_rank: dict[int, RankSequence], last: int) -> int | None:
    """The first number where the members' calls differ by signature, or only some made it."""
    sequences = list(by_rank.values())
    start = 1
    if all(s.latest is None for s in sequences):
        # Skip the prefix the ranks share call for call (same numbers and signatures there).
        shared = shared_prefix([s.calls for s in sequences])
        start = sequences[0].seqs[shared - 1] + 1 if shared else 1
    for seq in range(start, last + 1):
        cells = [s.at(seq) for s in sequences]
        if len({c.signature() if c else None for c in cells}) > 1:
            return seq
    return None


def _cell(call: Call | None, with_site: bool = False) -> str:
    if call is None:
        return "-"
    shapes = ",".join("x".join(str(d) for d in shape) or "scalar" for shape in call.shapes)
    text = call.kind.method + (f" [{shapes}]" if shapes else "")
    if call.dtypes:
        text += " " + ",".join(sorted(set(call.dtypes)))
    if call.root is not None:
        text += f" root={call.root}"
    if with_site:  # ranks met in this collective from different lines: say where each came from
        text += f" at {call.site}" + (f" via {call.caller}" if call.caller else "")
    if call.state == "running":
        text += " (waiting)"
    elif call.state == "raised":
        text += " (raised)"
    return text


def _sites_differ(calls: list[Call | None]) -> bool:
    return len({(c.site, c.caller) for c in calls if c is not None}) > 1


def table(groups: list[GroupSequences]) -> list[str]:
    """The sequence table of these groups; above :data:`GROUP_ABOVE` ranks, alike ranks share a column."""
    lines: list[str] = []
    for group in groups:
        centre = group.diverges if group.diverges is not None else group.last
        first, end = max(1, centre - SEQUENCE_CONTEXT), min(group.last, centre + SEQUENCE_CONTEXT)
        numbers = range(first, end + 1)
        ranks = sorted(group.by_rank)
        cells = {r: [group.by_rank[r].at(seq) for seq in numbers] for r in ranks}
        columns = {r: tuple(map(_cell, cells[r])) for r in ranks}
        heads: dict[tuple[str, ...], list[int]] = {}
        for r in ranks:  # one column per rank, or per set of ranks alike
            heads.setdefault(columns[r] if len(ranks) > GROUP_ABOVE else (str(r),), []).append(r)
        shown = [(rank_list(together), columns[together[0]]) for together in heads.values()]
        rows = [["#"] + [head for head, _ in shown]]
        rows += [[str(seq)] + [column[i] for _, column in shown] for i, seq in enumerate(numbers)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        members = "" if group.name == "WORLD" else f" {list(group.members)}"
        lines.append(f"collectives on group {group.name}{members}:")
        for row, row_seq in zip(rows, [None, *numbers]):
            text = "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            mark = "  <-- ranks differ" if row_seq is not None and row_seq == group.diverges else ""
            lines.append("  " + text + mark)
        for i, seq in enumerate(numbers):
            lines += _sites_line(seq, {r: cells[r][i] for r in ranks})
    return lines


def _sites_line(seq: int, calls: dict[int, Call | None]) -> list[str]:
    """``  #2 called at test_x.py:20 (ranks 0-2), test_x.py:18 (rank 3)``: under the table, once
    for a collective the ranks met in from different lines (its cells do not repeat them)."""
    if not _sites_differ(list(calls.values())):
        return []
    made = {r: c for r, c in calls.items() if c is not None}
    sites = grouped(made, lambda r: made[r].site + (f" via {made[r].caller}" if made[r].caller else ""))
    where = ", ".join(f"{site} ({rank_list(ranks)})" for site, ranks in sites)
    return [f"  #{seq} called at {where}"]


MAX_PAIRS = 10  # pairs listed in the p2p table, the first by rank


def p2p_table(states: list[RankState]) -> list[str]:
    """Each group's pairs of ranks whose sends and receives do not match in number, or that one
    still waits in: ``rank 0 -> rank 1 on WORLD: 2 sends, 1 recv; rank 0 waits in send #2 to 1``."""
    made: dict[tuple[str, int, int], list[int]] = {}  # (group, from, to) -> [sends, recvs]
    waiting: dict[tuple[str, int, int], list[tuple[int, int, Call]]] = {}  # -> (recv?, rank, call)
    # An isend or irecv a rank waits for, not one just issued.
    waited = {(s.rank, s.waiting_on) for s in states}
    for state in states:  # one pass over every call, in plain attribute reads (millions at scale)
        for call in state.calls:
            if (recv := TORCH_P2P.get(call.op)) is None or call.peer is None:
                continue
            key = (call.group, call.peer, state.rank) if recv else (call.group, state.rank, call.peer)
            (made.get(key) or made.setdefault(key, [0, 0]))[recv] += 1
            if call.exit is None and (call.blocks or (state.rank, call.index) in waited):
                waiting.setdefault(key, []).append((recv, state.rank, call))
    lines: list[str] = []
    for (group, sender, receiver), (sends, recvs) in made.items():
        if sends == recvs and (group, sender, receiver) not in waiting:
            continue
        counts = f"{sends} send{'s' * (sends != 1)}, {recvs} recv{'s' * (recvs != 1)}"
        waits = sorted(waiting.get((group, sender, receiver), []), key=lambda w: w[0])
        where = "".join(f"; rank {rank} waits in {c.label} ({c.site})" for _, rank, c in waits)
        lines.append(f"  rank {sender} -> rank {receiver} on {group}: {counts}{where}")
    if len(lines) > MAX_PAIRS:  # 511 ranks waiting for one: the rank lines above say who waits
        lines[MAX_PAIRS:] = [f"  ... and {len(lines) - MAX_PAIRS} more pairs"]
    return ["sends and receives that do not match:", *lines] if lines else []


@dataclass(frozen=True)
class Divergence:
    """The first collective where the ranks part ways: who did what there."""

    group: str
    seq: int
    call: str  # its label, as the majority (else the lowest rank that made it) made it
    sides: list[tuple[str, list[int]]]  # what some ranks did there -> those ranks; the largest side first
    minority: list[int]  # the ranks not on the largest side; empty when no side is larger than every other


def divergence(groups: list[GroupSequences], absent: dict[int, str]) -> Divergence | None:
    """Where the ranks first part ways; ``absent``: what to say of a rank that did not get there."""
    for group in groups:
        if group.diverges is None:
            continue
        seq = group.diverges
        made = {r: s.at(seq) for r, s in sorted(group.by_rank.items())}
        with_site = _sites_differ(list(made.values()))
        sides: dict[str, list[int]] = {}
        for r, call in made.items():
            did = f"entered {_cell(call, with_site)}" if call is not None else absent[r]
            sides.setdefault(did, []).append(r)
        ordered = sorted(sides.items(), key=lambda side: (-len(side[1]), side[1][0]))
        tie = len(ordered) > 1 and len(ordered[0][1]) == len(ordered[1][1])
        majority = [] if tie else ordered[0][1]
        labelled = next(c for r in [*majority, *made] if (c := made[r]) is not None)
        minority = [] if tie else [r for r in made if r not in majority]
        return Divergence(group.name, seq, labelled.label, ordered, minority)
    return None


def divergence_line(found: Divergence) -> str:
    """``the ranks part ways at all_reduce #12 (minority: rank 63): ranks 0-62 entered all_reduce [4]
    float32 (waiting); rank 63 did not enter it, finished (passed)``."""
    odd = f"minority: {rank_list(found.minority)}" if found.minority else "no majority"
    sides = "; ".join(f"{rank_list(ranks)} {did}" for did, ranks in found.sides)
    return f"the ranks part ways at {found.call} ({odd}): {sides}"

"""Certain faults of ``init_process_group``, in tests that call it themselves: a rank out of
range, a rank passed twice, world sizes that differ, a process that raised in init or never
called it.  Pure (:mod:`pytest_ddp.diagnose.watchdog` asks it first).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pytest_ddp.common.ops import INIT
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import InitFault, Verdict


def latest_init(state: RankState) -> Call | None:
    """The process's latest init_process_group call."""
    return next((c for c in reversed(state.calls) if c.op == INIT), None)


def given(call: Call, name: str) -> int | None:
    """The rank or world size a process passed to init_process_group (or took from its environment)."""
    value = call.extra.get(name)
    return value if isinstance(value, int) else None


@dataclass
class _Inits:
    """What the init checks look at.  Processes are slots (RankState.rank); the rank and world
    size each one *passed* to init_process_group are in its call's ``extra``."""

    ranks: dict[int, RankState]
    calls: dict[int, Call]  # each slot's latest init_process_group
    blocked: list[int]  # slots blocked in it

    @property
    def live(self) -> dict[int, Call]:
        """The latest init_process_group of each live process: a dead one holds no rank and no
        world size (an elastic loop's survivors join again, one taking the dead one's rank)."""
        return {r: c for r, c in self.calls.items() if self.ranks[r].alive}


def init_fault(ranks: dict[int, RankState]) -> Verdict | None:
    """Certain faults of init_process_group, or None."""
    blocked = sorted(r for r, s in ranks.items() if (c := s.blocked_call) is not None and c.op == INIT)
    if not blocked:
        return None
    inits = _Inits(ranks, {r: c for r, s in ranks.items() if (c := latest_init(s)) is not None}, blocked)
    for check in (_init_out_of_range, _init_duplicate, _init_world_sizes, _init_raised, _init_never):
        fault = check(inits)
        if fault is not None:
            waiting = [r for r in blocked if r not in fault.culprits]
            return Verdict("deadlock", "init", fault.culprits, waiting, INIT, INIT, fault)
    return None


def _init_out_of_range(inits: _Inits) -> InitFault | None:
    culprits = []
    for r, c in sorted(inits.calls.items()):
        rank, size = given(c, "rank"), given(c, "world_size")
        if rank is not None and size is not None and not 0 <= rank < size:
            culprits.append(r)
    return InitFault("out_of_range", culprits, inits.blocked) if culprits else None


def _init_duplicate(inits: _Inits) -> InitFault | None:
    """Two processes with one rank: which of them gets in is a race, so blame the one that passed
    a rank other than its own slot number (it took another's rank), else the later ones to enter."""
    by_rank: dict[int, list[int]] = {}
    for r, c in sorted(inits.live.items(), key=lambda item: (item[1].enter, item[0])):
        if (rank := given(c, "rank")) is not None:
            by_rank.setdefault(rank, []).append(r)
    for rank, slots in sorted(by_rank.items()):
        if len(slots) < 2 or not set(slots) & set(inits.blocked):
            continue
        impostors = [s for s in slots if s != rank]
        culprits = impostors if 0 < len(impostors) < len(slots) else slots[1:]
        others = [s for s in slots if s not in culprits]
        return InitFault("duplicate", sorted(culprits), inits.blocked, rank, others)
    return None


def _init_world_sizes(inits: _Inits) -> InitFault | None:
    """World sizes differ: the minority is at fault.  On a tie, the size that matches the number of
    live processes wins, else the size of the first to enter."""
    sizes = {r: s for r, c in inits.live.items() if (s := given(c, "world_size")) is not None}
    if len(set(sizes.values())) < 2:
        return None
    counts = Counter(sizes.values())
    best = max(counts.values())
    tied = [s for s, n in counts.items() if n == best]
    first = sizes[min(sizes, key=lambda r: (inits.calls[r].enter, r))]
    processes = sum(state.alive for state in inits.ranks.values())  # a dead one is in no world
    expected = processes if processes in tied else first if first in tied else tied[0]
    culprits = sorted(r for r, s in sizes.items() if s != expected)
    return InitFault("world_sizes", culprits, inits.blocked)


def _init_raised(inits: _Inits) -> InitFault | None:
    raised = sorted(r for r, c in inits.calls.items() if c.state == "raised")
    return InitFault("raised", raised, inits.blocked) if raised else None


def _init_never(inits: _Inits) -> InitFault | None:
    never = sorted(r for r, s in inits.ranks.items() if r not in inits.calls and s.finished)
    return InitFault("never", never, inits.blocked) if never else None

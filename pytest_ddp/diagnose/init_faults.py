"""Certain faults of ``init_process_group``, in tests that call it themselves: a rank out of
range, a rank passed twice, world sizes that differ, one world size every process passed that
more processes than run would make, a rendezvous dialled at another address than the rest, or at
one that no host of theirs has, a process that raised in init or never called it.  Pure
(:mod:`pytest_ddp.diagnose.watchdog` asks it first).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pytest_ddp.common.ops import INIT
from pytest_ddp.diagnose.majority import minority
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import Duplicate, InitFault, Verdict


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
    store: str | None  # host:port of the rank group's store

    @property
    def live(self) -> dict[int, Call]:
        """The latest init_process_group of each live process: a dead one holds no rank and no
        world size (an elastic loop's survivors join again, one taking the dead one's rank)."""
        return {r: c for r, c in self.calls.items() if self.ranks[r].alive}

    @property
    def processes(self) -> int:
        """The live processes: a dead one is in no world."""
        return sum(state.alive for state in self.ranks.values())


def init_fault(ranks: dict[int, RankState], store: str | None = None) -> Verdict | None:
    """Certain faults of init_process_group, or None; ``store``: host:port of the rank group's store."""
    blocked = sorted(r for r, s in ranks.items() if (c := s.blocked_call) is not None and c.op == INIT)
    if not blocked:
        return None
    calls = {r: c for r, s in ranks.items() if (c := s.latest_init()) is not None}
    inits = _Inits(ranks, calls, blocked, store)
    checks = (
        _init_out_of_range, _init_duplicate, _init_world_sizes, _init_world_size, _init_address,
        _init_unserved, _init_raised, _init_never,
    )
    for check in checks:
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
    a rank other than its own slot number (it took another's rank), else the later ones to enter;
    every rank passed twice (local ranks passed as ranks on two nodes: 0 and 1 each twice).
    A process alone in its world (world_size 1) shares it with none."""
    by_rank: dict[int, list[int]] = {}
    for r, c in sorted(inits.live.items(), key=lambda item: (item[1].enter, item[0])):
        if (rank := given(c, "rank")) is not None and given(c, "world_size") != 1:
            by_rank.setdefault(rank, []).append(r)
    duplicates = []
    for rank, slots in sorted(by_rank.items()):
        if len(slots) < 2 or not set(slots) & set(inits.blocked):
            continue
        impostors = [s for s in slots if s != rank]
        culprits = impostors if 0 < len(impostors) < len(slots) else slots[1:]
        duplicates.append(Duplicate(rank, sorted(culprits), [s for s in slots if s not in culprits]))
    if not duplicates:
        return None
    culprits = sorted(s for duplicate in duplicates for s in duplicate.culprits)
    return InitFault("duplicate", culprits, inits.blocked, duplicates=duplicates)


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
    processes = inits.processes
    expected = processes if processes in tied else first if first in tied else tied[0]
    culprits = sorted(r for r, s in sizes.items() if s != expected)
    return InitFault("world_sizes", culprits, inits.blocked)


def _init_world_size(inits: _Inits) -> InitFault | None:
    """Every live process passed one world size, larger than the processes there are (the plugin
    started every rank): the ranks past them never come, and every one is named."""
    sizes = {given(c, "world_size") for c in inits.live.values()}
    processes = inits.processes
    if len(sizes) != 1 or len(inits.live) < processes:
        return None
    size = sizes.pop()
    if size is None or size <= processes:
        return None
    return InitFault("world_size", sorted(inits.live), inits.blocked)


def _init_address(inits: _Inits) -> InitFault | None:
    """Live processes of one world dialled its rendezvous at different addresses (MASTER_ADDR and
    MASTER_PORT, or tcp://): those that missed the rank group's store, where some dialled it, else
    the fewest; on a tie, those that missed the address of the process that passed rank 0, which
    serves the rendezvous's store there (torch starts its TCPStore's server on rank 0: each
    process its own free port, pytorch#53395); nothing where none passed rank 0 (a process alone in
    its world dials its own)."""
    dialled = {
        r: _loopback_as_one(address) for r, c in inits.live.items()
        if isinstance(address := c.extra.get("address"), str) and (given(c, "world_size") or 0) > 1
    }
    if len(set(dialled.values())) < 2:
        return None
    store = None if inits.store is None else _loopback_as_one(inits.store)
    if store in dialled.values():
        culprits = sorted(r for r, address in dialled.items() if address != store)
        return InitFault("address", culprits, inits.blocked, store=inits.store)
    culprits, others = minority(dialled, lambda address: (address,))
    if others:
        return InitFault("address", culprits, inits.blocked)
    servers = [r for r in dialled if given(inits.calls[r], "rank") == 0]
    if len(servers) != 1:
        return None
    [server] = servers
    culprits = sorted(r for r, address in dialled.items() if address != dialled[server])
    return InitFault("address", culprits, inits.blocked, server=server)


def _init_unserved(inits: _Inits) -> InitFault | None:
    """Every live process dialled one rendezvous address, not the rank group's store, that is an
    address of none of their hosts (``extra["elsewhere"]``, the recorder's word): no process of the
    group can serve a store there (pytorch#49084: a MASTER_ADDR that is not node 0's), and every
    one is named.  Such an address may still route back to a store here (a public address
    forwarded to this host): the watchdog gives the rendezvous the grace first."""
    dialled = {r: c for r, c in inits.live.items() if (given(c, "world_size") or 0) > 1}
    addresses = {c.extra.get("address") for c in dialled.values()}
    processes = inits.processes
    if len(dialled) < processes or len(addresses) != 1:
        return None
    if any(c.extra.get("elsewhere") is not True for c in dialled.values()):
        return None
    [address] = addresses
    if inits.store is not None and _loopback_as_one(str(address)) == _loopback_as_one(inits.store):
        return None
    return InitFault("unserved", sorted(dialled), inits.blocked, store=inits.store)


def _loopback_as_one(address: str) -> str:
    """``localhost:29500``, ``[::1]:29500`` -> ``127.0.0.1:29500``: one store, however spelled."""
    host, _, port = address.rpartition(":")
    if host.strip("[]") in ("localhost", "::1") or host.startswith("127."):
        host = "127.0.0.1"
    return f"{host}:{port}"


def _init_raised(inits: _Inits) -> InitFault | None:
    raised = sorted(r for r, c in inits.calls.items() if c.state == "raised")
    return InitFault("raised", raised, inits.blocked) if raised else None


def _init_never(inits: _Inits) -> InitFault | None:
    never = sorted(r for r, s in inits.ranks.items() if r not in inits.calls and s.finished)
    return InitFault("never", never, inits.blocked) if never else None

"""init_process_group's faults (:mod:`pytest_ddp.diagnose.init_faults`) in words."""

from __future__ import annotations

from pytest_ddp.diagnose.init_faults import given
from pytest_ddp.diagnose.phrases import describe_call, rank_list, said, verb
from pytest_ddp.diagnose.rank_words import how_it_failed
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import InitFault


def init_fault_words(f: InitFault, ranks: dict[int, RankState]) -> str:
    """Why init_process_group cannot complete, then who waits in it."""
    calls = {r: c for r, s in ranks.items() if (c := s.latest_init()) is not None}
    if f.check == "out_of_range":
        reason = "; ".join(
            f"process {r} passed rank {given(calls[r], 'rank')}, out of range for world_size "
            f"{given(calls[r], 'world_size')}, to init_process_group"
            for r in f.culprits
        )
    elif f.check == "duplicate":
        passed = (
            f"{rank_list(d.culprits, 'process')} passed rank {d.rank}, "
            f"as {rank_list(d.others, 'process')} did"
            for d in f.duplicates
        )
        reason = "; ".join(passed) + ", to init_process_group"
    elif f.check == "world_sizes":
        sizes = {r: s for r, c in calls.items() if (s := given(c, "world_size")) is not None}
        each = said(sizes, lambda r: f"passed {sizes[r]}", ", ", "process")
        reason = f"init_process_group world sizes differ: {each}"
    elif f.check == "world_size":
        size = given(calls[f.culprits[0]], "world_size") or 0
        run = sum(state.alive for state in ranks.values())
        missing = rank_list(range(run, size))
        reason = (
            f"{rank_list(f.culprits, 'process')} passed world_size {size} to init_process_group, where "
            f"{run} processes run: {missing} never {verb(range(run, size), 'comes', 'come')}"
        )
    elif f.check == "address":
        reason = "; ".join(f"process {r} dialled {_dialled(calls[r])}" for r in f.culprits)
        if f.store is not None:
            reason += f", not the rank group's store at {f.store}"
        else:
            others = {r: c for r, c in calls.items() if r not in f.culprits and "address" in c.extra}
            first = next(iter(others.values()))
            reason += f", where {rank_list(others, 'process')} dialled {_dialled(first)}"
            if f.server is not None:
                reason += " and, as rank 0, serves the rendezvous's store there"
        reason += ", in init_process_group"
    elif f.check == "unserved":
        reason = (
            f"{rank_list(f.culprits, 'process')} dialled {_dialled(calls[f.culprits[0]])} in"
            f" init_process_group, an address none of their hosts has"
        )
        if f.store is not None:
            reason += f", not the rank group's store at {f.store}"
        reason += ": no process of the group serves one there"
    elif f.check == "raised":
        reason = "; ".join(
            f"process {r} raised {calls[r].error} in {describe_call(calls[r])}" for r in f.culprits
        )
    else:
        reason = "; ".join(
            f"process {r} {how_it_failed(ranks[r])} without calling init_process_group" for r in f.culprits
        )
    call = ranks[f.blocked[0]].blocked_call
    assert call is not None
    waits = f"{rank_list(f.blocked, 'process')} {verb(f.blocked, 'waits', 'wait')} in {describe_call(call)}"
    return f"{reason}; {waits}."


def _dialled(call: Call) -> str:
    """``127.0.0.1:29507 (MASTER_ADDR:MASTER_PORT)``: the address an init dialled, and whence."""
    method = str(call.extra.get("init_method"))
    whence = "MASTER_ADDR:MASTER_PORT" if method.startswith("env://") else "init_method"
    return f"{call.extra.get('address')} ({whence})"

"""Hand-made rank states and snapshots, as the recorder and the controller would make them, for the
tests that judge them without processes (the watchdog's, the majority's, MPI's, the faults', the report's
and the matrix's verdicts)."""

from __future__ import annotations

import textwrap
from typing import Any

from pytest_ddp import faults
from pytest_ddp.common import ops
from pytest_ddp.common.protocol import Injected
from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.state import Call, RankState, Snapshot
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.diagnose.wording import worded


def judge(snapshot: Snapshot) -> Verdict:
    """The watchdog's verdict, worded as the controller words it."""
    return worded(watchdog.judge(snapshot), snapshot.ranks)


def watched(snapshot: Snapshot, source: str) -> Verdict:
    """The final verdict as the controller's Watch gives it, the test's file ``t.py`` holding ``source``."""
    text = textwrap.dedent(source)
    verdict = watchdog.Watch(lambda file: text if file == "t.py" else None).verdict(snapshot)
    assert verdict is not None
    return worded(verdict, snapshot.ranks)


NOW = 1000.0
R2, R3, R4 = (0, 1), (0, 1, 2), (0, 1, 2, 3)


def lines_of(source: str) -> dict[str, int]:
    """``# <name>`` at a line's end -> that line."""
    return {line.rsplit("# ", 1)[1]: i for i, line in enumerate(source.splitlines(), 1) if "# " in line}


def call(op: str, seq: int, *, state: str = "running", group: str = "WORLD", ranks: tuple[int, ...] = R2,
         shape: tuple[int, ...] | None = (4,), dtype: str = "float32", peer: int | None = None,
         root: int | None = None, error: str | None = None, extra: dict[str, Any] | None = None,
         enter: float = NOW - 1, is_async: bool = False, site: str | None = None) -> Call:
    """A call as the recorder would describe it; ``state`` is running, ok or raised."""
    c = Call(index=0, op=op, group=group, group_ranks=tuple(ranks), seq=seq, site=site or f"t.py:{10 + seq}",
             enter=enter, shapes=[list(shape)] if shape else [], dtypes=[dtype] if shape else [], peer=peer,
             root=root, is_async=is_async, extra=extra or {})
    if state != "running":
        c.exit = enter + 0.1
        c.error = (error or "RuntimeError: error") if state == "raised" else None
    return c


def ok(op: str, seq: int, **kwargs: Any) -> Call:
    return call(op, seq, state="ok", **kwargs)


def rank(r: int, *calls: Call, finished: bool = False, failed: str | None = None, exit_code: int | None = None,
         failed_at: float = NOW - 0.5) -> RankState:
    """A rank: ``failed`` is the error of a failed call report, ``exit_code`` makes it dead."""
    state = RankState(rank=r, phase="call")
    for i, c in enumerate(calls):
        c.index = i
        state.calls.append(c)
    if finished:
        state.phase, state.finished_at = "finished", NOW - 0.5
    if failed is not None:
        state.failed_at = failed_at
        state.reports["call"] = {"outcome": "failed", "data": {"longrepr": {"reprcrash": {"message": failed}}}}
    if exit_code is not None:
        state.mark_dead(exit_code, failed_at)
    return state


def snap(*ranks: RankState, timeout: float = 60, grace: float = 2, started: float = NOW - 1) -> Snapshot:
    return Snapshot(now=NOW, started=started, timeout=timeout, grace=grace, ranks=list(ranks))


def outline(verdict: Verdict) -> tuple[str, str | None, list[int], list[int]]:
    return verdict.status, verdict.kind, verdict.culprits, verdict.waiting


def mpi(method: str, seq: int, *, state: str = "running", peer: int | None = None, tag: int | None = None,
        got: int | None = None, group: str = "WORLD", ranks: tuple[int, ...] = R4, root: int | None = None,
        extra: dict[str, Any] | None = None, enter: float = NOW - 1, error: str | None = None,
        site: str | None = None) -> Call:
    """An mpi4py call as the MPI recorder describes it; ``got``: the sender a receive from any
    source got its message from (its ret says)."""
    call = Call(index=0, op=ops.MPI_PREFIX + method, group=group, group_ranks=ranks, seq=seq,
                site=site or f"t.py:{10 + seq}", enter=enter, peer=peer, tag=tag, root=root, extra=extra or {})
    if state != "running":
        call.exit = enter + 0.1
        call.error = (error or "Exception: error") if state == "raised" else None
        call.got_source = got
    return call


def done(method: str, seq: int, **kwargs: Any) -> Call:
    return mpi(method, seq, state="ok", **kwargs)


def killed(r: int, *calls, at: str = "all_reduce", call_number: int = 3) -> RankState:
    state = rank(r, *calls, exit_code=-9)
    state.injected.append(Injected(str(faults.kill(r, at, call_number)), "kill", at, call_number, "t.py:5"))
    return state

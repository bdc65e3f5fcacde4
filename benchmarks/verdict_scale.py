"""How long the watchdog takes to judge a snapshot, and the report to be written, as ranks grow.

Hand-made snapshots (no processes) of 8, 64 and 512 ranks with 10,000 calls per
rank, one per situation the watchdog meets:

- ``running``: a healthy test mid-way, half the ranks in all_reduce #10,001 and
  half still on their way (verdict: wait; the watchdog's look at every poll);
- ``partial``: the last rank returned after 10,000 all_reduces, the others wait
  in #10,001 (a certain deadlock);
- ``mismatch``: the last rank entered broadcast #10,001 where the others entered
  all_reduce #10,001;
- ``p2p``: a ring of 10,000 sends and receives per rank, then every rank waits
  in a receive from the last rank, which returned (each look for its send reads
  all of that rank's calls);
- ``failed``: every rank finished, the last one with a raised all_reduce (the
  after-test look at every collective).

For each it prints the best of a few runs of the verdict (:func:`watchdog.judge`
and its wording) and of the whole failure text.  Then, with ``--real``, a real
64-rank hang on this machine (rank 63 skips the last of 12 all_reduces), run
through :func:`pytest_ddp.run`: the time from the test's start to the verdict,
the time the rank group took to start, and the report's size in lines.

    python benchmarks/verdict_scale.py [--sizes 8 64 512] [--calls 10000] [--scenarios ...] [--real]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from pytest_ddp.config.spec import RankSpec
from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.state import Call, RankState, Snapshot
from pytest_ddp.diagnose.wording import worded
from pytest_ddp.groups.runner import TestRun
from pytest_ddp.report.failure import failure_text

NOW = 1_000_000.0
REPEATS = 3


def _call(index: int, op: str, seq: int, *, done: bool = True, peer: int | None = None) -> Call:
    """A call as the recorder describes one; built from a copied template, as 5 million
    dataclass constructions would take most of a minute."""
    call = object.__new__(Call)
    call.__dict__.update(_TEMPLATE)
    call.index, call.op, call.seq, call.peer = index, op, seq, peer
    call.shapes, call.dtypes = [[1024]], ["float32"]  # each call its own, as parsed from its event
    call.site = f"train.py:{40 + index % 7}"
    call.enter = NOW - 100 + index * 1e-3
    call.exit = call.enter + 1e-4 if done else None
    return call


_TEMPLATE = vars(Call(index=0, op="all_reduce", group="WORLD", group_ranks=(), seq=1, site="", enter=0.0,
                      shapes=[[1024]], dtypes=["float32"], devices=["cpu"]))


def _collectives(rank: int, calls: int) -> RankState:
    state = RankState(rank=rank, phase="call")
    state.calls = [_call(i, "all_reduce", i + 1) for i in range(calls)]
    return state


def _finish(state: RankState, failed: bool = False) -> RankState:
    state.phase, state.finished_at = "finished", NOW - 1
    if failed:
        state.failed_at = NOW - 1
    return state


def running(size: int, calls: int) -> list[RankState]:
    states = [_collectives(r, calls) for r in range(size)]
    for state in states[::2]:
        state.calls.append(_call(calls, "all_reduce", calls + 1, done=False))
    return states


def partial(size: int, calls: int) -> list[RankState]:
    states = [_collectives(r, calls) for r in range(size)]
    for state in states[:-1]:
        state.calls.append(_call(calls, "all_reduce", calls + 1, done=False))
    _finish(states[-1])
    return states


def mismatch(size: int, calls: int) -> list[RankState]:
    states = [_collectives(r, calls) for r in range(size)]
    for state in states:
        op = "broadcast" if state.rank == size - 1 else "all_reduce"
        state.calls.append(_call(calls, op, calls + 1, done=False))
    return states


def p2p(size: int, calls: int) -> list[RankState]:
    states = []
    for r in range(size):
        state = RankState(rank=r, phase="call")
        right, left = (r + 1) % size, (r - 1) % size
        state.calls = [
            _call(i, "send", i // 2 + 1, peer=right) if i % 2 == 0 else _call(i, "recv", i // 2 + 1, peer=left)
            for i in range(calls)
        ]
        if r < size - 1:  # a gather by hand: the last rank never sends
            earlier = calls // 2 if left == size - 1 else 0
            state.calls.append(_call(calls, "recv", earlier + 1, done=False, peer=size - 1))
        states.append(state)
    _finish(states[-1])
    return states


def failed(size: int, calls: int) -> list[RankState]:
    states = [_finish(_collectives(r, calls)) for r in range(size)]
    last = states[-1]
    last.calls[-1].error = "RuntimeError: boom"
    _finish(last, failed=True)
    return states


SCENARIOS: dict[str, Callable[[int, int], list[RankState]]] = {
    "running": running, "partial": partial, "mismatch": mismatch, "p2p": p2p, "failed": failed,
}


def _best(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _snapshot(states: list[RankState]) -> Snapshot:
    return Snapshot(now=NOW, started=NOW - 200, timeout=3600, grace=2, ranks=states)


def measure(size: int, calls: int, name: str) -> None:
    states = SCENARIOS[name](size, calls)
    snap = _snapshot(states)
    verdict = worded(watchdog.judge(snap), states)
    judged = _best(lambda: worded(watchdog.judge(snap), states))
    spec = RankSpec(world_size=size, backend="gloo", timeout=3600, grace=2)
    run = TestRun("bench", spec, states, verdict, 200.0, NOW)
    text = failure_text(run, {}, "train.py") if verdict.status != "wait" else ""
    written = _best(lambda: failure_text(run, {}, "train.py")) if text else 0.0
    lines = len(text.splitlines())
    print(
        f"{size:>5} {name:<9} {verdict.status:<8} {verdict.kind or '-':<11} "
        f"{judged * 1000:>9.1f} {written * 1000:>9.1f} {lines:>6}",
        flush=True,
    )


def skip_last(rank: int, world_size: int) -> None:
    """Twelve all_reduces, of which the last rank skips the twelfth."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(4)
    for step in range(12):
        if step < 11 or rank != world_size - 1:
            dist.all_reduce(tensor)


def real(size: int) -> None:
    """Run the hang through run(), keeping the TestRun it judged (for the ranks' own times)."""
    from verdict_scale import skip_last  # this file as a module the ranks can import (not __main__)

    from pytest_ddp import run
    from pytest_ddp.groups import runner

    judged: list[TestRun] = []
    plain = runner.GroupPool.run

    def keeping(self: runner.GroupPool, *args: Any, **kwargs: Any) -> Any:
        judged.append(plain(self, *args, **kwargs))
        return judged[-1]

    runner.GroupPool.run = keeping  # type: ignore[method-assign]
    start = time.perf_counter()
    result = run(skip_last, world_size=size, timeout=120, args=(size,))
    total = time.perf_counter() - start
    assert result.diagnosis is not None, result.outcome
    test_run = judged[0]
    states = test_run.states
    # Certain: the last rank left its test and every other rank blocked in all_reduce #12.
    last = states[-1].finished_at or 0.0
    blocked = max(s.calls[-1].enter for s in states[:-1])
    text = result.diagnosis.text
    print(f"real {size}-rank hang: {result.outcome} ({result.diagnosis.kind}), culprits {result.diagnosis.culprits}")
    started, elapsed = test_run.cold_start or 0.0, test_run.elapsed
    print(f"  rank group started in {started:.1f} s; the test ran {elapsed:.2f} s to its verdict")
    print(f"  verdict {test_run.ended - max(last, blocked):.3f} s after the deadlock was certain "
          f"(rank {size - 1} returned, all others blocked); whole run() {total:.1f} s")
    print(f"  report {len(text.splitlines())} lines:")
    print("\n".join("  | " + line for line in text.splitlines()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--real", action="store_true", help="also run a real 64-rank hang")
    args = parser.parse_args()
    print(f"{args.calls} calls per rank; best of {REPEATS} runs, in ms")
    print(f"{'ranks':>5} {'scenario':<9} {'status':<8} {'kind':<11} {'verdict':>9} {'report':>9} {'lines':>6}")
    for size in args.sizes:
        for name in args.scenarios:
            measure(size, args.calls, name)
    if args.real:
        real(64)


if __name__ == "__main__":
    sys.exit(main())

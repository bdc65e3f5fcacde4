"""What the recorder adds to each torch.distributed call, measured in one run.

Two ranks (Gloo over loopback, FileStore rendezvous) loop over a 1-float
all_reduce in rounds without and with the recorder (writing to a real event
log), alternating, both ranks switching together; it prints the median over
rounds of the microseconds per call for each (wall time, and the CPU time of
rank 0's calling thread), the added time and the ratio.  Four calls are
measured: ``dist.all_reduce`` (recorded by the function's wrapper), the same
once the c10d hook is armed (as in a test that built a DDP model: every c10d
operation then passes through a Python kernel, which only hands this call
on), and the functional collective ``funcol.all_reduce(...).wait()`` that
DTensor and FSDP2 issue (recorded at its own dispatcher operation, its ret
written when its wait returns), without and with the c10d hook.  Goal: at
most 10 us added per call.

A Gloo round trip between two processes takes tens to hundreds of microseconds
and depends on scheduling, so on a small or busy machine the two-rank figures
are noisy, and any work between calls can cost more than itself.  The script
therefore also prints the recorder's own cost (its wrapper around a function
that does nothing, recording to a real log; best of several runs), the cost of
each call in a group of one (no peer to wait for), and, as a control, the loop
with a busy-wait of the wrapper's length in place of the recorder.

    python benchmarks/recorder_overhead.py [--calls 2000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

WARM_UP = 500


def functional_all_reduce(tensor: torch.Tensor) -> None:
    funcol.all_reduce(tensor, "sum", dist.group.WORLD).wait()


# name -> (the call, whether the c10d hook is armed first: as in a test that built a DDP model)
CALLS: dict[str, tuple[Callable[[torch.Tensor], Any], bool]] = {
    "dist.all_reduce": (lambda tensor: dist.all_reduce(tensor), False),
    "dist.all_reduce, hook armed": (lambda tensor: dist.all_reduce(tensor), True),
    "functional all_reduce": (functional_all_reduce, False),
    "functional all_reduce, hook armed": (functional_all_reduce, True),
}


def loop(
    call: Callable[[torch.Tensor], Any], tensor: torch.Tensor, calls: int, busy_us: float = 0.0
) -> tuple[float, float]:
    """Microseconds of wall and thread CPU time per call, each after ``busy_us`` of busy-waiting."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        if busy_us:
            until = time.perf_counter() + busy_us / 1e6
            while time.perf_counter() < until:
                pass
        call(tensor)
    return (time.perf_counter() - wall) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


def own_cost(log: Any) -> float:
    """Microseconds the recorder spends per call around a call that costs nothing."""
    from pytest_ddp import recorder

    def nothing(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        return None

    wrapped = recorder._wrap("all_reduce", nothing)
    tensor = torch.ones(1)
    recorder.install(log)
    try:
        best = min(timeit.repeat(lambda: wrapped(tensor), number=20000, repeat=5))
    finally:
        recorder.uninstall()
    return best / 20000 * 1e6


def alone_costs(folder: str, call: Callable[[torch.Tensor], Any], arm: bool) -> dict[str, float]:
    """CPU microseconds per call in a Gloo group of one (no peer to wait for): without the
    recorder, with only its dispatcher kernels, which hand every call on (the c10d ones armed
    where ``arm``), and with the whole recorder (armed the same); best of 5 each."""
    from pytest_ddp import backend_hook, recorder
    from pytest_ddp.protocol import EventLog

    tensor = torch.ones(1)

    def per_call() -> float:
        def calls() -> None:
            for _ in range(2000):
                call(tensor)

        calls()
        best = min(timeit.repeat(calls, number=1, repeat=5, timer=time.thread_time))
        return best / 2000 * 1e6

    def hand_on(spec: Any, args: Any, submit: Callable[[], Any]) -> Any:
        return submit()

    costs = {"bare": per_call()}
    backend_hook.install(hand_on, hand_on, lambda tensor, wait: wait(), lambda: False)
    if arm:
        backend_hook.arm()
    costs["hook"] = per_call()
    backend_hook.uninstall()
    recorder.install(EventLog(os.path.join(folder, "alone.events")))
    recorder.start_test()
    if arm:
        backend_hook.arm()
    costs["recorder"] = per_call()
    recorder.uninstall()
    return costs


def alone(_: int, folder: str) -> None:
    """The group-of-one costs of each call, in a process of its own."""
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "alone.store"), 1), rank=0, world_size=1)
    costs = {name: alone_costs(folder, call, arm) for name, (call, arm) in CALLS.items()}
    with open(os.path.join(folder, "alone.json"), "w") as f:
        json.dump(costs, f)
    dist.destroy_process_group()


def worker(rank: int, folder: str, calls: int, rounds: int) -> None:
    from pytest_ddp import backend_hook, recorder
    from pytest_ddp.protocol import EventLog

    store = dist.FileStore(os.path.join(folder, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    tensor = torch.ones(1)
    log = EventLog(os.path.join(folder, f"rank{rank}.events"))
    result: dict[str, Any] = {"own": own_cost(log)}
    for name, (call, arm) in CALLS.items():
        loop(call, tensor, WARM_UP)
        times: dict[str, list[tuple[float, float]]] = {"plain": [], "busy": [], "recorded": []}
        for _ in range(rounds):
            dist.barrier()
            times["plain"].append(loop(call, tensor, calls // rounds))
            dist.barrier()
            times["busy"].append(loop(call, tensor, calls // rounds, result["own"]))
            dist.barrier()
            recorder.install(log)
            recorder.start_test()
            if arm:  # before the timed calls: arming takes milliseconds, once per process
                backend_hook.arm()
            times["recorded"].append(loop(call, tensor, calls // rounds))
            recorder.uninstall()
        result[name] = {
            mode: [statistics.median(wall for wall, _ in each), statistics.median(cpu for _, cpu in each)]
            for mode, each in times.items()
        }
    dist.barrier()
    if rank == 0:
        with open(os.path.join(folder, "result.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help=f"calls per mode, after {WARM_UP} warm-up calls")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds the calls are split into")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(worker, args=(folder, options.calls, options.rounds), nprocs=2, start_method="spawn")
        mp.start_processes(alone, args=(folder,), nprocs=1, start_method="spawn")
        with open(os.path.join(folder, "result.json")) as f:
            result = json.load(f)
        with open(os.path.join(folder, "alone.json")) as f:
            costs = json.load(f)
    print(
        f"1-float all_reduce, 2 Gloo ranks, {options.calls} calls per mode in {options.rounds} "
        f"alternating rounds, {os.cpu_count()} cores; us per call, wall (rank 0's thread CPU)"
    )
    for name in CALLS:
        (plain, plain_cpu), (recorded, recorded_cpu) = result[name]["plain"], result[name]["recorded"]
        busy, busy_cpu = result[name]["busy"]
        print(f"{name}:")
        print(f"  without recorder:  {plain:7.1f} ({plain_cpu:5.1f})")
        print(f"  with recorder:     {recorded:7.1f} ({recorded_cpu:5.1f})")
        print(
            f"  added:             {recorded - plain:+7.1f} ({recorded_cpu - plain_cpu:+5.1f})"
            f"   ratio {recorded / plain:.2f}   [goal <= 10 us]"
        )
        print(
            f"  control, a busy-wait of {result['own']:.1f} us instead: "
            f"{busy - plain:+.1f} ({busy_cpu - plain_cpu:+.1f})"
        )
        each = costs[name]
        print(
            f"  in a group of one, CPU (best of 5): bare {each['bare']:.1f}, "
            f"backend hook {each['hook'] - each['bare']:+.1f}, whole recorder {each['recorder'] - each['bare']:+.1f}"
        )
    print(f"recorder's own cost, its wrapper around a no-op (real log), best of 5: {result['own']:.1f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the recorder adds to each torch.distributed call, measured in one run.

Two ranks (Gloo over loopback, FileStore rendezvous) loop over a 1-float
all_reduce in rounds without and with the recorder (writing to a real event
log), alternating, both ranks switching together; it prints the median over
rounds of the microseconds per call for each (wall time, and the CPU time of
rank 0's calling thread), the added time and the ratio.  Goal: at most 10 us
added per call.

A Gloo round trip between two processes takes tens to hundreds of microseconds
and depends on scheduling, so on a small or busy machine the two-rank figures
are noisy, and any work between calls can cost more than itself.  The script
therefore also prints the recorder's own cost (its wrapper around a function
that does nothing, recording to a real log; best of several runs) and, as a
control, the loop with a busy-wait of that length in place of the recorder.

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
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WARM_UP = 500


def loop(tensor: torch.Tensor, calls: int, busy_us: float = 0.0) -> tuple[float, float]:
    """Microseconds of wall and thread CPU time per all_reduce, each after ``busy_us`` of busy-waiting."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        if busy_us:
            until = time.perf_counter() + busy_us / 1e6
            while time.perf_counter() < until:
                pass
        dist.all_reduce(tensor)
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


def alone_costs(folder: str) -> dict[str, float]:
    """CPU microseconds per real all_reduce in a Gloo group of one (no peer to wait for): without
    the recorder, with only its backend hook (the kernel every collective passes through), and
    with the whole recorder (the function's wrapper, then the hook); best of 5 each."""
    from pytest_ddp import backend_hook, recorder
    from pytest_ddp.protocol import EventLog

    group = dist.new_group([dist.get_rank()])
    tensor = torch.ones(1)

    def per_call() -> float:
        def calls() -> None:
            for _ in range(2000):
                dist.all_reduce(tensor, group=group)

        calls()
        best = min(timeit.repeat(calls, number=1, repeat=5, timer=time.thread_time))
        return best / 2000 * 1e6

    costs = {"bare": per_call()}
    backend_hook.install(lambda spec, args, issued_async, submit: submit(), lambda tensor: None, lambda: False)
    costs["hook"] = per_call()
    backend_hook.uninstall()
    recorder.install(EventLog(os.path.join(folder, f"alone{dist.get_rank()}.events")))
    recorder.start_test()
    costs["recorder"] = per_call()
    recorder.uninstall()
    return costs


def worker(rank: int, folder: str, calls: int, rounds: int) -> None:
    from pytest_ddp import recorder
    from pytest_ddp.protocol import EventLog

    store = dist.FileStore(os.path.join(folder, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    tensor = torch.ones(1)
    log = EventLog(os.path.join(folder, f"rank{rank}.events"))
    loop(tensor, WARM_UP)
    own = own_cost(log)
    alone = alone_costs(folder)
    plain: list[tuple[float, float]] = []
    busy: list[tuple[float, float]] = []
    recorded: list[tuple[float, float]] = []
    for _ in range(rounds):
        dist.barrier()
        plain.append(loop(tensor, calls // rounds))
        dist.barrier()
        busy.append(loop(tensor, calls // rounds, own))
        dist.barrier()
        recorder.install(log)
        recorder.start_test()
        recorded.append(loop(tensor, calls // rounds))
        recorder.uninstall()
    dist.barrier()
    if rank == 0:
        result: dict[str, Any] = {"own": own, "alone": alone}
        for name, times in (("plain", plain), ("busy", busy), ("recorded", recorded)):
            result[name] = [statistics.median(wall for wall, _ in times), statistics.median(cpu for _, cpu in times)]
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
        with open(os.path.join(folder, "result.json")) as f:
            result = json.load(f)
    (plain, plain_cpu), (recorded, recorded_cpu) = result["plain"], result["recorded"]
    busy, busy_cpu = result["busy"]
    print(
        f"1-float all_reduce, 2 Gloo ranks, {options.calls} calls per mode in {options.rounds} "
        f"alternating rounds, {os.cpu_count()} cores; us per call, wall (rank 0's thread CPU)"
    )
    print(f"  without recorder:  {plain:7.1f} ({plain_cpu:5.1f})")
    print(f"  with recorder:     {recorded:7.1f} ({recorded_cpu:5.1f})")
    print(
        f"  added:             {recorded - plain:+7.1f} ({recorded_cpu - plain_cpu:+5.1f})"
        f"   ratio {recorded / plain:.2f}   [goal <= 10 us]"
    )
    print(f"recorder's own cost, its wrapper around a no-op (real log), best of 5: {result['own']:.1f} us per call")
    alone = result["alone"]
    print(
        f"a real all_reduce in a group of one, CPU us per call (best of 5): bare {alone['bare']:.1f}, "
        f"backend hook {alone['hook'] - alone['bare']:+.1f}, whole recorder {alone['recorder'] - alone['bare']:+.1f}"
    )
    print(
        f"control, a busy-wait that long instead of the recorder: {busy - plain:+.1f} "
        f"({busy_cpu - plain_cpu:+.1f}) us per call"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the recorder adds to each torch.distributed call, measured in one run.

Two ranks (Gloo, loopback), a loop of 1-float all_reduce without the recorder,
then with it (writing to a real event log), then without again; prints the
median of the per-phase means in microseconds per call, the added time and the
ratio.  Goal: at most 10 us added per call.

    python benchmarks/recorder_overhead.py [--calls 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def loop(calls: int) -> float:
    t = torch.ones(1)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / calls * 1e6


def worker(rank: int, store_path: str, log_dir: str, calls: int, rounds: int, out: str) -> None:
    from pytest_ddp import recorder
    from pytest_ddp.state import EventLog

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    loop(500)  # warm-up
    plain, recorded = [], []
    log = EventLog(os.path.join(log_dir, f"rank{rank}.events"))
    for _ in range(rounds):
        plain.append(loop(calls))
        recorder.install(log)
        recorder.start_test()
        recorded.append(loop(calls))
        recorder.uninstall()
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{statistics.median(plain)} {statistics.median(recorded)}\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result")
        mp.start_processes(
            worker,
            args=(os.path.join(folder, "store"), folder, options.calls, options.rounds, out),
            nprocs=2,
            start_method="spawn",
        )
        plain, recorded = map(float, open(out).read().split())
    print(f"1-float all_reduce on 2 Gloo ranks, {options.calls} calls x {options.rounds} rounds, {os.cpu_count()} cores")
    print(f"  without recorder: {plain:8.1f} us per call")
    print(f"  with recorder:    {recorded:8.1f} us per call")
    print(f"  added:            {recorded - plain:8.1f} us per call  [goal <= 10 us]   ratio {recorded / plain:.2f}")


if __name__ == "__main__":
    sys.exit(main())

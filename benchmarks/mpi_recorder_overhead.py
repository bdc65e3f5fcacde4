"""What the MPI recorder adds to each call on a communicator, measured in one run.

Run under ``mpiexec -n 2``.  Both ranks loop over ``Allreduce`` of one float64 in
rounds, alternately on the plain ``MPI.COMM_WORLD`` and on the recording one
(writing to a real event log), both ranks switching together; rank 0 prints the
median over rounds of the microseconds per call for each (wall time, and the CPU
time of its calling thread) and the added time.  MPICH busy-polls, so a call costs
CPU time on both ranks whether it waits or not.

    mpiexec -n 2 python benchmarks/mpi_recorder_overhead.py [--calls 5000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
from mpi4py import MPI

WARM_UP = 500


def loop(comm: Any, calls: int) -> tuple[float, float]:
    """Microseconds of wall and thread CPU time per Allreduce."""
    send, receive = np.ones(1), np.empty(1)
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        comm.Allreduce(send, receive, op=MPI.SUM)
    return (time.perf_counter() - wall) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    from pytest_ddp.common.event_log import EventLog
    from pytest_ddp.record import mpi_recorder

    plain = MPI.COMM_WORLD
    rank = plain.Get_rank()
    with tempfile.TemporaryDirectory() as folder:
        log = EventLog(os.path.join(folder, f"rank{rank}.log"))
        mpi_recorder.install(log)
        mpi_recorder.start_test()
        recording = MPI.COMM_WORLD
        for comm in (plain, recording):
            loop(comm, WARM_UP)
        results: dict[str, list[tuple[float, float]]] = {"plain": [], "recorded": []}
        for _ in range(args.rounds):
            for name, comm in (("plain", plain), ("recorded", recording)):
                plain.Barrier()
                mpi_recorder.start_test()  # a fresh numbering per round, as per test
                results[name].append(loop(comm, args.calls))
        log.close()
        mpi_recorder.uninstall()
    if rank == 0:
        median = {name: [statistics.median(r[i] for r in rounds) for i in (0, 1)] for name, rounds in results.items()}
        print(json.dumps({
            "calls_per_round": args.calls,
            "rounds": args.rounds,
            "plain_us": {"wall": round(median["plain"][0], 2), "cpu": round(median["plain"][1], 2)},
            "recorded_us": {"wall": round(median["recorded"][0], 2), "cpu": round(median["recorded"][1], 2)},
            "added_us": {
                "wall": round(median["recorded"][0] - median["plain"][0], 2),
                "cpu": round(median["recorded"][1] - median["plain"][1], 2),
            },
        }))


if __name__ == "__main__":
    main()

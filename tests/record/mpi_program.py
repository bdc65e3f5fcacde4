"""The MPI program of tests/record/test_mpi_recorder.py, run under mpiexec: each rank records its
calls into ``<log dir>/rank<N>.log`` as a pytest-ddp rank does, runs its scenarios one after
another, each a test of its own, and writes its ``done`` event when a scenario returns, as a rank
does when its test ends. Between two scenarios every rank waits for the others on the world as it
was before the recorder (unrecorded), so that no message of one meets a receive of the next.

    mpiexec -n N python mpi_program.py LOG_DIR SCENARIO [SCENARIO ...]

A scenario that hangs on purpose has rank 0 wait, after its done event, for its standard
input to close (mpiexec forwards it to rank 0): the test closes it once it has judged the
hang, and rank 0 then does what it left undone, so that every rank exits.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.protocol import Done, TestStart
from pytest_ddp.record import mpi_recorder

_log: EventLog


def _done() -> None:
    _log.write(Done(in_flight=mpi_recorder.unfinished_work(0.1)))


def _judged() -> None:
    """The test has read what it needs from the logs."""
    sys.stdin.read()


def calls(rank: int) -> None:
    """One of most kinds of call, each with something to check."""
    import torch

    comm = MPI.COMM_WORLD
    data = np.arange(10, dtype=np.int64)
    if rank == 0:
        comm.Send(data, dest=1, tag=5)
        comm.send({"a": 1}, dest=1, tag=7)
        comm.Send([data, 4, MPI.INT64_T], dest=1, tag=8)
        MPI.Request.Waitall([comm.Isend(data, dest=1, tag=9)])
        comm.Send(data, dest=1, tag=10)
        comm.isend(None, dest=1, tag=11).wait()
    else:
        comm.Recv(data, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        comm.recv(source=0, tag=7)
        comm.Recv([data, 4, MPI.INT64_T], source=0, tag=8)
        comm.Irecv(data, source=0, tag=9).Wait()
        try:
            comm.Recv(np.empty(2, dtype=np.int64), source=0, tag=10)  # too small: raises
        except MPI.Exception:
            pass
        comm.irecv(source=MPI.ANY_SOURCE, tag=11).wait()  # receives None
    comm.Allreduce(MPI.IN_PLACE, torch.ones(3), op=MPI.MAX)
    comm.allreduce(rank)
    comm.Split(color=rank, key=0).Barrier()
    dup = comm.Dup()
    dup.Bcast(data, root=1)
    cart = comm.Create_cart([comm.size])
    never = comm.Irecv(np.empty(1), source=MPI.ANY_SOURCE, tag=99)
    kinds = {"world": type(MPI.COMM_WORLD).__name__, "request": isinstance(never, MPI.Request),
             "cart": cart.Get_coords(cart.rank) == [rank]}
    print(json.dumps(kinds), flush=True)
    _done()
    never.Cancel()  # so that every rank can finalize
    never.Wait()
    mpi_recorder.start_test()  # the next test on these ranks uses a communicator made before it
    _log.write(TestStart("next"))
    dup.Barrier()


def small_any_source(rank: int) -> None:
    """Ranks 1, 2 send 10 int64 to rank 0, which receives once: the sends return all the same."""
    comm = MPI.COMM_WORLD
    data = np.zeros(10, dtype=np.int64)
    if rank == 0:
        comm.Recv(data, source=MPI.ANY_SOURCE)
    else:
        comm.Send(data, dest=0)
    _done()


def large_any_source(rank: int) -> None:
    """The same with 1,000,000 int64: the send rank 0 does not receive blocks."""
    comm = MPI.COMM_WORLD
    data = np.zeros(1_000_000, dtype=np.int64)
    if rank == 0:
        comm.Recv(data, source=MPI.ANY_SOURCE)
        _done()
        _judged()
        comm.Recv(data, source=MPI.ANY_SOURCE)
    else:
        comm.Send(data, dest=0)  # blocks in one of ranks 1, 2
        _done()


def waitall(rank: int) -> None:
    """Rank 1 waits for an Irecv in MPI.Request.Waitall; rank 0 returns without sending."""
    comm = MPI.COMM_WORLD
    data = np.zeros(10, dtype=np.int64)
    if rank == 0:
        _done()
        _judged()
        comm.Send(data, dest=1, tag=3)
    else:
        MPI.Request.Waitall([comm.Irecv(data, source=0, tag=3)])
        _done()


SCENARIOS: dict[str, Callable[[int], None]] = {
    f.__name__: f for f in (calls, small_any_source, large_any_source, waitall)
}


def main() -> None:
    global _log
    folder, scenarios = sys.argv[1], sys.argv[2:]
    unrecorded = MPI.COMM_WORLD
    rank = unrecorded.Get_rank()
    _log = EventLog(f"{folder}/rank{rank}.log")
    mpi_recorder.install(_log)
    for scenario in scenarios:
        unrecorded.Barrier()
        mpi_recorder.start_test()
        _log.write(TestStart(scenario))
        SCENARIOS[scenario](rank)


if __name__ == "__main__":
    main()

"""MPI halts through mpi4py, held out (the third set): ranks that raise before a collective, and an
unpickling that creates a communicator on one rank only.

``backend="mpi"`` tests, as in benchmarks/field/mpi.py (BACKEND below)."""

from __future__ import annotations

from benchmarks.field.case import Case

BACKEND = "mpi"  # the backend of this family's marks

CASES = [
    Case(
        name="mpi_exception_on_processor_1_before_average",
        url="https://github.com/usnistgov/fipy/issues/265",
        summary="if one process raises an exception before a gathering event (cellVolumeAverage, an "
        "allreduce over the mesh), the run hangs and the test suite never finishes",
        world_size=2,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
x = torch.arange(5.0) + 5 * comm.rank  # this process's cell centers
if comm.rank == 1:
    raise Exception("Exception on processor 1")  # <- culprit line
average = comm.allreduce(x.sum().item(), op=MPI.SUM) / 10  # var.cellVolumeAverage
print(comm.rank, average)
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
x = torch.arange(5.0) + 5 * comm.rank
average = comm.allreduce(x.sum().item(), op=MPI.SUM) / 10
assert average == 4.5
""",
        kind="rank_exited",
        culprits=(1,),
        op="allreduce",
        held_out=True,
    ),
    Case(
        name="mpi_nonzero_ranks_raise_before_communicator",
        url="https://github.com/chainer/chainermn/issues/236",
        summary="the ranks other than 0 raise between two create_communicator calls; rank 0 enters the "
        "second one, a collective over COMM_WORLD, and mpirun never exits",
        world_size=3,
        body="""\
import socket

from mpi4py import MPI


def create_communicator(mpi_comm):  # chainermn.create_communicator('naive'): it maps the hosts
    return mpi_comm.allgather(socket.gethostname())


hosts = create_communicator(MPI.COMM_WORLD)
if MPI.COMM_WORLD.rank != 0:
    raise ValueError("failure!")  # <- culprit line
hosts = create_communicator(MPI.COMM_WORLD)
""",
        twin="""\
import socket

from mpi4py import MPI


def create_communicator(mpi_comm):
    return mpi_comm.allgather(socket.gethostname())


hosts = create_communicator(MPI.COMM_WORLD)
hosts = create_communicator(MPI.COMM_WORLD)
assert len(hosts) == MPI.COMM_WORLD.size
""",
        kind="rank_exited",
        culprits=(1, 2),
        op="allgather",
        held_out=True,
    ),
    Case(
        name="mpi_unpickled_grid_builds_cart_comm_on_one_rank",
        url="https://github.com/devitocodes/devito/pull/1607",
        summary="unpickling a Grid rebuilds its Distributor on COMM_WORLD, whose Cartesian "
        "communicator is a collective; when only one rank calls pickle.loads it hangs (the fix "
        "passes MPI_COMM_SELF to the Distributor upon unpickling)",
        world_size=2,
        body="""\
import pickle

from mpi4py import MPI


class Grid:
    def __init__(self):
        self.cart = MPI.COMM_WORLD.Create_cart([MPI.COMM_WORLD.size])  # the Distributor

    def __getstate__(self):
        return {"shape": (4, 4, 4)}

    def __setstate__(self, state):
        self.cart = MPI.COMM_WORLD.Create_cart([MPI.COMM_WORLD.size])  # <- culprit line


grid = Grid()  # every rank
payload = pickle.dumps(grid.__getstate__())
if MPI.COMM_WORLD.rank == 0:  # only rank 0 unpickles
    new_grid = Grid.__new__(Grid)
    new_grid.__setstate__(pickle.loads(payload))  # what pickle.loads runs for a Grid
""",
        twin="""\
import pickle

from mpi4py import MPI


class Grid:
    def __init__(self):
        self.cart = MPI.COMM_WORLD.Create_cart([MPI.COMM_WORLD.size])

    def __getstate__(self):
        return {"shape": (4, 4, 4)}

    def __setstate__(self, state):
        self.cart = MPI.COMM_SELF.Create_cart([1])  # a single-rank grid: no collective over the world


grid = Grid()
payload = pickle.dumps(grid.__getstate__())
if MPI.COMM_WORLD.rank == 0:
    new_grid = Grid.__new__(Grid)
    new_grid.__setstate__(pickle.loads(payload))
""",
        kind="partial",
        culprits=(0,),
        op="Create_cart",
        held_out=True,
    ),
]

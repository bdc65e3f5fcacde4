"""MPI through mpi4py: communicators that some ranks make and others do not, or make twice (a
split skipped, a Cartesian communicator built on one rank). The marks take the family's backend
(benchmarks/field/mpi.py)."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="mpi_rank_skips_comm_split",
        url="https://github.com/glotzerlab/hoomd-blue/issues/54",
        summary="the simulation hangs with --nrank when a single rank does not proceed to init: "
        "MPI_Comm_split on COMM_WORLD is collective (the fix: split at import)",
        world_size=2,
        body="""\
from mpi4py import MPI

world = MPI.COMM_WORLD


def run_script():
    if world.rank == 1:
        return  # this rank's script ends before init
    partition = world.Split(color=0, key=world.rank)  # <- culprit line
    partition.Free()


run_script()
world.Barrier()
""",
        twin="""\
from mpi4py import MPI

world = MPI.COMM_WORLD
partition = world.Split(color=0, key=world.rank)  # at import, on every rank


def run_script():
    if world.rank == 1:
        return


run_script()
partition.Free()
world.Barrier()
""",
        kind="mismatch",
        culprits=(1,),
        op="Split",
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
    ),
    Case(
        name="mpi_extra_split_in_python_bindings",
        url="https://github.com/Crompulence/cpl-library/issues/7",
        summary="the python bindings' create_comm wrapper calls COMM_WORLD.Split once more than the "
        "library does; COMM_WORLD is shared with the coupled C++ code, which has no matching call, "
        "and the coupled run freezes",
        world_size=2,
        body="""\
from mpi4py import MPI

world = MPI.COMM_WORLD
calling_realm = 1 if world.rank == 0 else 2  # rank 0: the python CFD code, rank 1: the C++ MD code


def cpl_create_comm(realm):  # the library's create_comm: one split of the shared COMM_WORLD
    return world.Split(realm, world.rank)


if calling_realm == 1:  # cpl.py's wrapper
    realm_comm = world.Split(calling_realm, world.Get_rank())  # <- culprit line
    cpl_create_comm(calling_realm)
else:  # the C++ code calls the library directly
    realm_comm = cpl_create_comm(calling_realm)
world.Barrier()
""",
        twin="""\
from mpi4py import MPI

world = MPI.COMM_WORLD
calling_realm = 1 if world.rank == 0 else 2


def cpl_create_comm(realm):
    return world.Split(realm, world.rank)


realm_comm = cpl_create_comm(calling_realm)  # the wrapper returns the library's communicator
world.Barrier()
assert realm_comm.size == 1
""",
        kind="mismatch",
        culprits=(0,),
        op="Split",
    ),
]

"""MPI through mpi4py, held out (the fourth set): a barrier inside a branch that each rank chooses
from its own view of a cache on disk, a split of COMM_WORLD that one coupled code makes twice, a
reduction inside a loop over each rank's own items. The marks take the family's backend
(benchmarks/field/mpi.py)."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="mpi_jit_cache_seen_by_rank0_only",
        url="https://github.com/underworldcode/underworld3/pull/612",
        summary="rank 0 compiles the JIT module and publishes it to a disk cache; when rank 0 sees the "
        "cache and the others do not (NFS attribute caching), they enter the branch with the Barrier "
        "and rank 0 goes on to the solve: no rank returns; the fix reduces the predicate over ranks",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def lookup_module():  # the disk cache: rank 0 published the module, the others' view lags
    return "stokes_jit" if comm.rank == 0 else None


module = lookup_module()
needs_compile = module is None
if needs_compile:
    if comm.rank == 0:
        module = "stokes_jit"  # rank 0 compiles and publishes
    comm.Barrier()  # <- culprit line
    module = "stokes_jit"
residual = comm.allreduce(1.0)  # the Stokes solve
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def lookup_module():
    return "stokes_jit" if comm.rank == 0 else None


module = lookup_module()
needs_compile = comm.allreduce(module is None, op=MPI.LOR)  # if any rank lacks it, every rank compiles
if needs_compile:
    if comm.rank == 0:
        module = "stokes_jit"
    comm.Barrier()
    module = "stokes_jit"
residual = comm.allreduce(1.0)
assert residual == comm.size
""",
        kind="mismatch",
        culprits=(0,),
        op="Barrier",
        held_out=True,
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
        held_out=True,
    ),
    Case(
        name="mpi_allreduce_inside_loop_over_local_completions",
        url="https://github.com/OPM/opm-simulators/pull/6769",
        summary="a distributed well has a different number of completions on each rank, and the "
        "communication sat inside the loop over the well's completions: the rank with fewer leaves "
        "the loop while the others wait in the next reduction; the fix moves it out of the loop",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
completions = [0.1, 0.2, 0.3] if comm.rank != 2 else [0.1]  # this rank's perforations of the well
well_rates = []
for perf_rate in completions:
    well_rates.append(comm.allreduce(perf_rate))  # <- culprit line
comm.Barrier()  # the next timestep
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
completions = [0.1, 0.2, 0.3] if comm.rank != 2 else [0.1]
well_rate = comm.allreduce(sum(completions))  # one reduction, outside the loop
comm.Barrier()
assert abs(well_rate - 1.3) < 1e-9
""",
        kind="mismatch",
        culprits=(2,),
        op="allreduce",
        held_out=True,
    ),
]

"""MPI halts, held out (the fifth set): a broadcast made lazily on a seed's first use, which a rank
with nothing to draw never makes, a neighbourhood collective on a graph whose ranks disagree about
their edges, and an allgather of options one process cannot pickle."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="mpi_seed_broadcast_on_first_use",
        url="https://github.com/radiocosmology/draco/pull/384",
        summary="RandomTask.local_seed broadcasts the seed on its first use; a rank whose first "
        "baseline was fully masked never used it, so the other ranks hung in the broadcast (the fix: "
        "generate the seed in __init__, on every rank)",
        world_size=3,
        body="""\
from mpi4py import MPI

import numpy as np

comm = MPI.COMM_WORLD


class RandomTask:  # draco.core.task.RandomTask
    _local_seed = None

    @property
    def local_seed(self):  # drawn on rank 0 and broadcast, the first time a rank asks for it
        if self._local_seed is None:
            seed = np.random.SeedSequence().entropy if comm.rank == 0 else None
            seed = comm.bcast(seed, root=0)  # <- culprit line
            self._local_seed = seed + comm.rank
        return self._local_seed


task = RandomTask()
baselines = [[False], [True, True], [True]][comm.rank]  # rank 0's one baseline is fully masked
noise = []
for unmasked in baselines:
    if not unmasked:
        continue  # nothing to draw for a masked baseline
    rng = np.random.default_rng(task.local_seed)
    noise.append(rng.standard_normal())
""",
        twin="""\
from mpi4py import MPI

import numpy as np

comm = MPI.COMM_WORLD


class RandomTask:
    def __init__(self):  # the seed generated when the task is made, on every rank
        seed = np.random.SeedSequence().entropy if comm.rank == 0 else None
        seed = comm.bcast(seed, root=0)
        self.local_seed = seed + comm.rank


task = RandomTask()
baselines = [[False], [True, True], [True]][comm.rank]
noise = []
for unmasked in baselines:
    if not unmasked:
        continue
    rng = np.random.default_rng(task.local_seed)
    noise.append(rng.standard_normal())
""",
        kind="partial",
        culprits=(0,),
        op="bcast",
        held_out=True,
    ),
    Case(
        name="mpi_neighbor_allgather_on_inconsistent_graph",
        url="https://github.com/mpi4py/mpi4py/issues/388",
        summary="neighbor_allgather on a communicator from Create_dist_graph_adjacent blocks with no "
        "output: rank 0 lists itself as its source and rank 1 as its destination, rank 1 the "
        "reverse, so no rank receives what another sends (the answer: sources [1], destinations [1] "
        "on rank 0 and [0], [0] on rank 1)",
        world_size=2,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
if rank == 0:
    dist_comm = comm.Create_dist_graph_adjacent([0], [1])
else:
    dist_comm = comm.Create_dist_graph_adjacent([1], [0])
neigh = dist_comm.Get_dist_neighbors()
recv = dist_comm.neighbor_allgather(rank)  # <- culprit line
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
if rank == 0:
    dist_comm = comm.Create_dist_graph_adjacent([1], [1])
else:
    dist_comm = comm.Create_dist_graph_adjacent([0], [0])
neigh = dist_comm.Get_dist_neighbors()
recv = dist_comm.neighbor_allgather(rank)
assert recv == [1 - rank]
""",
        kind="mismatch",
        culprits=(0, 1),
        op="neighbor_allgather",
        held_out=True,
    ),
    Case(
        name="mpi_allgather_of_options_one_proc_cannot_pickle",
        url="https://github.com/OpenMDAO/dymos/issues/1115",
        summary="the timeseries report gathers ALL options of the phases on the other procs; a user's "
        "own non-picklable option on one proc's phase raises there while the others wait (the fix: "
        "gather only the options the report needs)",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


class Phase:  # a dymos phase; the ParallelGroup puts one on each proc
    def __init__(self, name):
        self.options = {"name": name, "time_options": {"units": "s"}, "state_options": {"x": {"units": "m"}}}


phase = Phase(f"phase{comm.rank}")
if comm.rank == 1:
    phase.options["ode_callback"] = lambda t, x: -x  # the user's own option: a lambda
all_options = comm.allgather(phase.options)  # <- culprit line
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


class Phase:
    def __init__(self, name):
        self.options = {"name": name, "time_options": {"units": "s"}, "state_options": {"x": {"units": "m"}}}


phase = Phase(f"phase{comm.rank}")
if comm.rank == 1:
    phase.options["ode_callback"] = lambda t, x: -x
needed = {key: phase.options[key] for key in ("name", "time_options", "state_options")}
all_options = comm.allgather(needed)  # only what the report needs
assert [o["name"] for o in all_options] == ["phase0", "phase1", "phase2"]
""",
        kind="rank_exited",
        culprits=(1,),
        op="allgather",
        held_out=True,
    ),
]

"""MPI halts through mpi4py: a rank that raises while the others wait in a collective or a receive,
a call only the root makes or makes in a loop of its own (communicators some ranks make:
mpi_communicators.py).

These are ``backend="mpi"`` tests: the mark needs ``backend="mpi"`` (BACKEND below), and the body
takes ``MPI.COMM_WORLD``, which the plugin records, from mpi4py itself."""

from __future__ import annotations

from benchmarks.field.case import Case

BACKEND = "mpi"  # the backend of this family's marks

CASES = [
    Case(
        name="mpi_raise_before_barrier",
        url="https://github.com/firedrakeproject/mpi-pytest/issues/12",
        summary="pytest hangs at a barrier if one rank hits an exception: the others wait in "
        "COMM_WORLD.barrier() for the rank that raised",
        world_size=2,
        body="""\
from mpi4py import MPI

if MPI.COMM_WORLD.rank == 0:
    raise ValueError("Test")  # <- culprit line
MPI.COMM_WORLD.barrier()  # it hangs here if there is a barrier
""",
        twin="""\
from mpi4py import MPI

failed = False  # rank 0's check, now passing
failed = MPI.COMM_WORLD.allreduce(failed, op=MPI.LOR)  # parallel_assert: every rank learns the outcome
MPI.COMM_WORLD.barrier()
assert not failed
""",
        kind="rank_exited",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="mpi_root_only_loader_raises_before_bcast",
        url="https://github.com/yt-project/yt/pull/4646",
        summary="load_sample runs on the root only and broadcasts its result; when the root raises, "
        "the other ranks wait in the bcast (the fix: catch on the root and broadcast None)",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def load_sample(name):  # downloads and unpacks a sample dataset
    raise OSError(f"cannot fetch {name}")  # <- culprit line


rv0 = load_sample("IsolatedGalaxy") if comm.rank == 0 else None  # root_only
rv = comm.bcast(rv0, root=0)
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def load_sample(name):
    raise OSError(f"cannot fetch {name}")


rv0 = None
if comm.rank == 0:
    try:
        rv0 = load_sample("IsolatedGalaxy")
    except OSError:
        rv0 = None  # the root reports the failure through the broadcast
rv = comm.bcast(rv0, root=0)
assert rv is None
""",
        kind="rank_exited",
        culprits=(0,),
        op="bcast",
    ),
    Case(
        name="mpi_print_states_on_root_only",
        url="https://github.com/ICHEC/QNLP/pull/5",
        summary="PrintStates gathers over every process of the communicator but only rank 0 called "
        "it, so the processes hung",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
state = torch.full((2,), float(comm.rank))  # this rank's part of the state vector


def print_states(comm, state):
    parts = comm.gather(state, root=0)
    if comm.rank == 0:
        print(torch.cat(parts))


if comm.rank == 0:
    print_states(comm, state)  # <- culprit line
comm.Barrier()
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
state = torch.full((2,), float(comm.rank))


def print_states(comm, state):
    parts = comm.gather(state, root=0)
    if comm.rank == 0:
        print(torch.cat(parts))


print_states(comm, state)  # every process takes part in the gather
comm.Barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="gather",
    ),
    Case(
        name="mpi_replica_raises_master_waits",
        url="https://github.com/tweag/chainsail/issues/108",
        summary="if one of the MPI processes raises an exception, the rexfw system ends up in a "
        "deadlock: the master waits for the replica's message",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def sample(replica):
    if replica == 1:
        raise FloatingPointError("log probability is nan")  # <- culprit line
    return float(replica)


if comm.rank == 0:  # the rexfw master collects each replica's energy
    energies = [comm.recv(source=r, tag=1) for r in range(1, comm.size)]
else:
    comm.send(sample(comm.rank), dest=0, tag=1)
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def sample(replica):
    return float(replica)


if comm.rank == 0:
    energies = [comm.recv(source=r, tag=1) for r in range(1, comm.size)]
    assert energies == [1.0, 2.0]
else:
    comm.send(sample(comm.rank), dest=0, tag=1)
""",
        kind="rank_exited",
        culprits=(1,),
        op="recv",
    ),
    Case(
        name="mpi_manager_rank_check_raises",
        url="https://github.com/inducer/pytato/pull/389",
        summary="an exception on one rank of an MPI+Python program hangs the others (the thread: run "
        "under -m mpi4py, or have the manager rank broadcast whether the DAG was sound)",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def check_dag_soundness():
    if comm.rank == 0:  # the manager rank validates the whole DAG
        raise ValueError("DAG is not sound: a receive without a matching send")  # <- culprit line


check_dag_soundness()
total = torch.zeros(1)
comm.Allreduce(torch.ones(1), total)  # the DAG's first communication
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
sound = comm.bcast(True if comm.rank == 0 else None, root=0)  # the manager tells every rank
assert sound
total = torch.zeros(1)
comm.Allreduce(torch.ones(1), total)
assert total.item() == comm.size
""",
        kind="rank_exited",
        culprits=(0,),
        op="Allreduce",
    ),
    Case(
        name="mpi_checkpoint_listing_on_every_rank",
        url="https://github.com/argonne-lcf/dlio_benchmark/pull/348",
        summary="every rank LISTs the checkpoint folder; a throttled LIST swallowed into [] makes one rank "
        "abort ('0 checkpoints available') while the others go on into the read phase",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def walk_node(folder):  # the object store's recursive LIST
    if comm.rank == 2:
        return []  # SlowDown/503, swallowed by list_objects
    return [f"global_epoch{e}_step1" for e in range(10)]


num_checkpoints_read = 10
num_checkpoints_exists = len(walk_node("checkpoints/llama3-405b"))
if num_checkpoints_read > num_checkpoints_exists:
    raise Exception(  # <- culprit line
        f"Number of checkpoints to be read: {num_checkpoints_read} is more than the number of "
        f"checkpoints available: {num_checkpoints_exists}"
    )
comm.Barrier()  # the read phase's rank synchronization
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def walk_node(folder):
    if comm.rank == 2:
        return []
    return [f"global_epoch{e}_step1" for e in range(10)]


num_checkpoints_read = 10
if comm.rank == 0:  # rank 0 lists once and broadcasts the count
    num_checkpoints_exists = len(walk_node("checkpoints/llama3-405b"))
else:
    num_checkpoints_exists = None
num_checkpoints_exists = comm.bcast(num_checkpoints_exists, root=0)
assert num_checkpoints_read <= num_checkpoints_exists
comm.Barrier()
""",
        kind="rank_exited",
        culprits=(2,),
        op="Barrier",
    ),
    Case(
        name="mpi_uneven_samples_one_rank_fewer_steps",
        url="https://github.com/argonne-lcf/dlio_benchmark/pull/339",
        summary="145 sample files over 3 ranks with batches of 16: ranks 0 and 1 take 3 steps, rank 2 "
        "only 2, so the per-step barriers fall out of step and ranks 0 and 1 wait at a barrier rank 2 "
        "never reaches; the fix aligns the number of sample files at initialization",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
batch_size = 16
samples = [49, 49, 47][comm.rank]  # 145 sample files over 3 ranks
for step in range(samples // batch_size):  # full batches only: 3, 3 and 2 steps
    time.sleep(0.01)  # framework.compute(batch, epoch, block_step, computation_time)
    comm.barrier()  # <- culprit line
comm.barrier()  # end of _train
comm.barrier()  # after the epoch's checkpoint
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD
batch_size = 16
samples = 145 // comm.size  # the number of sample files aligned at initialization: 48 each
for step in range(samples // batch_size):
    time.sleep(0.01)
    comm.barrier()
comm.barrier()
comm.barrier()
""",
        kind="partial",
        culprits=(2,),
        op="barrier",
    ),
    Case(
        name="mpi_root_sends_to_itself_before_receiving",
        url="https://github.com/Chengcheng-Xiao/mpiPyMC/issues/2",
        summary="the program never stops: every process, the collecting one included, sends its "
        "results with comm.send to rank 0 before rank 0 posts its comm.recv, and a blocking send to the "
        "same process hangs; the fix makes rank 0 a main node that only collects",
        world_size=3,
        body="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def monte_carlo(temperature):  # the Ising lattice's energy and magnetization, sweep by sweep
    return [float(temperature)] * 200_000


comm.send(monte_carlo(comm.rank), dest=0, tag=11)  # <- culprit line
if comm.rank == 0:
    results = [comm.recv(source=r, tag=11) for r in range(comm.size)]
""",
        twin="""\
from mpi4py import MPI

comm = MPI.COMM_WORLD


def monte_carlo(temperature):
    return [float(temperature)] * 200_000


if comm.rank == 0:  # the main node only collects
    results = [monte_carlo(0)] + [comm.recv(source=r, tag=11) for r in range(1, comm.size)]
    assert len(results) == comm.size
else:
    comm.send(monte_carlo(comm.rank), dest=0, tag=11)
""",
        kind="p2p_cycle",
        culprits=(0,),
        op="send",
    ),
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
    ),
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
    ),
]

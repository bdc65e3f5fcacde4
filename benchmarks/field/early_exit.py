"""Ranks that end early: an exception, sys.exit, a skipped call before the end, a group
destroyed under a peer."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="barrier_skipped_by_last_rank",
        url="https://github.com/pytorch/pytorch/issues/138322",
        summary="rank 3 skips the first barrier and exits after the second; the others hang in a barrier",
        world_size=4,
        body="""\
if rank != 3:
    dist.barrier()  # <- culprit line
dist.barrier()
""",
        twin="""\
dist.barrier()
dist.barrier()
""",
        kind="partial",
        culprits=(3,),
        op="barrier",
    ),
    Case(
        name="sys_exit_zero_in_signal_handler",
        url="https://github.com/ai2cm/ace/pull/1068",
        summary="the trainer's signal handler calls sys.exit(0) on one rank; its siblings hang on "
        "their next collective",
        world_size=2,
        body="""\
def on_preempt():  # the trainer's chained signal handler
    sys.exit(0)  # <- culprit line


for step in range(3):
    if rank == 1 and step == 1:
        on_preempt()
    dist.all_reduce(torch.ones(2))
""",
        twin="""\
for step in range(3):
    stop = torch.tensor([float(rank == 1 and step == 1)])
    dist.all_reduce(stop)  # the preempted rank tells the others, and all stop together
    if stop.item():
        break
    dist.all_reduce(torch.ones(2))
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="dataset_state_missing_key_on_one_rank",
        url="https://github.com/pytorch/torchtitan/issues/3065",
        summary="an error in the dataloader's load_state_dict on one rank, after the checkpoint "
        "loaded, and the job hangs forever with no timeout",
        world_size=2,
        body="""\
class TextDataset:
    def load_state_dict(self, state):
        self.offset = state["offset"]  # <- culprit line


state = {"offset": 128} if rank == 0 else {}  # rank 1's dataloader state lost its key
ds = TextDataset()
ds.load_state_dict(state)
dist.all_reduce(torch.ones(1))
""",
        twin="""\
class TextDataset:
    def load_state_dict(self, state):
        self.offset = state["offset"]


ds = TextDataset()
ds.load_state_dict({"offset": 128})
dist.all_reduce(torch.ones(1))
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="failed_assert_before_final_barrier",
        url="https://github.com/NVIDIA/Fuser/issues/3092",
        summary="a Python distributed test does not exit when one rank fails: each test waits for a "
        "barrier before finishing and the failed rank never enters it",
        world_size=2,
        body="""\
result = torch.full((2,), float(rank))
assert result.sum().item() == 0.0  # <- culprit line
dist.barrier()  # each test waits for the others before finishing
""",
        twin="""\
result = torch.full((2,), float(rank))
assert result.sum().item() == 2.0 * rank
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1,),
        op="barrier",
    ),
    Case(
        name="ranks_raise_while_rank0_gathers",
        url="https://github.com/pytorch/pytorch/issues/76760",
        summary="ranks raise on purpose while rank 0 is in all_gather; every process hangs (the "
        "thread's MPI backend, here Gloo)",
        world_size=4,
        held_out=True,
        body="""\
out = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
t = torch.arange(1, dtype=torch.int64) + rank
if rank == 0:
    dist.all_gather(out, t)
else:
    raise RuntimeError("to kill a process")  # <- culprit line
""",
        twin="""\
out = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
t = torch.arange(1, dtype=torch.int64) + rank
dist.all_gather(out, t)
""",
        kind="rank_exited",
        culprits=(1, 2, 3),
        op="all_gather",
    ),
    Case(
        name="job_loop_raises_before_barrier",
        url="https://github.com/tier4/Diffusion-Planner/pull/336",
        summary="one rank raises in its job loop; the others wait at the barrier until the job's time limit",
        world_size=3,
        held_out=True,
        body="""\
for job in range(rank, 6, world_size):
    if job == 3:
        raise ValueError(f"scenario {job} failed")  # <- culprit line
dist.barrier()
""",
        twin="""\
done = [job for job in range(rank, 6, world_size)]
dist.barrier()
assert done
""",
        kind="rank_exited",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="destroy_on_rank0_while_peer_syncs",
        url="https://github.com/pytorch/pytorch/issues/75097",
        summary="destroy_process_group() called on rank 0 only hangs; the maintainer's answer: one "
        "rank finished and destroyed the group while the others still run",
        world_size=2,
        body="""\
dist.all_reduce(torch.ones(1))
if rank == 0:
    dist.destroy_process_group()
else:
    dist.all_reduce(torch.ones(1))  # <- culprit line
""",
        twin="""\
dist.all_reduce(torch.ones(1))
dist.all_reduce(torch.ones(1))
dist.barrier()
dist.destroy_process_group()
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="rank_process_dies_mid_training",
        url="https://github.com/NVIDIA/nvidia-resiliency-ext/issues/143",
        summary="process 3 of 4 exits unexpectedly; the others get stuck waiting for its communication",
        world_size=4,
        body="""\
for step in range(3):
    if rank == 3 and step == 1:
        os._exit(1)  # <- culprit line
    dist.all_reduce(torch.ones(4))
""",
        twin="""\
for step in range(3):
    dist.all_reduce(torch.ones(4))
""",
        kind="rank_exited",
        culprits=(3,),
        op="all_reduce",
    ),
    Case(
        name="root_only_setup_raises_before_barrier",
        url="https://github.com/mphowardlab/relentless/issues/221",
        summary="the particle packing is called by the root rank only; when it throws, the other ranks "
        "deadlock at a later barrier the root never reaches (the thread's mpi4py, here Gloo)",
        world_size=3,
        body="""\
def pack_particles(volume_fraction):
    if volume_fraction > 0.6:
        raise ValueError("cannot pack particles at this volume fraction")  # <- culprit line
    return [0.0]


if rank == 0:
    positions = pack_particles(0.7)
dist.barrier()
""",
        twin="""\
def pack_particles(volume_fraction):
    if volume_fraction > 0.6:
        raise ValueError("cannot pack particles at this volume fraction")
    return [0.0]


if rank == 0:
    positions = pack_particles(0.5)
dist.barrier()
""",
        kind="rank_exited",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="shutdown_barrier_after_peer_oom",
        url="https://github.com/ai2cm/ace/pull/1067",
        summary="the barrier in shutdown() makes surviving ranks hang when a peer has already exited "
        "(an OOM, an unhandled exception)",
        world_size=2,
        held_out=True,
        body="""\
def train_step(step):
    if rank == 1 and step == 1:
        raise torch.OutOfMemoryError("CUDA out of memory")  # <- culprit line


for step in range(2):
    train_step(step)
dist.barrier()  # ModelTorchDistributed.shutdown()
""",
        twin="""\
def train_step(step):
    pass


for step in range(2):
    train_step(step)
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1,),
        op="barrier",
    ),
]

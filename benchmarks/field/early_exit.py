"""Ranks that end early: an exception, sys.exit, a skipped call before the end, a group
destroyed under a peer (for their data: early_exit_data.py)."""

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
    Case(
        name="gather_list_on_non_destination_ranks",
        url="https://github.com/pytorch/pytorch/pull/161467",
        summary="gather() requires gather_list to be None on non-destination ranks (the docstring "
        "the thread added): ranks that allocate it everywhere raise while dst waits in the gather",
        world_size=3,
        body="""\
t = torch.full((2,), float(rank))
gather_list = [torch.zeros(2) for _ in range(world_size)]  # allocated on every rank
dist.gather(t, gather_list, dst=0)  # <- culprit line
dist.barrier()
""",
        twin="""\
t = torch.full((2,), float(rank))
gather_list = [torch.zeros(2) for _ in range(world_size)] if rank == 0 else None
dist.gather(t, gather_list, dst=0)
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1, 2),
        op="gather",
    ),
    Case(
        name="shape_check_raises_on_one_rank",
        url="https://github.com/pytorch/torchtitan/issues/1790",
        summary="distributed training hangs on a local error instead of exiting: one rank's sample "
        "fails a shape check and raises, the others wait for it in the next collective",
        world_size=2,
        body="""\
model = DDP(nn.Conv1d(4, 4, 1))
for step in range(2):
    x = torch.ones(1, 2, 8)
    y = torch.ones(1, 2, 6 if rank == 1 and step == 1 else 8)  # one rank's sample is shorter
    if x.shape[2:] != y.shape[2:]:
        raise ValueError(f"x.shape[2:] != y.shape[2:], {x.shape[2:]=}, {y.shape[2:]=}")  # <- culprit line
    model(torch.cat([x, y], dim=1)).sum().backward()
""",
        twin="""\
model = DDP(nn.Conv1d(4, 4, 1))
for step in range(2):
    x = torch.ones(1, 2, 8)
    y = torch.ones(1, 2, 6 if rank == 1 and step == 1 else 8)
    y = nn.functional.pad(y, (0, x.shape[2] - y.shape[2]))  # the dataset pads to the common length
    model(torch.cat([x, y], dim=1)).sum().backward()
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="train_step_raises_after_has_data_allreduce",
        url="https://github.com/rwth-i6/returnn/issues/1484",
        summary="PyTorch distributed training hangs in all_reduce(_has_data) after an exception on one "
        "rank: the others go on to the next step's _has_data all_reduce",
        world_size=2,
        body="""\
def train_step(step):
    if rank == 1 and step == 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")  # <- culprit line


for step in range(3):
    has_data = torch.tensor([1])
    dist.all_reduce(has_data)  # _has_data: every rank still has a batch
    train_step(step)
""",
        twin="""\
def train_step(step):
    pass


for step in range(3):
    has_data = torch.tensor([1])
    dist.all_reduce(has_data)
    train_step(step)
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="eval_on_master_hits_cache_barrier_alone",
        url="https://github.com/huggingface/transformers/pull/1081",
        summary="evaluation runs on the master process only and load_and_cache_examples' barrier "
        "waits for the other processes, which already exited (the fix: no barrier when evaluating)",
        world_size=2,
        body="""\
def load_and_cache_examples(evaluate=False):
    if rank not in [-1, 0]:
        dist.barrier()  # only the first process builds the features cache
    features = [0.0]  # convert_examples_to_features, or the cache
    if rank == 0:
        dist.barrier()  # <- culprit line
    return features


load_and_cache_examples()  # training, on every process
if rank in [-1, 0]:  # evaluation, on the master process only
    load_and_cache_examples(evaluate=True)
""",
        twin="""\
def load_and_cache_examples(evaluate=False):
    if rank not in [-1, 0] and not evaluate:
        dist.barrier()
    features = [0.0]
    if rank == 0 and not evaluate:
        dist.barrier()
    return features


load_and_cache_examples()
if rank in [-1, 0]:
    load_and_cache_examples(evaluate=True)
""",
        kind="partial",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="save_returns_early_off_rank0",
        url="https://github.com/EleutherAI/sparsify/pull/5",
        summary="the trainer hangs after save(): its first `if` sends the other processes out of the "
        "function at once, so only rank 0 reaches the barrier while they move on to the reduce",
        world_size=3,
        body="""\
def save():
    if rank != 0:
        return  # only rank 0 writes the layers
    torch.save({"step": 999}, ddp_shared_path / "sae.pt")
    dist.barrier()  # <- culprit line


for step in range(2):
    dist.all_reduce(torch.ones(2))  # the step's reduce
    if step == 0:
        save()
""",
        twin="""\
def save():
    if rank == 0:
        torch.save({"step": 999}, ddp_shared_path / "sae.pt")
    dist.barrier()  # every process reaches it


for step in range(2):
    dist.all_reduce(torch.ones(2))
    if step == 0:
        save()
""",
        kind="mismatch",
        # `if rank != 0: return` before the barrier is `if rank == 0:` around it: rank 0 is in a call its
        # peers never make, as in every case of such a branch here (the fix takes the call out of it).
        # Labelled (1, 2) before 2026-11-29: the ranks that returned, against this corpus's own rule.
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="destroy_process_group_in_finally_after_raise",
        url="https://github.com/pytorch/torchtitan/pull/1342",
        summary="train.py destroys the process group in a `finally:`; when one trainer raises while "
        "the others are in a collective, the cleanup runs under them (the fix destroys it only when "
        "the trainer exits successfully)",
        world_size=2,
        body="""\
class Trainer:
    def train(self):
        for step in range(3):
            if rank == 1 and step == 1:
                raise RuntimeError("CUDA out of memory")  # <- culprit line
            dist.all_reduce(torch.ones(2))  # the step's collectives

    def close(self):
        pass


trainer = Trainer()
try:
    trainer.train()
finally:
    trainer.close()
    dist.destroy_process_group()
""",
        twin="""\
class Trainer:
    def train(self):
        for step in range(3):
            dist.all_reduce(torch.ones(2))

    def close(self):
        pass


trainer = Trainer()
try:
    trainer.train()
except Exception:
    raise
else:  # only a trainer that exited successfully ends the group
    trainer.close()
    dist.destroy_process_group()
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="checkpoint_download_raises_before_barrier",
        url="https://github.com/mosaicml/composer/pull/334",
        summary="one process crashes (a failed checkpoint download) before the checkpointer's "
        "dist.barrier, and the process that reached the barrier hangs (the fix: try/finally around "
        "the download)",
        world_size=2,
        body="""\
def download_checkpoint(uri):  # the object store fetch, on every rank
    if rank == 1:
        raise FileNotFoundError(uri)  # <- culprit line
    return {"epoch": 1}


state = download_checkpoint("s3://bucket/ep1.pt")
dist.barrier()  # every rank has its checkpoint before loading
""",
        twin="""\
def download_checkpoint(uri):
    return {"epoch": 1}


try:
    state = download_checkpoint("s3://bucket/ep1.pt")
finally:
    dist.barrier()  # released even when a download raises; the error propagates after it
""",
        kind="rank_exited",
        culprits=(1,),
        op="barrier",
    ),
    Case(
        name="empty_tail_batch_fails_collate_on_higher_rank",
        url="https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5527",
        summary="MegatronPretrainingSampler with drop_last=False yields the tail of a global micro-batch "
        "to every rank; with five samples, micro-batch size two and two ranks, rank 1's tail is "
        "empty and collating it raises IndexError after rank 0 has advanced into the step",
        world_size=2,
        body="""\
class MegatronPretrainingSampler:  # a fixed rank-local window of each global micro-batch
    def __init__(self, total, micro_batch_size, drop_last):
        self.total, self.mbs, self.drop_last = total, micro_batch_size, drop_last

    def __iter__(self):
        batch, start = [], rank * self.mbs
        for idx in range(self.total):
            batch.append(idx)
            if len(batch) == self.mbs * world_size:
                yield batch[start : start + self.mbs]
                batch = []
        if batch and not self.drop_last:
            yield batch[start : start + self.mbs]  # the tail: [4] on rank 0, [] on rank 1


samples = torch.arange(5.0)
loader = torch.utils.data.DataLoader(samples, batch_sampler=MegatronPretrainingSampler(5, 2, False))
for batch in loader:  # <- culprit line
    dist.all_reduce(batch.sum().reshape(1))  # the step's gradient reduction
""",
        twin="""\
class MegatronPretrainingSampler:
    def __init__(self, total, micro_batch_size, drop_last):
        self.total, self.mbs, self.drop_last = total, micro_batch_size, drop_last

    def __iter__(self):
        batch, start = [], rank * self.mbs
        for idx in range(self.total):
            batch.append(idx)
            if len(batch) == self.mbs * world_size:
                yield batch[start : start + self.mbs]
                batch = []
        if batch and not self.drop_last:
            yield batch[start : start + self.mbs]


samples = torch.arange(5.0)
loader = torch.utils.data.DataLoader(samples, batch_sampler=MegatronPretrainingSampler(5, 2, True))
for batch in loader:  # drop_last=True: the partial tail is dropped on every rank
    dist.all_reduce(batch.sum().reshape(1))
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="max_steps_closes_main_only_progress_bar",
        url="https://github.com/neuralmagic/yolov5/pull/101",
        summary="with DDP and max_steps set, the run fails on the non-main nodes: they update a "
        "progress bar that only the main process created",
        world_size=2,
        body="""\
from tqdm import tqdm

model = DDP(nn.Linear(4, 1))
batches = [torch.ones(2, 4)] * 4
pbar = enumerate(batches)
if rank == 0:  # RANK in {-1, 0}: the progress bar is the main process's
    pbar = tqdm(pbar, total=len(batches), disable=True)
max_steps = 2
for i, batch in pbar:
    model(batch).sum().backward()
    if i + 1 >= max_steps:
        pbar.close()  # <- culprit line
        break
dist.barrier()  # the final evaluation waits for every process
""",
        twin="""\
from tqdm import tqdm

model = DDP(nn.Linear(4, 1))
batches = [torch.ones(2, 4)] * 4
pbar = enumerate(batches)
if rank == 0:
    pbar = tqdm(pbar, total=len(batches), disable=True)
max_steps = 2
for i, batch in pbar:
    model(batch).sum().backward()
    if i + 1 >= max_steps:
        if rank == 0:  # only the main process has a progress bar to close
            pbar.close()
        break
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1,),
        op="barrier",
    ),
]

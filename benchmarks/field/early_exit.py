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
        name="dataloader_item_raises_on_one_rank",
        url="https://github.com/hpcaitech/Open-Sora/issues/815",
        summary="training stuck after epoch 0: rank 0's DataLoader raised (a worker exited "
        "unexpectedly) while the other ranks wait for it in the gradient all_reduce",
        world_size=2,
        body="""\
class VideoDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if rank == 0 and i == 2:  # a corrupt clip in rank 0's shard
            raise RuntimeError("DataLoader worker (pid 8864) exited unexpectedly")  # <- culprit line
        return torch.ones(4)


model = DDP(nn.Linear(4, 1))
for batch in torch.utils.data.DataLoader(VideoDataset(), batch_size=1):
    model(batch).sum().backward()
""",
        twin="""\
class VideoDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.ones(4)


model = DDP(nn.Linear(4, 1))
for batch in torch.utils.data.DataLoader(VideoDataset(), batch_size=1):
    model(batch).sum().backward()
""",
        kind="rank_exited",
        culprits=(0,),
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
        name="prefetch_thread_dies_main_waits",
        url="https://github.com/microsoft/infinibatch/issues/17",
        summary="training is stuck if the data loader's worker has an exception: the worker dies and "
        "the training process waits forever for its next batch, its peers in the all_reduce",
        world_size=2,
        body="""\
import queue


def next_batch():  # the loader's prefetch worker fills a queue
    batches = queue.Queue()

    def worker():
        if rank == 0:
            raise OSError("corrupt shard")  # <- culprit line
        batches.put(torch.ones(2))

    threading.Thread(target=worker, daemon=True).start()
    return batches.get()  # waits for a batch the dead worker never puts


dist.all_reduce(next_batch())
""",
        twin="""\
import queue


def next_batch():
    batches = queue.Queue()

    def worker():
        batches.put(torch.ones(2))

    threading.Thread(target=worker, daemon=True).start()
    return batches.get()


dist.all_reduce(next_batch())
""",
        kind="timeout",
        culprits=(0,),
        op=None,
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
        name="eval_hook_raises_on_rank_without_samples",
        url="https://github.com/NVIDIA-TAO/tao-pytorch/pull/74",
        summary="Lightning invokes the validation-epoch-end hook on a rank that received no samples; the "
        "hook raised before the metric reduction and the other ranks deadlocked in it; the fix enters the "
        "collective with zero local statistics",
        world_size=3,
        body="""\
def on_validation_epoch_end(outputs):  # OneFormer's mIoU over the validation set
    if not outputs:
        raise RuntimeError("no validation outputs on this rank")  # <- culprit line
    stats = torch.tensor([sum(i for i, _ in outputs), sum(u for _, u in outputs)], dtype=torch.float32)
    dist.all_reduce(stats)  # intersect and union over ranks
    return stats[0] / stats[1]


outputs = [(3, 4), (2, 4)] if rank != 2 else []  # the small validation set leaves rank 2 no sample
miou = on_validation_epoch_end(outputs)
""",
        twin="""\
def on_validation_epoch_end(outputs):
    # enter the collective with zero local statistics, so that ranks cannot diverge
    stats = torch.tensor([sum(i for i, _ in outputs), sum(u for _, u in outputs)], dtype=torch.float32)
    dist.all_reduce(stats)
    return stats[0] / stats[1]


outputs = [(3, 4), (2, 4)] if rank != 2 else []
miou = on_validation_epoch_end(outputs)
assert miou.item() == 10 / 16
""",
        kind="rank_exited",
        culprits=(2,),
        op="all_reduce",
    ),
    Case(
        name="webdataset_rank_without_shards",
        url="https://github.com/webdataset/webdataset/issues/188",
        summary="one shard file for two training processes: the process that ends up with no shard has "
        "an empty epoch and the other hangs in the step it never takes; the answer: enough shards for "
        "every process",
        world_size=2,
        body="""\
shards = ["shard-000000.tar"]  # a large samples_per_shard: all samples in one shard file
my_shards = shards[rank::world_size]  # split by node: rank 1 gets none
model = DDP(nn.Linear(4, 1))
for shard in my_shards:
    for sample in range(3):  # the samples of the shard
        model(torch.ones(1, 4)).sum().backward()  # <- culprit line
""",
        twin="""\
shards = [f"shard-{i:06d}.tar" for i in range(2)]  # a smaller samples_per_shard: a shard per process
my_shards = shards[rank::world_size]
model = DDP(nn.Linear(4, 1))
for shard in my_shards:
    for sample in range(3):
        model(torch.ones(1, 4)).sum().backward()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="dataset_downloaded_on_node_zero_only",
        url="https://github.com/pytorch/ignite/pull/1924",
        summary="the examples download the dataset on rank 0 only (idist.get_rank() > 0 waits), so the "
        "processes of the second node find no dataset on their disk and fail while the first node's wait "
        "to train; the fix downloads on each node's local rank 0",
        world_size=4,
        body="""\
def CIFAR10(root, download=False):  # torchvision's dataset: the files on this node's disk
    if download:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cifar-10-batches-py").write_text("data")
    if not (root / "cifar-10-batches-py").exists():
        raise RuntimeError("Dataset not found or corrupted.")  # <- culprit line
    return [torch.ones(4)] * 2


node_root = ddp_shared_path / f"node{rank // 2}"  # two nodes of two processes, a disk each
if rank > 0:  # idist.get_rank() > 0: ensure that only rank 0 downloads the dataset
    dist.barrier()
train_ds = CIFAR10(node_root, download=rank == 0)
if rank == 0:
    dist.barrier()
for x in train_ds:
    dist.all_reduce(x)  # the training steps
""",
        twin="""\
def CIFAR10(root, download=False):
    if download:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cifar-10-batches-py").write_text("data")
    if not (root / "cifar-10-batches-py").exists():
        raise RuntimeError("Dataset not found or corrupted.")
    return [torch.ones(4)] * 2


node_root = ddp_shared_path / f"node{rank // 2}"
local_rank = rank % 2
if local_rank > 0:  # idist.get_local_rank() > 0: local rank 0 downloads on each node
    dist.barrier()
train_ds = CIFAR10(node_root, download=local_rank == 0)
if local_rank == 0:
    dist.barrier()
for x in train_ds:
    dist.all_reduce(x)
""",
        kind="rank_exited",
        culprits=(2, 3),
        op="all_reduce",
    ),
]

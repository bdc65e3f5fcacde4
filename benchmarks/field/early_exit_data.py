"""Ranks that end early for their data: a loader that raises, a prefetch thread that dies, a
rank with no shard or no samples, a dataset fetched on one node."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
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

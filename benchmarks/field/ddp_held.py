"""DistributedDataParallel, held out (the third set): a rank that skips a backward, a rank whose
data runs out first."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="no_valid_anchor_batch_skipped_per_rank",
        url="https://github.com/NVIDIA-NeMo/Automodel/pull/2468",
        summary="the trainer raises NoValidAnchorsError when every sample of a micro-batch is too "
        "short, and the loop catches it with a per-rank `continue`, skipping that rank's backward "
        "and its gradient all-reduce",
        world_size=2,
        body="""\
class NoValidAnchorsError(Exception):
    pass


model = DDP(nn.Linear(4, 1))
lengths = [8, 2, 8] if rank == 1 else [8, 8, 8]  # rank 1's second micro-batch: all short samples
for length in lengths:
    try:
        if length < 4:
            raise NoValidAnchorsError()
        loss = model(torch.ones(2, 4)).sum()
    except NoValidAnchorsError:
        continue  # per-rank skip: no backward
    loss.backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
lengths = [8, 2, 8] if rank == 1 else [8, 8, 8]
for length in lengths:
    has_valid = torch.tensor([int(length >= 4)])
    dist.all_reduce(has_valid, op=dist.ReduceOp.MIN)  # _all_ranks_have_valid: skip together
    if not has_valid.item():
        continue
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
        held_out=True,
    ),
    Case(
        name="iterable_dataset_fewer_samples_on_rank0",
        url="https://github.com/pytorch/pytorch/issues/141069",
        summary="an IterableDataset with DDP and unequal data lengths: rank 0 gets fewer samples, "
        "runs out of batches first, and the other ranks time out in the gradient all-reduce",
        world_size=4,
        body="""\
class ToyIterableDataset(torch.utils.data.IterableDataset):
    def __iter__(self):
        n = 6 if rank == 0 else 8  # intentionally imbalanced: rank 0 holds fewer samples
        return iter(torch.ones(n, 4))


model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in torch.utils.data.DataLoader(ToyIterableDataset(), batch_size=2):
    opt.zero_grad()
    model(batch).sum().backward()  # <- culprit line
    opt.step()
""",
        twin="""\
class ToyIterableDataset(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.ones(8, 4))  # balanced: every rank the same number of samples


model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in torch.utils.data.DataLoader(ToyIterableDataset(), batch_size=2):
    opt.zero_grad()
    model(batch).sum().backward()
    opt.step()
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
        held_out=True,
    ),
]

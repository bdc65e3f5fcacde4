"""DistributedDataParallel: uneven inputs, unused parameters, a rank that skips a step or
its backward (training stopped early on one rank: ddp_stopping.py; an evaluation on one rank
through the wrapper: ddp_evaluation.py)."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="ddp_uneven_inputs",
        url="https://github.com/pytorch/pytorch/issues/38174",
        summary="DDP obliges an equal number of inputs per process; a rank with one batch more waits "
        "in its gradient all_reduce for peers that finished (the RFC that became join())",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in [torch.ones(2, 4)] * (3 + rank):  # rank 1 holds one batch more
    opt.zero_grad()
    loss = model(x).sum()
    loss.backward()  # <- culprit line
    opt.step()
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with model.join():
    for x in [torch.ones(2, 4)] * (3 + rank):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="ddp_sharded_data_without_padding",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/20404",
        summary="uneven inputs in DDP with data sharded by hand: 10 samples over 3 ranks, the rank "
        "with 4 hangs in its last step",
        world_size=3,
        body="""\
model = DDP(nn.Linear(1, 1))
shard = list(range(10))[rank::world_size]  # 4, 3, 3 samples
for v in shard:
    loss = model(torch.tensor([[float(v)]])).sum()
    loss.backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(1, 1))
shard = list(range(10))[rank::world_size][: 10 // world_size]  # drop the remainder, as drop_last
for v in shard:
    loss = model(torch.tensor([[float(v)]])).sum()
    loss.backward()
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="ddp_unused_parameters",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/6409",
        summary="find_unused_parameters=False with a module the loss never uses stops multi-GPU training",
        world_size=2,
        body="""\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.aux = nn.Linear(4, 4)  # a head this loss never reaches

    def forward(self, x):
        return self.used(x)


model = DDP(Net())
for _ in range(2):
    model(torch.ones(2, 4)).sum().backward()  # <- culprit line
""",
        twin="""\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.aux = nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


model = DDP(Net(), find_unused_parameters=True)
for _ in range(2):
    model(torch.ones(2, 4)).sum().backward()
""",
        kind="failed",
        culprits=(0, 1),
        op=None,
    ),
    Case(
        name="ddp_rank_skips_nonfinite_step",
        url="https://github.com/facebookresearch/fairscale/issues/754",
        summary="ranks that see NaNs skip the step and the others do not: they desync, collectives deadlock",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
for step in range(3):
    x = torch.ones(2, 4)
    if rank == 1 and step == 1:
        x[0, 0] = float("nan")  # a bad sample on one rank
    if not torch.isfinite(x).all():
        continue  # this rank skips the step alone
    loss = model(x).sum()
    loss.backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
for step in range(3):
    x = torch.ones(2, 4)
    if rank == 1 and step == 1:
        x[0, 0] = float("nan")
    bad = torch.tensor([float(not torch.isfinite(x).all())])
    dist.all_reduce(bad)  # every rank skips the step if any saw a NaN
    if bad.item():
        continue
    loss = model(x).sum()
    loss.backward()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="ddp_zeros_like_loss_on_nan",
        url="https://github.com/PrimeIntellect-ai/prime-rl/pull/1961",
        summary="a NaN loss is replaced by torch.zeros_like(loss), which has no grad_fn: backward "
        "raises on that rank and the others hang in the gradient collective",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
for step in range(2):
    x = torch.ones(2, 4)
    if rank == 1 and step == 1:
        x[0, 0] = float("nan")  # a bad sample on one rank
    loss = model(x).sum()
    safe_loss = torch.zeros_like(loss) if torch.isnan(loss) else loss
    safe_loss.backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
for step in range(2):
    x = torch.ones(2, 4)
    if rank == 1 and step == 1:
        x[0, 0] = float("nan")
    loss = model(x).sum()
    safe_loss = loss * 0 if torch.isnan(loss) else loss  # keeps the graph, so the hooks fire
    safe_loss.backward()
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="ddp_training_step_returns_none_on_one_process",
        url="https://github.com/Lightning-AI/pytorch-lightning/pull/5359",
        summary="training_step returns None for an invalid loss on one process, which skips its "
        "backward; in DDP the other process waits for its gradients (the skipping one ends a step early)",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2, 4)).sum()
    if rank == 0 and step == 1:
        loss = loss * float("inf")  # an invalid loss on one process
    if not torch.isfinite(loss):
        continue  # training_step returned None: skip the batch
    loss.backward()  # <- culprit line
    opt.step()
    opt.zero_grad()
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2, 4)).sum()
    if rank == 0 and step == 1:
        loss = loss * float("inf")
    invalid = torch.tensor([float(not torch.isfinite(loss))])
    dist.all_reduce(invalid)  # "skip_if_any": every process skips the update together
    if invalid.item():
        opt.zero_grad()
        (loss * 0).nan_to_num().backward()  # the backward still runs, so DDP's hooks match
        opt.zero_grad()
        continue
    loss.backward()
    opt.step()
    opt.zero_grad()
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="ddp_no_sync_on_wrong_microbatch",
        url="https://github.com/modelscope/FunASR/pull/3472",
        summary="the batch_idx % accum_grad condition synchronizes the first microbatch and runs the "
        "optimizer-step microbatch under no_sync(), leaving rank-local accumulated gradients",
        world_size=2,
        body="""\
import contextlib

model = DDP(nn.Linear(1, 1, bias=False))
accum_grad = 2
for batch_idx in range(4):
    sync = batch_idx % accum_grad == 0  # <- culprit line
    with contextlib.nullcontext() if sync else model.no_sync():
        model(torch.full((1, 1), float(rank + batch_idx))).sum().backward()
    if (batch_idx + 1) % accum_grad == 0:  # the optimizer step
        grads = [torch.zeros(1, 1) for _ in range(world_size)]
        dist.all_gather(grads, model.module.weight.grad)
        assert all(torch.equal(g, grads[0]) for g in grads), f"replicas diverged: {grads}"
        model.zero_grad()
""",
        twin="""\
import contextlib

model = DDP(nn.Linear(1, 1, bias=False))
accum_grad = 2
for batch_idx in range(4):
    sync = (batch_idx + 1) % accum_grad == 0  # synchronize the last microbatch of each step
    with contextlib.nullcontext() if sync else model.no_sync():
        model(torch.full((1, 1), float(rank + batch_idx))).sum().backward()
    if (batch_idx + 1) % accum_grad == 0:
        grads = [torch.zeros(1, 1) for _ in range(world_size)]
        dist.all_gather(grads, model.module.weight.grad)
        assert all(torch.equal(g, grads[0]) for g in grads), f"replicas diverged: {grads}"
        model.zero_grad()
""",
        kind="failed",
        culprits=(0, 1),
        op=None,
    ),
    Case(
        name="ddp_duration_batches_without_join",
        url="https://github.com/lhotse-speech/lhotse/pull/695",
        summary="with drop_last=False a duration-bucketing sampler can give one rank fewer batches "
        "than another; the thread recommends drop_last=True or DDP's join()",
        world_size=2,
        body="""\
model = DDP(nn.Linear(2, 1))
durations = [1.0, 2.0, 1.5, 0.5, 2.5, 1.0, 0.5][rank::world_size]  # this rank's cuts
batches, batch, total = [], [], 0.0
for d in durations:  # batches of at most 2 s of audio
    if batch and total + d > 2.0:
        batches.append(batch)
        batch, total = [], 0.0
    batch.append(d)
    total += d
batches.append(batch)
for batch in batches:
    x = torch.tensor([[d, 1.0] for d in batch])
    model(x).sum().backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(2, 1))
durations = [1.0, 2.0, 1.5, 0.5, 2.5, 1.0, 0.5][rank::world_size]
batches, batch, total = [], [], 0.0
for d in durations:
    if batch and total + d > 2.0:
        batches.append(batch)
        batch, total = [], 0.0
    batch.append(d)
    total += d
batches.append(batch)
with model.join():  # the rank that runs out shadows the others' collectives
    for batch in batches:
        x = torch.tensor([[d, 1.0] for d in batch])
        model(x).sum().backward()
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="ddp_sampler_last_batch_not_redistributed",
        url="https://github.com/lhotse-speech/lhotse/pull/1277",
        summary="with drop_last=False the distributed sampler gives one rank a mini-batch more than the "
        "others and the training loop hangs; the fix redistributes the last mini-batches so every rank "
        "yields a partial one",
        world_size=3,
        body="""\
cuts = list(range(14))
batches = [cuts[i : i + 2] for i in range(0, len(cuts), 2)]  # 7 mini-batches of 2 cuts
my_batches = batches[rank::world_size]  # drop_last=False: 3, 2 and 2 mini-batches
model = DDP(nn.Linear(1, 1))
for batch in my_batches:
    x = torch.tensor(batch, dtype=torch.float32).unsqueeze(1)
    model(x).sum().backward()  # <- culprit line
""",
        twin="""\
cuts = list(range(14))
batches = [cuts[i : i + 2] for i in range(0, len(cuts), 2)]
full = len(batches) // world_size * world_size
my_batches = batches[:full][rank::world_size]
leftover = [cut for batch in batches[full:] for cut in batch]  # the last round, split across ranks
my_batches.append(leftover[rank::world_size] or leftover[:1])  # a partial mini-batch on every rank
model = DDP(nn.Linear(1, 1))
for batch in my_batches:
    x = torch.tensor(batch, dtype=torch.float32).unsqueeze(1)
    model(x).sum().backward()
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="ddp_ceil_partition_leaves_last_rank_short",
        url="https://github.com/k2-fsa/snowfall/issues/152",
        summary="the sampler partitions utterances with ceil(total / world_size), so the last rank gets "
        "fewer; it exits earlier and the nodes with more utterances wait in the all_reduce of backward",
        world_size=3,
        body="""\
from math import ceil

total = 10  # utterances in the dataset
per_partition = int(ceil(total / float(world_size)))
partition_start = rank * per_partition
partition_end = min(partition_start + per_partition, total)  # 4, 4 and 2 utterances
model = DDP(nn.Linear(1, 1))
for utt in range(partition_start, partition_end):
    loss = model(torch.tensor([[float(utt)]])).sum()
    loss.backward()  # <- culprit line
""",
        twin="""\
total = 10
per_partition = total // world_size  # the same number on every node, the remainder dropped
partition_start = rank * per_partition
partition_end = partition_start + per_partition
model = DDP(nn.Linear(1, 1))
for utt in range(partition_start, partition_end):
    loss = model(torch.tensor([[float(utt)]])).sum()
    loss.backward()
""",
        kind="partial",
        culprits=(2,),
        op="all_reduce",
    ),
    Case(
        name="ddp_expert_skipped_on_rank_without_tokens",
        url="https://github.com/NVIDIA/Megatron-LM/pull/4851",
        summary="a rank that receives zero locally-routed tokens skips the expert MLP's linear layers "
        "while its peers run them; the autograd graphs diverge and the next DDP collective hangs; the "
        "fix runs a zero-probability synthetic token through the experts",
        world_size=2,
        body="""\
class MoELayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(4, 4)
        self.linear_fc1 = nn.Linear(4, 4)  # TEGroupedMLP's experts

    def forward(self, x, tokens_per_expert):
        h = self.router(x)
        if sum(tokens_per_expert) == 0:  # no token routed to this rank's experts
            return h
        return h + self.linear_fc1(h)


model = DDP(MoELayer())
tokens_per_expert = [0, 0] if rank == 1 else [3, 5]  # heavy expert-parallel imbalance
loss = model(torch.ones(2, 4), tokens_per_expert).sum()
loss.backward()  # <- culprit line
""",
        twin="""\
class MoELayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(4, 4)
        self.linear_fc1 = nn.Linear(4, 4)

    def forward(self, x, tokens_per_expert):
        h = self.router(x)
        probs = 1.0 if sum(tokens_per_expert) else 0.0  # a synthetic token, zero routing probability
        return h + probs * self.linear_fc1(h)  # the experts run on every rank


model = DDP(MoELayer())
tokens_per_expert = [0, 0] if rank == 1 else [3, 5]
loss = model(torch.ones(2, 4), tokens_per_expert).sum()
loss.backward()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
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
    ),
    Case(
        name="ddp_new_zero_tensor_as_loss",
        url="https://github.com/pytorch/pytorch/issues/23425",
        summary="a multi-task network returns a new zero tensor as the loss on the GPU whose image has "
        "no target for the task, and training hangs: that tensor has no autograd graph, so DDP's "
        "backward reduction never runs there",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 2))
for step in range(2):
    out = model(torch.ones(2, 4))
    has_target = not (rank == 1 and step == 1)  # rank 1's image has no ground truth for task a
    loss_a = out.sum() if has_target else torch.zeros(1, requires_grad=True)  # no loss computed
    loss_a.backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(4, 2))
for step in range(2):
    out = model(torch.ones(2, 4))
    has_target = not (rank == 1 and step == 1)
    loss_a = out.sum() if has_target else out.sum() * 0  # the computed loss, with its graph
    loss_a.backward()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
]

"""DistributedDataParallel: uneven inputs, unused parameters, a rank that skips a step or stops
early, an evaluation on one rank through the wrapper."""

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
        held_out=True,
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
        name="ddp_eval_on_master_through_wrapper",
        url="https://github.com/mlfoundations/open_clip/issues/1152",
        summary="evaluate() returns on ranks > 0, which wait at a barrier, while rank 0 runs forward "
        "on the still DDP-wrapped model, which syncs its buffers",
        world_size=3,
        body="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()  # a training step on every rank
if rank == 0:  # evaluate() returns at once on the other ranks
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 4))  # <- culprit line
dist.barrier()
""",
        twin="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()
if rank == 0:
    model.eval()
    with torch.no_grad():
        model.module(torch.randn(8, 4))  # unwrap DDP for single process eval
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
    ),
    Case(
        name="ddp_eval_stuck_two_ranks",
        url="https://github.com/pytorch/pytorch/issues/53979",
        summary="evaluation on the validation set gets stuck; the fix suggested: call "
        "ddp_module.module(inp) in evaluation to avoid DDP's communication",
        world_size=2,
        held_out=True,
        body="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()
if rank == 0:
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 4))  # <- culprit line
dist.barrier()
""",
        twin="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()
if rank == 0:
    model.eval()
    with torch.no_grad():
        model.module(torch.randn(8, 4))
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
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
        name="ddp_early_stopping_on_local_metric",
        url="https://github.com/pytorch/pytorch/issues/134920",
        summary="DDP training hangs: early stopping breaks the epoch loop on the rank whose own "
        "validation loss stopped improving",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
best = float("inf")
for epoch in range(4):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()  # <- culprit line
    val_loss = 1.0 if rank == 0 else 1.0 / (epoch + 1)  # each rank's own validation split
    if val_loss >= best:
        break  # early_stopping.early_stop
    best = val_loss
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
best = float("inf")
for epoch in range(4):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    v = torch.tensor([1.0 if rank == 0 else 1.0 / (epoch + 1)])
    dist.all_reduce(v)  # the validation loss of the whole set, the same on every rank
    val_loss = v.item() / world_size
    if val_loss >= best:
        break
    best = val_loss
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="ddp_threshold_stopping_one_subprocess",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/379",
        summary="early stopping with ddp stalls: the stop condition is met in some subprocesses, "
        "which stop, while the others keep training",
        world_size=3,
        held_out=True,
        body="""\
model = DDP(nn.Linear(4, 1))
for epoch in range(3):
    model(torch.ones(2, 4)).sum().backward()  # <- culprit line
    val_acc = 0.9 if rank == 1 else 0.5  # this process's validation batches
    if val_acc > 0.8:
        break
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
for epoch in range(3):
    model(torch.ones(2, 4)).sum().backward()
    acc = torch.tensor([0.9 if rank == 1 else 0.5])
    dist.all_reduce(acc)
    if acc.item() / world_size > 0.8:
        break
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="ddp_stop_decided_on_main_process",
        url="https://github.com/speechbrain/speechbrain/pull/2051",
        summary="on_stage_end(VALID) runs on the main process only, so the epoch loop stops on the "
        "main process but not on the others",
        world_size=2,
        held_out=True,
        body="""\
model = DDP(nn.Linear(4, 1))
for epoch in range(3):
    model(torch.ones(2, 4)).sum().backward()  # <- culprit line
    if rank == 0 and epoch == 1:  # the stopper, updated on the main process only
        break
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
for epoch in range(3):
    model(torch.ones(2, 4)).sum().backward()
    stop = torch.tensor([float(rank == 0 and epoch == 1)])
    dist.broadcast(stop, src=0)  # update_metrics on every process
    if stop.item():
        break
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
]

"""DistributedDataParallel: training stopped early on one rank, by a value that rank alone
decided (a local metric, a NaN, a flag set on the main process)."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
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
    Case(
        name="ddp_break_on_nan_loss",
        url="https://github.com/NVIDIA-NeMo/Speech/pull/578",
        summary="'Loss is NaN or inf' breaks the training loop on the worker that saw it; the other "
        "workers hang (the fix: set a flag and stop all together at the next eval step)",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
for step in range(4):
    loss = model(torch.ones(2, 4)).sum()
    if rank == 1 and step == 2:
        loss = loss * float("nan")
    if torch.isnan(loss):
        break  # 'Loss is NaN or inf'
    loss.backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
for step in range(4):
    loss = model(torch.ones(2, 4)).sum()
    if rank == 1 and step == 2:
        loss = loss * float("nan")
    nan = torch.tensor([float(torch.isnan(loss))])
    dist.all_reduce(nan)  # the flag, seen by every worker: all stop at the same step
    if nan.item():
        (loss * 0).nan_to_num().backward()
        break
    loss.backward()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="ddp_early_stopping_on_ungathered_metrics",
        url="https://github.com/huggingface/transformers/issues/17478",
        summary="training hangs at the end in dist.barrier(): the outputs were not gathered, so each "
        "process has its own metrics and EarlyStoppingCallback stops one while the others train on",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
best, bad = float("inf"), 0
for epoch in range(4):
    model(torch.ones(2, 4)).sum().backward()  # <- culprit line
    metric = [1.0, 0.9, 0.8, 0.7][epoch] if rank == 0 else 1.0  # this process's outputs only
    bad = 0 if metric < best else bad + 1
    best = min(best, metric)
    if bad >= 1:  # EarlyStoppingCallback(early_stopping_patience=1)
        break
dist.barrier()  # the end of train()
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
best, bad = float("inf"), 0
for epoch in range(4):
    model(torch.ones(2, 4)).sum().backward()
    metric = torch.tensor([[1.0, 0.9, 0.8, 0.7][epoch] if rank == 0 else 1.0])
    dist.all_reduce(metric)  # distributed_concat: the metric of every process's outputs
    metric = metric.item() / world_size
    bad = 0 if metric < best else bad + 1
    best = min(best, metric)
    if bad >= 1:
        break
dist.barrier()
""",
        kind="mismatch",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="ddp_early_stopping_breaks_rank0_only",
        url="https://github.com/ultralytics/yolov5/pull/4576",
        summary="EarlyStopping works on one GPU but not in DDP: the stop flag is not broadcast from RANK 0, "
        "so the train loop breaks for RANK 0 only and training hangs",
        world_size=2,
        body="""\
class EarlyStopping:  # utils/torch_utils.py
    def __init__(self, patience=1):
        self.best_fitness, self.best_epoch, self.patience = 0.0, 0, patience

    def __call__(self, epoch, fitness):
        if fitness >= self.best_fitness:
            self.best_epoch, self.best_fitness = epoch, fitness
        return epoch - self.best_epoch >= self.patience


model = DDP(nn.Linear(4, 1))
stopper, stop = EarlyStopping(), False
for epoch in range(4):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()  # <- culprit line
    if rank == 0:  # RANK in {-1, 0}: validation and the stopper run here only
        fi = [0.5, 0.6, 0.4, 0.3][epoch]  # fitness of the epoch
        stop = stopper(epoch=epoch, fitness=fi)
    if stop:
        break
""",
        twin="""\
class EarlyStopping:
    def __init__(self, patience=1):
        self.best_fitness, self.best_epoch, self.patience = 0.0, 0, patience

    def __call__(self, epoch, fitness):
        if fitness >= self.best_fitness:
            self.best_epoch, self.best_fitness = epoch, fitness
        return epoch - self.best_epoch >= self.patience


model = DDP(nn.Linear(4, 1))
stopper, stop = EarlyStopping(), False
for epoch in range(4):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    if rank == 0:
        fi = [0.5, 0.6, 0.4, 0.3][epoch]
        stop = stopper(epoch=epoch, fitness=fi)
    broadcast_list = [stop if rank == 0 else None]
    dist.broadcast_object_list(broadcast_list, 0)  # broadcast 'stop' to all ranks
    stop = broadcast_list[0]
    if stop:
        break  # every rank breaks
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
]

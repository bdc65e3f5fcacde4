"""Library misuse, Lightning's: a syncing log, gather or checkpoint behind `is_global_zero` or a
rank-zero-only hook, and the keys each rank logs."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="lightning_all_gather_under_global_zero",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/16541",
        summary="self.all_gather in test_epoch_end under `if self.trainer.is_global_zero` hangs forever",
        world_size=2,
        body="""\
outputs = torch.full((3,), float(rank))
if rank == 0:  # self.trainer.is_global_zero
    gathered = [torch.zeros(3) for _ in range(world_size)]
    dist.all_gather(gathered, outputs)  # <- culprit line
""",
        twin="""\
outputs = torch.full((3,), float(rank))
gathered = [torch.zeros(3) for _ in range(world_size)]
dist.all_gather(gathered, outputs)  # every rank gathers
if rank == 0:
    assert len(gathered) == world_size
""",
        kind="partial",
        culprits=(0,),
        op="all_gather",
    ),
    Case(
        name="lightning_checkpoint_on_unreduced_val_loss",
        url="https://github.com/Lightning-AI/pytorch-lightning/pull/6004",
        summary="ModelCheckpoint monitors a val_loss each process logged unreduced: "
        "check_monitor_top_k differs across processes, one saves (and broadcasts) while the others "
        "train on; the fix reduces val_loss",
        world_size=3,
        body="""\
def save_checkpoint(trainer_dir):  # ModelCheckpoint._save_model: rank 0's path on every process
    filepath = [str(trainer_dir / "epoch=0.ckpt")]
    dist.broadcast_object_list(filepath, src=0)  # <- culprit line
    return filepath[0]


best = 1.0
val_loss = [0.8, 1.1, 1.0][rank]  # self.log("val_loss", loss): this process's own value
for epoch in range(2):
    dist.all_reduce(torch.ones(3))  # the epoch's gradients
    if epoch == 0 and val_loss < best:  # check_monitor_top_k
        save_checkpoint(ddp_shared_path)
""",
        twin="""\
def save_checkpoint(trainer_dir):
    filepath = [str(trainer_dir / "epoch=0.ckpt")]
    dist.broadcast_object_list(filepath, src=0)
    return filepath[0]


best = 1.0
loss = torch.tensor([[0.8, 1.1, 1.0][rank]])
dist.all_reduce(loss)  # val_loss reduced: the same on every process
val_loss = loss.item() / world_size
for epoch in range(2):
    dist.all_reduce(torch.ones(3))
    if epoch == 0 and val_loss < best:
        save_checkpoint(ddp_shared_path)
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
    ),
    Case(
        name="lightning_log_sync_dist_on_rank_zero",
        url="https://github.com/dvl-tum/center-group/pull/2",
        summary="validation metrics logged under `if self.world_rank == 0` without rank_zero_only: "
        "Lightning waits for the other processes to log as well, a deadlock",
        world_size=2,
        body="""\
val_ap = torch.tensor(0.5 + rank)  # this process's validation AP
if rank == 0:  # if self.world_rank == 0: self.log("val_ap", val_ap, sync_dist=True)
    dist.all_reduce(val_ap)  # <- culprit line
    print("val_ap", val_ap.item() / world_size)
""",
        twin="""\
val_ap = torch.tensor(0.5 + rank)
if rank == 0:  # self.log("val_ap", val_ap, rank_zero_only=True): no sync
    print("val_ap", val_ap.item())
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="lightning_log_dict_keys_differ_across_ranks",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/19106",
        summary="deadlock on log_dict(sync_dist=True) with different keys across ranks: each key is "
        "synced, so the rank with a key the others lack makes a sync they never join",
        world_size=3,
        body="""\
metrics = {"loss": torch.tensor(1.0)}
if rank == 1:
    metrics["acc_rare_class"] = torch.tensor(0.5)  # that class showed up in rank 1's batch only
for name, value in sorted(metrics.items()):  # self.log_dict(metrics, sync_dist=True)
    dist.all_reduce(value)  # <- culprit line
""",
        twin="""\
metrics = {"loss": torch.tensor(1.0), "acc_rare_class": torch.tensor(0.0)}  # the same keys
if rank == 1:
    metrics["acc_rare_class"] = torch.tensor(0.5)
for name, value in sorted(metrics.items()):
    dist.all_reduce(value)
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="lightning_epoch_time_logged_with_sync_on_rank0",
        url="https://github.com/choderalab/modelforge/pull/313",
        summary="training froze after the first epoch: the epoch time was logged on the main process "
        "only (`if self.global_rank == 0`) with a synchronising log call; the fix logs it with "
        "rank_zero_only=True",
        world_size=3,
        body="""\
for epoch in range(2):
    dist.all_reduce(torch.ones(4))  # the epoch's gradients
    epoch_time = torch.tensor(12.5)
    if rank == 0:  # if self.global_rank == 0: self.log("epoch_time", epoch_time, sync_dist=True)
        dist.all_reduce(epoch_time)  # <- culprit line
""",
        twin="""\
for epoch in range(2):
    dist.all_reduce(torch.ones(4))
    epoch_time = torch.tensor(12.5)
    if rank == 0:  # self.log("epoch_time", epoch_time, rank_zero_only=True): no sync
        print("epoch_time", epoch_time.item())
""",
        kind="mismatch",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="lightning_callback_returns_early_off_rank_zero",
        url="https://github.com/talmolab/sleap-nn/pull/437",
        summary="multi-GPU training freezes after each epoch: a callback returns early on the "
        "non-zero ranks, so only rank 0 reaches trainer.strategy.barrier()",
        world_size=3,
        body="""\
def on_train_epoch_end(epoch):  # UnifiedVizCallback
    if rank != 0:  # not trainer.is_global_zero
        return
    (ddp_shared_path / f"viz-{epoch}.txt").write_text("figures")
    dist.barrier()  # <- culprit line


for epoch in range(2):
    dist.all_reduce(torch.ones(2))  # the epoch's gradients
    on_train_epoch_end(epoch)
""",
        twin="""\
def on_train_epoch_end(epoch):
    if rank == 0:  # the `if trainer.is_global_zero:` block
        (ddp_shared_path / f"viz-{epoch}.txt").write_text("figures")
    dist.barrier()  # every rank reaches it


for epoch in range(2):
    dist.all_reduce(torch.ones(2))
    on_train_epoch_end(epoch)
""",
        kind="mismatch",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="lightning_log_dict_keys_on_rank_zero_only",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/7129",
        summary="the evaluation metrics are reduced on rank 0 and logged in validation_epoch_end, the other "
        "ranks log an empty dict; the logger's sync all-gathers each logged key, and training is stuck "
        "until the NCCL timeout",
        world_size=2,
        body="""\
def log_dict(metrics):  # self.log_dict(res): each logged value gathered across processes
    for name, value in metrics.items():
        gathered = [torch.zeros_like(value) for _ in range(world_size)]
        dist.all_gather(gathered, value)  # <- culprit line


res = {}
if rank == 0:  # the evaluator reduced the metrics on rank 0
    res = {"reduced_metric": torch.tensor(0.1)}
log_dict(res)
""",
        twin="""\
def log_dict(metrics):
    for name, value in metrics.items():
        gathered = [torch.zeros_like(value) for _ in range(world_size)]
        dist.all_gather(gathered, value)


res = {"reduced_metric": torch.tensor(0.0)}  # the same keys on every rank
if rank == 0:
    res = {"reduced_metric": torch.tensor(0.1)}
log_dict(res)
""",
        kind="partial",
        culprits=(0,),
        op="all_gather",
    ),
]

"""Library misuse: Lightning's, DeepSpeed's and accelerate's syncing calls behind `if rank == 0:`, and
what they are handed."""

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
        name="deepspeed_save_checkpoint_on_rank0",
        url="https://github.com/deepspeedai/DeepSpeed/pull/801",
        summary="save_checkpoint on rank 0 only hangs: every process must call it (collectives inside)",
        world_size=3,
        body="""\
def save_checkpoint(state, path):  # as engine.save_checkpoint: a collective inside
    dist.barrier()  # <- culprit line
    if dist.get_rank() == 0:
        torch.save(state, path)


if rank == 0:
    save_checkpoint({"step": 1}, ddp_shared_path / "ckpt.pt")
dist.all_reduce(torch.ones(1))
""",
        twin="""\
def save_checkpoint(state, path):
    dist.barrier()
    if dist.get_rank() == 0:
        torch.save(state, path)


save_checkpoint({"step": 1}, ddp_shared_path / "ckpt.pt")  # every rank calls it
dist.all_reduce(torch.ones(1))
""",
        kind="mismatch",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="accelerate_gather_object_under_main_process",
        url="https://github.com/huggingface/accelerate/issues/2733",
        summary="gather_object under `if distributed_state.is_main_process:` hangs; the maintainer: "
        "gather_object must be called on every worker",
        world_size=2,
        body="""\
from accelerate import PartialState
from accelerate.utils import gather_object

state = PartialState(cpu=True)  # accelerate launch --cpu
txt_out = [f"answer from rank {rank}"]
if state.is_main_process:
    print(gather_object(txt_out))  # <- culprit line
""",
        twin="""\
from accelerate import PartialState
from accelerate.utils import gather_object

state = PartialState(cpu=True)  # accelerate launch --cpu
txt_out = [f"answer from rank {rank}"]
gathered = gather_object(txt_out)  # on every worker
if state.is_main_process:
    print(gathered)
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_object",
    ),
    Case(
        name="trl_gather_object_in_main_process_block",
        url="https://github.com/huggingface/trl/issues/1103",
        summary="PPO hangs when logging to wandb on several GPUs: gather_object is called within the "
        "`if self.accelerator.is_main_process:` block",
        world_size=3,
        body="""\
from accelerate import PartialState
from accelerate.utils import gather_object

state = PartialState(cpu=True)  # accelerate launch --cpu
batch = {"query": [f"q{rank}"], "response": [f"r{rank}"]}
if state.is_main_process:  # log the table to wandb
    rows = gather_object([batch])  # <- culprit line
""",
        twin="""\
from accelerate import PartialState
from accelerate.utils import gather_object

state = PartialState(cpu=True)  # accelerate launch --cpu
batch = {"query": [f"q{rank}"], "response": [f"r{rank}"]}
rows = gather_object([batch])
if state.is_main_process:
    assert len(rows) == world_size
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_object",
    ),
    Case(
        name="accelerate_evaluate_driven_by_main_progress_bar",
        url="https://github.com/huggingface/transformers/issues/31532",
        summary="the process hangs when evaluating mid-epoch: the progress bar, enabled on the main "
        "process only, decides when to evaluate, so only the main process enters gather_for_metrics",
        world_size=2,
        body="""\
from accelerate import PartialState
from accelerate.utils import gather

state = PartialState(cpu=True)  # accelerate launch --cpu
progress = 0  # tqdm(disable=not is_main_process): its count moves on the main process only
for step in range(4):
    if state.is_main_process:
        progress += 1
    if progress == 2:  # evaluate every 2 steps, as the bar counts them
        gather(torch.tensor([float(rank)]))  # <- culprit line
""",
        twin="""\
from accelerate import PartialState
from accelerate.utils import gather

state = PartialState(cpu=True)  # accelerate launch --cpu
for step in range(4):
    if step + 1 == 2:  # the step count, the same on every process
        gather(torch.tensor([float(rank)]))
""",
        kind="partial",
        culprits=(0,),
        op="all_gather",
    ),
    Case(
        name="accelerate_gather_of_empty_tensor_on_one_rank",
        url="https://github.com/huggingface/trl/issues/1342",
        summary="KTO hangs with DeepSpeed: when a microbatch has no chosen examples on one machine, the "
        "empty tensor it gathers while the others gather theirs hangs",
        world_size=3,
        body="""\
from accelerate import PartialState
from accelerate.utils import gather

PartialState(cpu=True)  # accelerate launch --cpu
chosen_logps = torch.ones(2) if rank != 1 else torch.ones(0)  # rank 1's microbatch: rejected only
mean_chosen = gather(chosen_logps).nanmean()  # <- culprit line
""",
        twin="""\
from accelerate import PartialState
from accelerate.utils import gather

PartialState(cpu=True)
chosen_logps = torch.ones(2) if rank != 1 else torch.full((2,), float("nan"))  # padded with NaN
mean_chosen = gather(chosen_logps).nanmean()
assert mean_chosen.item() == 1.0
""",
        kind="mismatch",
        culprits=(1,),
        op="all_gather",
    ),
    Case(
        name="torchmetrics_compute_under_rank_zero_only",
        url="https://github.com/Lightning-AI/torchmetrics/issues/2684",
        summary="FrechetInceptionDistance hangs with several devices: on_validation_end is decorated "
        "with rank_zero_only and the metric's compute syncs across processes",
        world_size=2,
        body="""\
from torchmetrics import MeanMetric

metric = MeanMetric()
metric.update(torch.tensor(float(rank)))
if rank == 0:  # @rank_zero_only on_validation_end
    value = metric.compute()  # <- culprit line
""",
        twin="""\
from torchmetrics import MeanMetric

metric = MeanMetric()
metric.update(torch.tensor(float(rank)))
value = metric.compute()  # on every process, logged on rank 0 only
if rank == 0:
    assert value.item() == 0.5
""",
        kind="partial",
        culprits=(0,),
        op="all_gather",
    ),
    Case(
        name="zero_consolidate_state_dict_on_rank0",
        url="https://github.com/pytorch/ignite/issues/2623",
        summary="consolidate ZeRO state before a checkpoint: consolidate_state_dict must be issued on "
        "all ranks, and a checkpoint handler on rank 0 alone calls it",
        world_size=2,
        body="""\
from torch.distributed.optim import ZeroRedundancyOptimizer

model = nn.Linear(4, 4)
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
model(torch.ones(2, 4)).sum().backward()
opt.step()
if rank == 0:  # the checkpoint handler runs on rank 0
    opt.consolidate_state_dict(to=0)  # <- culprit line
    torch.save(opt.state_dict(), ddp_shared_path / "opt.pt")
""",
        twin="""\
from torch.distributed.optim import ZeroRedundancyOptimizer

model = nn.Linear(4, 4)
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
model(torch.ones(2, 4)).sum().backward()
opt.step()
opt.consolidate_state_dict(to=0)  # on every rank
if rank == 0:
    torch.save(opt.state_dict(), ddp_shared_path / "opt.pt")
""",
        kind="partial",
        culprits=(0,),
        op="broadcast",
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
        name="accelerate_wait_for_everyone_in_else_of_main",
        url="https://github.com/huggingface/accelerate/issues/2690",
        summary="the save block is `if accelerator.is_main_process: save ... else: "
        "accelerator.wait_for_everyone()`: the main process never waits, and the GPUs hang",
        world_size=3,
        body="""\
from accelerate import PartialState
from accelerate.utils import gather

state = PartialState(cpu=True)  # accelerate launch --cpu
if state.is_main_process:
    torch.save({"w": torch.ones(2)}, ddp_shared_path / "model.pt")  # save_pretrained
else:
    state.wait_for_everyone()  # <- culprit line
losses = gather(torch.tensor([float(rank)]))  # the next step's logging
""",
        twin="""\
from accelerate import PartialState
from accelerate.utils import gather

state = PartialState(cpu=True)
if state.is_main_process:
    torch.save({"w": torch.ones(2)}, ddp_shared_path / "model.pt")
state.wait_for_everyone()  # on every process
losses = gather(torch.tensor([float(rank)]))
assert len(losses) == world_size
""",
        kind="mismatch",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="accelerate_wait_for_everyone_inside_main_block",
        url="https://github.com/bytedance/UNO/issues/71",
        summary="training gets stuck when saving the checkpoint: accelerator.wait_for_everyone() sits "
        "inside `if accelerator.sync_gradients and accelerator.is_main_process and ...`",
        world_size=2,
        body="""\
from accelerate import PartialState

state = PartialState(cpu=True)  # accelerate launch --cpu
for global_step in range(1, 3):
    if state.is_main_process and global_step % 2 == 0:  # checkpointing_steps
        state.wait_for_everyone()  # <- culprit line
        torch.save({"step": global_step}, ddp_shared_path / f"checkpoint-{global_step}.pt")
""",
        twin="""\
from accelerate import PartialState

state = PartialState(cpu=True)
for global_step in range(1, 3):
    if global_step % 2 == 0:
        state.wait_for_everyone()  # every process reaches it
        if state.is_main_process:
            torch.save({"step": global_step}, ddp_shared_path / f"checkpoint-{global_step}.pt")
""",
        kind="partial",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="trainer_fsdp_state_dict_on_world_zero",
        url="https://github.com/huggingface/transformers/pull/10596",
        summary="training with the fully-sharded wrapper hangs at save: the state dict call "
        "synchronises, and the Trainer made it on process zero only; the fix gathers it on all "
        "processes and saves on zero",
        world_size=2,
        body="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
if rank == 0:  # if self.is_world_process_zero(): self._save(output_dir)
    state_dict = model.state_dict()  # <- culprit line
    torch.save(state_dict, ddp_shared_path / "pytorch_model.bin")
""",
        twin="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
state_dict = model.state_dict()  # gathered on all processes
if rank == 0:
    torch.save(state_dict, ddp_shared_path / "pytorch_model.bin")
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="zero3_prompt_encoder_run_in_rank0_save",
        url="https://github.com/huggingface/transformers/pull/29980",
        summary="prompt tuning with DeepSpeed ZeRO-3 hangs after saving a checkpoint: save_pretrained "
        "runs the partitioned prompt encoder's forward, and only rank 0 calls it",
        world_size=2,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
prompt_encoder = nn.Embedding(4, 4)  # its weights partitioned, as ZeRO-3 does
fully_shard(prompt_encoder, mesh=mesh)
if rank == 0:  # if self.args.should_save: self._save(output_dir)
    with torch.no_grad():
        prompt = prompt_encoder(torch.arange(4))  # <- culprit line
    torch.save(prompt, ddp_shared_path / "adapter_model.bin")
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
prompt_encoder = nn.Embedding(4, 4)
fully_shard(prompt_encoder, mesh=mesh)
with torch.no_grad():
    prompt = prompt_encoder(torch.arange(4))  # should_save is true on every rank for this
if rank == 0:
    torch.save(prompt, ddp_shared_path / "adapter_model.bin")
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="composer_rank_zero_callback_calls_dist",
        url="https://github.com/mosaicml/composer/issues/239",
        summary="RankZeroCallback runs its hooks on rank zero only, and a callback built on it that "
        "calls composer.utils.dist hangs the entire training",
        world_size=3,
        body="""\
class RankZeroCallback:  # runs its hooks on rank zero only
    def epoch_end(self):
        if rank == 0:
            self._epoch_end()


class CheckpointSaver(RankZeroCallback):
    def _epoch_end(self):
        dist.barrier()  # <- culprit line
        torch.save({"epoch": 0}, ddp_shared_path / "ep0.pt")


saver = CheckpointSaver()
for epoch in range(2):
    dist.all_reduce(torch.ones(2))  # the epoch's gradients
    saver.epoch_end()
""",
        twin="""\
class CheckpointSaver:  # an ordinary callback: the rank-zero part guarded inside it
    def epoch_end(self):
        dist.barrier()
        if rank == 0:
            torch.save({"epoch": 0}, ddp_shared_path / "ep0.pt")


saver = CheckpointSaver()
for epoch in range(2):
    dist.all_reduce(torch.ones(2))
    saver.epoch_end()
""",
        kind="mismatch",
        culprits=(0,),
        op="barrier",
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
        name="deepspeed_save_state_under_main_process",
        url="https://github.com/deepspeedai/DeepSpeed/issues/2993",
        summary="accelerator.save_state under `if accelerator.is_main_process` with DeepSpeed hangs: "
        "DeepSpeedEngine.save_checkpoint validates the tag with a collective on every rank",
        world_size=2,
        body="""\
from accelerate import PartialState

state = PartialState(cpu=True)  # accelerate launch --cpu


def save_checkpoint(save_dir, tag):  # DeepSpeedEngine.save_checkpoint
    bhash = torch.tensor([float(hash(tag) % 1000)])
    dist.all_reduce(bhash, op=dist.ReduceOp.MAX)  # <- culprit line
    if dist.get_rank() == 0:
        torch.save({"tag": tag}, save_dir / f"{tag}.pt")


if state.is_main_process:  # accelerator.save_state(output_dir)
    save_checkpoint(ddp_shared_path, "global_step1")
""",
        twin="""\
from accelerate import PartialState

state = PartialState(cpu=True)


def save_checkpoint(save_dir, tag):
    bhash = torch.tensor([float(hash(tag) % 1000)])
    dist.all_reduce(bhash, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        torch.save({"tag": tag}, save_dir / f"{tag}.pt")


save_checkpoint(ddp_shared_path, "global_step1")  # on every process
""",
        kind="partial",
        culprits=(0,),
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
    Case(
        name="accelerated_trainer_gather_of_short_last_batch",
        url="https://github.com/Chris-hughes10/pytorch-accelerated/pull/53",
        summary="Trainer.evaluate on several GPUs: the last batch holds fewer samples on one process, and "
        "Trainer.gather of the predictions freezes the run without a word; the fix asks for a "
        "padding_value, which pads across processes before the gather",
        world_size=3,
        body="""\
from accelerate import PartialState
from accelerate.utils import gather

PartialState(cpu=True)  # accelerate launch --cpu
eval_dataset = list(range(17))
shard = eval_dataset[rank::world_size]  # 6, 6 and 5 samples, batches of 3
for start in range(0, len(shard), 3):
    preds = torch.tensor(shard[start : start + 3], dtype=torch.float32)
    all_preds = gather(preds)  # <- culprit line
""",
        twin="""\
from accelerate import PartialState
from accelerate.utils import gather, pad_across_processes

PartialState(cpu=True)
eval_dataset = list(range(17))
shard = eval_dataset[rank::world_size]
for start in range(0, len(shard), 3):
    preds = torch.tensor(shard[start : start + 3], dtype=torch.float32)
    preds = pad_across_processes(preds, pad_index=-1)  # Trainer.gather(preds, padding_value=-1)
    all_preds = gather(preds)
""",
        kind="mismatch",
        culprits=(2,),
        op="all_gather",
    ),
    Case(
        name="accelerate_save_state_on_main_process_with_deepspeed",
        url="https://github.com/huggingface/accelerate/issues/1171",
        summary="diffusers' LoRA example calls accelerator.save_state under `if accelerator.is_main_process`; "
        "with DeepSpeed on several GPUs it hangs, since the engine's checkpoint save is collective",
        world_size=3,
        body="""\
from accelerate import PartialState

state = PartialState(cpu=True)  # accelerate launch --cpu


def save_state(output_dir):  # Accelerator.save_state -> DeepSpeedEngine.save_checkpoint
    dist.barrier()  # <- culprit line
    if state.is_main_process:
        torch.save({"unet_lora": torch.ones(2)}, output_dir / "pytorch_model.bin")


for global_step in range(1, 3):
    dist.all_reduce(torch.ones(2))  # the step's gradients
    if state.is_main_process and global_step % 2 == 0:  # checkpointing_steps
        save_state(ddp_shared_path)
""",
        twin="""\
from accelerate import PartialState

state = PartialState(cpu=True)


def save_state(output_dir):
    dist.barrier()
    if state.is_main_process:
        torch.save({"unet_lora": torch.ones(2)}, output_dir / "pytorch_model.bin")


for global_step in range(1, 3):
    dist.all_reduce(torch.ones(2))
    if global_step % 2 == 0:  # save_state on every process
        save_state(ddp_shared_path)
""",
        kind="partial",
        culprits=(0,),
        op="barrier",
    ),
]

"""Library misuse: DeepSpeed's, accelerate's and other libraries' syncing calls behind `if rank ==
0:`, and what they are handed (Lightning's: libraries_lightning.py; transformers' Trainer's:
libraries_trainer.py)."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
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
    Case(
        name="lightning_log_dir_in_rank_zero_only_hook",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/18148",
        summary="reading trainer.log_dir in a @rank_zero_only on_fit_start freezes DDP after the "
        "first step: log_dir broadcasts the directory from rank 0, a collective the other ranks "
        "never enter",
        world_size=2,
        body="""\
class Trainer:  # what lightning does, in plain torch
    @property
    def log_dir(self):  # strategy.broadcast(dirpath)
        obj = [str(ddp_shared_path / "lightning_logs" / "version_0")]
        dist.broadcast_object_list(obj, src=0)  # <- culprit line
        return obj[0]


trainer = Trainer()
model = DDP(nn.Linear(32, 2))
if rank == 0:  # @rank_zero_only on_fit_start
    print(trainer.log_dir)
for step in range(2):  # training_step
    model(torch.randn(4, 32)).pow(2).mean().backward()
""",
        twin="""\
class Trainer:
    @property
    def log_dir(self):
        obj = [str(ddp_shared_path / "lightning_logs" / "version_0")]
        dist.broadcast_object_list(obj, src=0)
        return obj[0]


trainer = Trainer()
model = DDP(nn.Linear(32, 2))
log_dir = trainer.log_dir  # read on every rank (on_fit_start without @rank_zero_only)
if rank == 0:
    print(log_dir)
for step in range(2):
    model(torch.randn(4, 32)).pow(2).mean().backward()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast_object_list",
    ),
]

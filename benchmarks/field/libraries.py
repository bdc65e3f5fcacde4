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
        held_out=True,
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
        held_out=True,
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
]

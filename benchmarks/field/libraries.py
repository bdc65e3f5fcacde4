"""Library misuse: Lightning's and DeepSpeed's syncing calls behind `if rank == 0:`."""

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
]

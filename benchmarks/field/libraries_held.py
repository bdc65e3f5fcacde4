"""Library misuse, held out (the third set): a Lightning property that broadcasts, read in a
rank-zero-only hook."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
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
        held_out=True,
    ),
]

"""torch.distributed.pipelining, held out (the fifth set): a last stage whose output is a tuple, handed
to a loss function that takes a tensor."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="pp_loss_fn_given_the_last_stage_tuple",
        url="https://github.com/pytorch/pytorch/issues/129732",
        summary="the pipelining API's loss_fn receives the last stage's output as the model returns it "
        "(a tuple here) and fails on it there, while the first stage waits for gradients; the answer: "
        "a loss wrapper that unpacks the model's outputs for the torch loss",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


class Head(nn.Module):  # the last stage returns its prediction and an auxiliary output
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        return y, y.detach().abs().mean(dim=-1)


submod = nn.Linear(4, 4) if rank == 0 else Head()
stage = PipelineStage(submod, rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=nn.functional.mse_loss)
if rank == 0:
    schedule.step(torch.ones(4, 4))
else:
    schedule.step(target=torch.zeros(4, 4))  # <- culprit line
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        return y, y.detach().abs().mean(dim=-1)


def loss_fn(outputs, target):  # unpacks the model's outputs for the torch loss
    prediction, _ = outputs
    return nn.functional.mse_loss(prediction, target)


submod = nn.Linear(4, 4) if rank == 0 else Head()
stage = PipelineStage(submod, rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn)
if rank == 0:
    schedule.step(torch.ones(4, 4))
else:
    schedule.step(target=torch.zeros(4, 4))
""",
        kind="rank_exited",
        culprits=(1,),
        op="irecv",
        held_out=True,
    ),
]

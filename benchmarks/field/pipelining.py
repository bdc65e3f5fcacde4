"""torch.distributed.pipelining: schedules given fewer microbatches than stages, a stage whose output
is not what the next stage was told to receive."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="pp_1f1b_fewer_microbatches_than_stages",
        url="https://github.com/pytorch/torchtitan/issues/775",
        summary="PP hangs when pipeline_parallel_microbatches < pipeline_parallel_degree (1F1B's "
        "warmup); torch now refuses the schedule on every rank instead",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = Schedule1F1B(stage, n_microbatches=1, loss_fn=lambda out, tgt: out.sum())  # <- culprit line
if rank == 0:
    schedule.step(torch.ones(1, 4))
else:
    schedule.step(target=torch.ones(1, 4))
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = Schedule1F1B(stage, n_microbatches=world_size, loss_fn=lambda out, tgt: out.sum())
if rank == 0:
    schedule.step(torch.ones(2, 4))
else:
    schedule.step(target=torch.ones(2, 4))
""",
        kind="failed",
        culprits=(0, 1),
        op=None,
    ),
    Case(
        name="pp_gpipe_one_microbatch",
        url="https://github.com/pytorch/PiPPy/issues/1064",
        summary="the GPipe schedule hangs when run with 1 microbatch; torch now refuses fewer "
        "microbatches than stages on every rank",
        world_size=2,
        held_out=True,
        body="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=1, loss_fn=lambda out, tgt: out.sum())  # <- culprit line
if rank == 0:
    schedule.step(torch.ones(1, 4))
else:
    schedule.step(target=torch.ones(1, 4))
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, tgt: out.sum())
if rank == 0:
    schedule.step(torch.ones(2, 4))
else:
    schedule.step(target=torch.ones(2, 4))
""",
        kind="failed",
        culprits=(0, 1),
        op=None,
    ),
    Case(
        name="pp_stage_output_not_what_next_stage_expects",
        url="https://github.com/pytorch/pytorch/pull/126732",
        summary="a stage produces an output that is locally correct but not what the following stage "
        "expects (its output_args): without validation a hang down the line, with it a raise",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

submod = nn.Linear(4, 8) if rank == 0 else nn.Linear(4, 4)  # stage 0 widened, its output_args not
example = torch.ones(2, 4)
stage = PipelineStage(submod, rank, world_size, torch.device("cpu"), input_args=(example,), output_args=(example,))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, tgt: out.sum())
if rank == 0:
    schedule.step(torch.ones(4, 4))  # <- culprit line
else:
    schedule.step(target=torch.ones(4, 4))
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

submod = nn.Linear(4, 4)
example = torch.ones(2, 4)
stage = PipelineStage(submod, rank, world_size, torch.device("cpu"), input_args=(example,), output_args=(example,))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, tgt: out.sum())
if rank == 0:
    schedule.step(torch.ones(4, 4))
else:
    schedule.step(target=torch.ones(4, 4))
""",
        kind="rank_exited",
        culprits=(0,),
        op="recv",
    ),
]

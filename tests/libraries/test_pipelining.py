"""torch.distributed.pipelining: a model cut in two stages on two ranks, as torch's pipelining
docs write a step: each rank wraps its part in a ``PipelineStage`` and drives it with a schedule
(``ScheduleGPipe``, ``Schedule1F1B``); the first stage feeds the batch, the last one gets the
target and the losses.  The stages exchange activations and gradients with isend/irecv."""

import re
from pathlib import Path

import pytest
import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import pytest_ddp

SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}


def model():
    torch.manual_seed(0)  # the same full model on every rank; each keeps its stage's part
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


def batch():
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    y = torch.randn(8, 2, generator=torch.Generator().manual_seed(2))
    return x, y


def pipeline_step(rank, schedule="GPipe", n_microbatches=4, train=True, stage_0_steps=True):
    """One step of a two-stage pipeline; the last stage returns its microbatches' losses."""
    stage = PipelineStage(model()[rank], stage_index=rank, num_stages=2, device=torch.device("cpu"))
    loss_fn = torch.nn.functional.mse_loss if train else None
    step = SCHEDULES[schedule](stage, n_microbatches=n_microbatches, loss_fn=loss_fn)
    x, y = batch()
    if rank == 0:
        if stage_0_steps:
            step.step(x)  # the first stage's step
        return stage.submod
    losses = []
    step.step(target=y, losses=losses) if train else step.step()  # the last stage's step
    return stage.submod, losses


@pytest.mark.ddp(world_size=2)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_pipeline_step_matches_the_whole_model(rank, schedule):
    result = pipeline_step(rank, schedule)

    reference = model()
    x, y = batch()
    reference_losses = [torch.nn.functional.mse_loss(reference(xs), ys) for xs, ys in zip(x.chunk(4), y.chunk(4))]
    (sum(reference_losses) / 4).backward()  # the schedule scales gradients by the microbatch count
    if rank == 1:
        part, losses = result
        torch.testing.assert_close(torch.stack(losses), torch.stack(reference_losses).detach())
    else:
        part = result
    for name, p in part.named_parameters():
        torch.testing.assert_close(p.grad, reference[rank].get_parameter(name).grad)


def line_of(text):
    """``test_pipelining.py:N``, the line of this file that holds ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return f"test_pipelining.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def stage_0_never_sends(rank):
    pipeline_step(rank, stage_0_steps=False)


def test_a_stage_that_never_sends_is_diagnosed():
    """Both schedules start with the same exchange (measured), where the last stage waits."""
    result = pytest_ddp.run(stage_0_never_sends, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "partial"), result.diagnosis.text
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([0], [1])
    [waiting] = [c for c in result.ranks[1].collectives if c.state == "running"]
    assert (waiting.op, waiting.peer) == ("recv", 0)  # the stages' first exchange, before any activation
    assert waiting.site.endswith(line_of("# the last stage's step"))


def microbatches_differ(rank, schedule, train):
    pipeline_step(rank, schedule, n_microbatches=4 if rank == 0 else 2, train=train)


def disagree(ranks, counts, site):
    """The verdict's sentence on ``counts`` (ranks, count) given at ``site`` (the call site as
    the report names it, from the rootdir), up to what came of it."""
    gave = ", ".join(rf"{ranks} gave {count} \(\S*{re.escape(site)}\)" for ranks, count in counts)
    return rf"{ranks} disagree on their pipeline schedules' n_microbatches: {gave}\. What came of it: "


MICROBATCHES_DIFFER = disagree("ranks 0, 1", [("rank 0", 4), ("rank 1", 2)], line_of("n_microbatches=n_"))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_microbatch_counts_that_differ_in_inference_are_diagnosed(schedule):
    """The last stage takes 2 microbatches and returns; the first waits to send its third.  Each
    schedule recorded its count: the two ranks disagree on it, and nothing tells which is right."""
    result = pytest_ddp.run(microbatches_differ, world_size=2, args=(schedule, False), timeout=30)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "mismatch"), result.diagnosis.text
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([0, 1], [])
    assert re.search(MICROBATCHES_DIFFER, result.diagnosis.text)
    assert "a step more on rank 0 or a step less on rank 1, nothing tells which" in result.diagnosis.text
    assert result.diagnosis.collective == "isend"
    assert "rank 1 never received from rank 0 (returned from its test)" in result.diagnosis.text
    waiting = result.ranks[0].collectives[-2 if schedule == "GPipe" else -1]  # GPipe issued a 4th send
    assert (waiting.op, waiting.seq, waiting.state) == ("isend", 5, "running")
    assert waiting.site.endswith(line_of("# the first stage"))
    assert f"rank 0 waits in isend #5 to 1 ({waiting.site})." in result.diagnosis.text


def test_microbatch_counts_that_differ_in_training_are_diagnosed():
    """The last stage's loss meets a target cut in 2 against an output cut in 4: it raises, and
    the first stage is left waiting for the gradients' metadata."""
    result = pytest_ddp.run(microbatches_differ, world_size=2, args=("GPipe", True), timeout=30)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "mismatch"), result.diagnosis.text
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([0, 1], [])
    assert re.search(MICROBATCHES_DIFFER + r"rank 1 failed \(RuntimeError: The size of tensor a", result.diagnosis.text)
    assert "must match the size of tensor b (4)" in result.ranks[1].exception
    [waiting] = [c for c in result.ranks[0].collectives if c.state == "running"]
    assert (waiting.op, waiting.peer) == ("recv_object_list", 1) and waiting.site.endswith(line_of("# the first stage"))


def three_stages(rank):
    """A model cut in three stages; the first cuts its batch in 2 microbatches, the others in 4."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(3)))
    stage = PipelineStage(layers[rank], stage_index=rank, num_stages=3, device=torch.device("cpu"))
    step = ScheduleGPipe(stage, n_microbatches=2 if rank == 0 else 4, loss_fn=torch.nn.functional.mse_loss)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    step.step(x) if rank == 0 else step.step(target=y, losses=[]) if rank == 2 else step.step()


def test_the_stage_whose_microbatch_count_departs_is_named():
    """Of three stages, the one count of 2 among counts of 4 departs: the first stage, whatever
    the last stage's loss raised on the inputs it sent."""
    result = pytest_ddp.run(three_stages, world_size=3, timeout=30)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "mismatch"), result.diagnosis.text
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([0], [1, 2])
    site = line_of("n_microbatches=2 if rank == 0")
    assert re.search(disagree("ranks 0-2", [("rank 0", 2), ("ranks 1, 2", 4)], site), result.diagnosis.text)

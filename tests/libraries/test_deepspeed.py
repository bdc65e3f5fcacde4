"""DeepSpeed on CPU inside a ddp test, as DeepSpeed's docs write a training step:
``engine, *_ = deepspeed.initialize(model=model, config={...})``, then ``loss = engine(x)...``,
``engine.backward(loss)``, ``engine.step()``; ZeRO stages 1 and 2.  ``deepspeed.initialize`` finds
the group the plugin made and keeps it (its ``init_distributed`` wraps an initialised group).

DeepSpeed builds its CPU comm op (``deepspeed_shm_comm``) with ninja the first time a process
initialises its communication (30 to 80 s on two cores), into torch's extensions cache
(``TORCH_EXTENSIONS_DIR``); a load from the cache takes a tenth of a second (docs/libraries.md)."""

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pytest_ddp

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before DeepSpeed picks its accelerator: a GPU's otherwise
# Its CPU comm op's build, cached per environment: one cache shared by two installs is rebuilt for each in turn.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
deepspeed = pytest.importorskip("deepspeed")
from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder  # noqa: E402

# Built (or loaded from the cache) at collection: the controller collects before any rank starts, so
# no test's timeout pays the build, and each rank's deepspeed.initialize finds the op loaded.
ShareMemCommBuilder().load()

LR = 0.01


def config(stage):
    return {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}},  # torch's AdamW: no op to build
        "zero_optimization": {"stage": stage},
    }


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def batch(rank):
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(rank))


def train_step(rank, stage=2, backward=(True, True), step=(True, True)):
    """One ZeRO step as DeepSpeed's docs write it; ``backward`` and ``step`` say which ranks call them."""
    engine, *_ = deepspeed.initialize(model=model(), config=config(stage))
    loss = engine(batch(rank)).pow(2).mean()
    if backward[rank]:
        engine.backward(loss)  # the user's backward
    if step[rank]:
        engine.step()  # the user's step
    return engine


@pytest.mark.ddp(world_size=2)
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_step_matches_the_whole_model(rank, stage):
    world = dist.group.WORLD
    engine = train_step(rank, stage)
    assert dist.group.WORLD is world  # the plugin's group, kept
    assert type(engine.optimizer).__name__ == "DeepSpeedZeroOptimizer"

    # Reference: torch's AdamW on the whole model, on the mean of both ranks' gradients.
    reference = model()
    (sum(reference(batch(r)).pow(2).mean() for r in range(2)) / 2).backward()
    torch.optim.AdamW(reference.parameters(), lr=LR).step()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(engine.module.get_parameter(name), p)
    weights = [torch.empty_like(engine.module[0].weight) for _ in range(2)]
    dist.all_gather(weights, engine.module[0].weight.detach())
    assert torch.equal(weights[0], weights[1])  # the replicas are equal after the step


def line_of(text):
    """``test_deepspeed.py:N``, the line of this file that holds ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return f"test_deepspeed.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def test_a_rank_that_skips_a_step_or_a_backward_is_diagnosed():
    """ZeRO 2.  Rank 1 skips ``engine.step()``: it returns, rank 0 waits in the step's first
    all_reduce.  Rank 1 skips ``engine.backward(loss)``: its ``step()`` raises (DeepSpeed's
    ``KeyError: 0``, no gradients to average), rank 0 waits in the backward's all_reduce."""
    no_step = pytest_ddp.run(train_step, world_size=2, kwargs={"step": (True, False)}, timeout=60)
    no_backward = pytest_ddp.run(train_step, world_size=2, kwargs={"backward": (True, False)}, timeout=60)

    cases = ((no_step, "partial", "# the user's step"), (no_backward, "rank_exited", "# the user's backward"))
    for result, kind, line in cases:
        assert (result.outcome, result.diagnosis.kind) == ("deadlock", kind), result.diagnosis.text
        assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([1], [0])
        waiting = result.ranks[0].collectives[-1]
        assert (waiting.op, waiting.state) == ("all_reduce", "running")
        assert waiting.caller.startswith("deepspeed/comm/")  # DeepSpeed's frame that made the call
        assert waiting.site.endswith(line_of(line))  # the user's line that led there
        assert line_of(line) in result.diagnosis.text.splitlines()[0]  # named in the headline
    assert no_backward.ranks[1].exception == "KeyError: 0"

"""Tensor parallel on a DeviceMesh, as torch's tensor parallel docs write it: ``parallelize_module``
with ``ColwiseParallel`` then ``RowwiseParallel`` (the MLP's two layers), and sequence parallel
(``SequenceParallel`` on a norm, the layers' inputs and outputs sharded on the sequence)."""

from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import pytest_ddp


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same full weights on every rank
        self.norm = torch.nn.LayerNorm(8)
        self.w1 = torch.nn.Linear(8, 16)
        self.w2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(self.norm(x))))  # the MLP's forward


TENSOR_PARALLEL = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
SEQUENCE_PARALLEL = {
    "norm": SequenceParallel(),
    "w1": ColwiseParallel(input_layouts=Shard(1)),
    "w2": RowwiseParallel(output_layouts=Shard(1)),
}
PLANS = {"tensor": TENSOR_PARALLEL, "sequence": SEQUENCE_PARALLEL}


def inputs(batch=2):
    return torch.randn(batch, 4, 8, generator=torch.Generator().manual_seed(1))  # (batch, sequence, features)


@pytest.mark.ddp(world_size=2)
@pytest.mark.parametrize("plan", PLANS)
def test_parallelized_mlp_matches_the_whole_one(rank, plan):
    mesh = init_device_mesh("cpu", (2,))
    model = parallelize_module(MLP(), mesh, PLANS[plan])
    assert model.w1.weight.to_local().shape == (8, 8)  # this rank's half of [16, 8]: columns of the output

    x = inputs()
    if plan == "sequence":  # each rank holds its half of the sequence, in and out
        out = model(x.chunk(2, dim=1)[rank])
        out.sum().backward()
        out = out.to_local() if hasattr(out, "to_local") else out
        expected_part = MLP()(x).chunk(2, dim=1)[rank]
    else:
        out = model(x)
        out.sum().backward()
        expected_part = MLP()(x)
    torch.testing.assert_close(out, expected_part.detach())

    reference = MLP()
    reference(x).sum().backward()
    torch.testing.assert_close(model.w2.weight.grad.full_tensor(), reference.w2.weight.grad)


def line_of(text):
    """``test_tensor_parallel.py:N``, the line of this file that holds ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return f"test_tensor_parallel.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def forward(rank, plan="tensor", skipping_rank=None, batch=(2, 2)):
    mesh = init_device_mesh("cpu", (2,))
    model = parallelize_module(MLP(), mesh, PLANS[plan])
    x = inputs(batch[rank])
    if plan == "sequence":
        x = x.chunk(2, dim=1)[rank]
    if rank != skipping_rank:
        model(x).sum().backward()


@pytest.mark.parametrize("plan", PLANS)
def test_a_rank_that_skips_the_forward_is_diagnosed(plan):
    result = pytest_ddp.run(forward, world_size=2, args=(plan, 1), timeout=30)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "partial"), result.diagnosis.text
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([1], [0])
    [waiting] = [c for c in result.ranks[0].collectives if c.state == "running"]
    # The forward's first collective: Rowwise's all_reduce, or sequence parallel's all_gather.
    assert waiting.op == ("all_reduce" if plan == "tensor" else "all_gather_into_tensor")
    assert waiting.site.endswith(line_of("# the MLP's forward"))  # the line of the module's own code


def test_a_rank_that_feeds_another_shape_is_diagnosed():
    """Rank 1's batch is 3, rank 0's 2: Rowwise's all_reduce of the outputs differs in size."""
    result = pytest_ddp.run(forward, world_size=2, kwargs={"batch": (2, 3)}, timeout=30)
    # Seen while both wait (deadlock), or once Gloo has aborted a rank on the sizes (failed).
    assert result.outcome in ("deadlock", "failed") and result.diagnosis.kind == "mismatch", result.diagnosis.text
    assert result.diagnosis.collective == "all_reduce"
    assert "shapes [[2, 4, 8]]" in result.diagnosis.text and "shapes [[3, 4, 8]]" in result.diagnosis.text
    assert line_of("# the MLP's forward") in result.diagnosis.text

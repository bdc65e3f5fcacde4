"""accelerate inside a ddp test, as its docs write a training loop.

``Accelerator(cpu=True)`` reads torchrun's environment, finds the process
group initialised and uses it (MULTI_CPU). Its state is a process-wide
singleton: a warm rank keeps it into the next test, so each test resets it.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import pytest_ddp

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402


@pytest.fixture
def accelerator():
    yield accelerate.Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.ddp(world_size=2)
def test_prepare_and_train_one_epoch(accelerator, rank):
    world = dist.group.WORLD
    assert accelerator.distributed_type == "MULTI_CPU"
    assert (accelerator.process_index, accelerator.num_processes) == (rank, 2)

    torch.manual_seed(rank)  # different initial weights per rank: prepare() must make them equal
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(*torch.randn(32, 5, generator=torch.Generator().manual_seed(0)).split([4, 1], dim=1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
    assert len(loader) == 2  # 32 samples / 2 ranks / 8 per batch

    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()

    weights = accelerator.gather(accelerator.unwrap_model(model).weight.detach())
    assert torch.equal(weights[0], weights[1])
    assert dist.group.WORLD is world


@pytest.mark.ddp(world_size=2)
def test_gather_for_metrics(accelerator, rank):
    predictions = accelerator.gather_for_metrics(torch.tensor([rank, rank]))
    assert predictions.tolist() == [0, 0, 1, 1]


def gather_on_rank_0(rank):
    accelerator = accelerate.Accelerator(cpu=True)
    if accelerator.is_main_process:
        accelerator.gather(torch.tensor([rank]))  # rank 0 only


def test_gather_on_one_rank_is_diagnosed():
    result = pytest_ddp.run(gather_on_rank_0, world_size=2, timeout=30)
    assert result.outcome == "deadlock", result.diagnosis.text
    assert result.diagnosis.kind == "partial"
    # The call that syncs out of sight is made under rank 0's branch alone: rank 0 is named.
    assert (result.diagnosis.waiting, result.diagnosis.culprits) == ([], [0])
    assert result.ranks[0].collectives[-1].op == "all_gather"
    waiting = result.ranks[0].collectives[-1]
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.endswith("# rank 0 only"))
    # The site is the user's line, the library's frame that made the call its caller.
    assert waiting.caller.startswith("accelerate/") and waiting.site.endswith(f"test_accelerate.py:{line}")

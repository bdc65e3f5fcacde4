"""Distributed tests that pass: what everyday use of pytest-ddp looks like."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


@pytest.mark.ddp(world_size=[1, 2, 4])
def test_all_reduce_sums_ranks(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert t.item() == sum(range(world_size))


@pytest.mark.ddp(world_size=2)
def test_broadcast_from_rank_0(rank):
    t = torch.arange(4.0) if rank == 0 else torch.zeros(4)
    dist.broadcast(t, src=0)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.ddp(world_size=2)
def test_gather_objects(rank, world_size):
    gathered = [None] * world_size
    dist.all_gather_object(gathered, {"rank": rank, "items": [rank] * 3})
    assert [g["rank"] for g in gathered] == [0, 1]


@pytest.fixture(scope="module")
def model(rank):
    """Built once per rank for this module's tests, as module fixtures are."""
    torch.manual_seed(0)
    return nn.Linear(4, 1)


@pytest.mark.ddp(world_size=2)
def test_ddp_step_keeps_replicas_equal(rank, model):
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(rank)  # each rank sees different data
    loss = ddp(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    weights = [torch.zeros_like(model.weight) for _ in range(2)]
    dist.all_gather(weights, model.weight.detach())
    assert torch.equal(weights[0], weights[1])


@pytest.mark.ddp(world_size=2)
def test_each_rank_has_its_own_tmp_path(rank, tmp_path):
    (tmp_path / "checkpoint.txt").write_text(str(rank))
    paths = [None, None]
    dist.all_gather_object(paths, str(tmp_path))
    assert paths[0] != paths[1]

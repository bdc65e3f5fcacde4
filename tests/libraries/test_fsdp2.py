"""FSDP2 (``fully_shard``) on CPU and Gloo, as torch's FSDP2 tutorial writes it:
shard each block, then the root; one optimizer step on DTensor parameters."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

# How FSDP2 reduces gradients on Gloo: torch 2.11 and 2.13 average them over the ranks,
# torch 2.8 sums them (measured: this test on 2.8 and 2.13, bare torch on 2.11).
AVERAGES = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 11)


def model():
    torch.manual_seed(0)  # the same full weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.mark.ddp(world_size=2)
def test_fully_shard_one_training_step(rank):
    reference = model()
    sharded = model()
    mesh = init_device_mesh("cpu", (2,))
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)

    weight = sharded[0].weight
    assert isinstance(weight, DTensor) and weight.placements == (Shard(0),)
    assert weight.to_local().shape == (8, 8)  # this rank's half of [16, 8]

    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank))  # a different batch per rank
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.1)
    sharded(x).sum().backward()
    optimizer.step()

    # Reference: plain SGD on the mean (or sum) of both ranks' gradients, as FSDP reduces them.
    all_x = [torch.empty_like(x) for _ in range(2)]
    dist.all_gather(all_x, x)
    for batch in all_x:
        reference(batch).sum().backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad / (2 if AVERAGES else 1)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(sharded.get_parameter(name).full_tensor(), p)

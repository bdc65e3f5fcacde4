"""DTensor and DeviceMesh on CPU, as torch's DTensor docs write them."""

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


@pytest.mark.ddp(world_size=2)
def test_distribute_redistribute_full_tensor(rank):
    mesh = init_device_mesh("cpu", (2,))
    if not torch.cuda.is_available():  # torch 2.11 with a GPU visible makes a group of its own (measured)
        assert mesh.get_group().group_name == torch.distributed.group.WORLD.group_name  # the default group, reused
    full = torch.arange(8.0).reshape(4, 2)

    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.to_local(), full[2 * rank:2 * rank + 2])

    column = sharded.redistribute(mesh, [Shard(1)])  # all_to_all
    assert torch.equal(column.to_local(), full[:, rank:rank + 1])

    replicated = sharded.redistribute(mesh, [Replicate()])  # all_gather
    assert torch.equal(replicated.to_local(), full)

    assert torch.equal((sharded * 2).full_tensor(), full * 2)

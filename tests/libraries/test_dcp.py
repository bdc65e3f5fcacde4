"""torch.distributed.checkpoint (DCP): each rank saves its shard of a
sharded state dict into one directory shared by all ranks, and loads it back."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


@pytest.fixture
def shared_path(rank, tmp_path):
    """A directory every rank can reach: rank 0's tmp_path, broadcast to the others."""
    path = [tmp_path]
    dist.broadcast_object_list(path, src=0)
    return path[0]


@pytest.mark.ddp(world_size=2)
def test_save_and_load_a_sharded_state_dict(rank, shared_path):
    mesh = init_device_mesh("cpu", (2,))
    full = torch.arange(8.0).reshape(4, 2)
    state = {"weight": distribute_tensor(full, mesh, [Shard(0)]), "step": torch.tensor(7)}
    dcp.save(state, checkpoint_id=shared_path / "ckpt")
    assert (shared_path / "ckpt" / ".metadata").exists()

    loaded = {"weight": distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)]), "step": torch.tensor(0)}
    dcp.load(loaded, checkpoint_id=shared_path / "ckpt")
    assert torch.equal(loaded["weight"].to_local(), full[2 * rank:2 * rank + 2])
    assert loaded["step"].item() == 7

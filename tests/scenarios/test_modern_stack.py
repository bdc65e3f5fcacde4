"""FSDP2, DTensor and functional collectives: their hangs diagnosed like the classic ones.

They reach the process group through torch's c10d operations, past the
torch.distributed functions (DTensor, compiled code) or through them with
``async_op=True`` and a later ``work.wait()`` (FSDP2); the recorder sees both.
"""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pytest_ddp
from pytest_ddp.record import backend_hook

# FSDP2's all-gather: dist.all_gather_single where torch has it (2.13), else all_gather_into_tensor.
FSDP2_ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


def fsdp2_step(rank: int, skipping_rank: int | None, steps: int = 1) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,))  # without it, FSDP2 takes a GPU wherever one is visible
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for _ in range(steps):
        loss = model(torch.ones(3, 4)).sum()
        if rank != skipping_rank:
            loss.backward()


def test_fsdp2_step_passes() -> None:
    result = pytest_ddp.run(fsdp2_step, world_size=2, args=(None,), timeout=30)
    assert result.outcome == "passed", result.diagnosis and result.diagnosis.text
    assert result.collective_differences == []


def test_fsdp2_rank_that_skips_backward() -> None:
    """Rank 0 waits for rank 1's half of the gradients' collectives, which never come."""
    result = pytest_ddp.run(fsdp2_step, world_size=2, args=(1,), timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "partial", [1])
    assert result.diagnosis.waiting == [0]
    # Rank 0 is inside FSDP2's all-gather of the backward pass, waiting on its work.
    assert result.diagnosis.collective == FSDP2_ALL_GATHER
    assert f"rank 0: waiting in {FSDP2_ALL_GATHER} #3" in result.diagnosis.text


def test_fsdp2_rank_that_skips_backward_and_goes_on() -> None:
    """The next forward's all-gather on rank 1 meets the backward's on rank 0: sizes differ."""
    result = pytest_ddp.run(fsdp2_step, world_size=2, args=(1, 2), timeout=30)
    # Seen while both wait (deadlock), or once Gloo's size check has aborted a rank (failed).
    assert result.outcome in ("deadlock", "failed") and result.diagnosis.kind == "mismatch"
    assert result.diagnosis.collective == FSDP2_ALL_GATHER


def full_tensor_on_one_rank(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    sharded = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    if rank == 0:
        sharded.full_tensor()


def test_dtensor_full_tensor_on_one_rank() -> None:
    result = pytest_ddp.run(full_tensor_on_one_rank, world_size=2, timeout=30)
    # full_tensor() syncs out of sight under rank 0's branch alone: rank 0 is named.
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "partial", [0])
    # full_tensor() gathers through a functional collective, recorded at its dispatcher operation.
    assert result.diagnosis.collective == "all_gather_into_tensor"
    [call] = [c for c in result.ranks[0].collectives if c.state == "running"]
    assert call.extra == {"via": "backend"} and call.site.endswith("test_modern_stack.py:" + str(
        full_tensor_on_one_rank.__code__.co_firstlineno + 7))


def functional_all_reduce_never_waited(rank: int) -> None:
    if rank == 0:
        funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD)  # never waited, never matched


def test_functional_collective_never_waited_for() -> None:
    result = pytest_ddp.run(functional_all_reduce_never_waited, world_size=2, timeout=30)
    [line] = result.unfinished_work
    assert line.startswith("rank 0: all_reduce #1")
    if backend_hook._waits_across_threads():  # waited for through its output, which has no timeout
        assert line.endswith("never waited for, and still running 1 s after the test")
    else:  # through its Work (torch 2.8), with Gloo's timeout
        assert "timed out" in line.lower()


def all_gather_single_sizes_differ(rank: int) -> None:
    output = torch.empty(4 if rank == 0 else 6)
    dist.all_gather_single(output, torch.ones(2 if rank == 0 else 3))


@pytest.mark.skipif(not hasattr(dist, "all_gather_single"), reason="torch.distributed.all_gather_single is newer")
def test_all_gather_single_with_different_sizes_is_a_mismatch() -> None:
    """Gloo aborts one rank (SIGABRT) or raises; the verdict names both shapes, not a death."""
    result = pytest_ddp.run(all_gather_single_sizes_differ, world_size=2, timeout=30)
    assert result.outcome in ("deadlock", "failed") and result.diagnosis.kind == "mismatch"
    assert result.diagnosis.collective == "all_gather_single"
    assert "shapes [[2]]" in result.diagnosis.text and "shapes [[3]]" in result.diagnosis.text

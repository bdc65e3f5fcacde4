"""A rank that crashes or runs out of memory in training; DDP with unequal batches; a rank that skips backward."""

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pytest_ddp


def train_step(rank: int, batch: int, crash: str | None = None, skip_backward: bool = False) -> list[float]:
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    torch.manual_seed(rank)
    loss = model(torch.randn(batch, 4)).pow(2).mean()
    if rank == 1 and crash == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    if rank == 1 and crash == "exit":
        os._exit(1)
    if not (skip_backward and rank == 1):
        loss.backward()
    return model.module.weight.grad.flatten().tolist() if model.module.weight.grad is not None else []


def test_rank_out_of_memory_during_training():
    result = pytest_ddp.run(train_step, world_size=2, args=(8, "oom"), timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "rank_exited", [1])
    assert result.diagnosis.collective == "all_reduce"  # DDP's gradient bucket
    assert "OutOfMemoryError" in result.ranks[1].exception


def test_rank_process_crash_during_training():
    result = pytest_ddp.run(train_step, world_size=2, args=(8, "exit"), timeout=30)
    assert result.diagnosis.kind == "rank_exited" and result.diagnosis.culprits == [1]
    assert result.ranks[1].exit_code == 1


def test_rank_skipping_backward():
    result = pytest_ddp.run(train_step, world_size=2, args=(8, None, True), timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "partial", [1])
    assert result.diagnosis.collective == "all_reduce"


def unequal_batches(rank: int) -> list[float]:
    return train_step(rank, batch=10 if rank == 0 else 20)


@pytest.mark.ddp(world_size=2)
def test_ddp_with_different_batch_sizes_per_rank_trains_fine(rank):
    """Said to hang; it does not: the gradient is the plain mean of the ranks' gradients."""
    gathered = [None, None]
    dist.all_gather_object(gathered, unequal_batches(rank))
    assert gathered[0] == gathered[1]


@pytest.mark.ddp(world_size=2)
def test_fixed_every_rank_steps(rank):
    grads = train_step(rank, batch=8)
    gathered = [None, None]
    dist.all_gather_object(gathered, grads)
    assert gathered[0] == gathered[1]

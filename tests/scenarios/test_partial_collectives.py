"""A collective called by only some ranks; a rank that returns early; an exception before a barrier."""

import pytest
import torch
import torch.distributed as dist

import pytest_ddp


def half_all_reduce(rank: int) -> None:
    if rank < 2:
        dist.all_reduce(torch.ones(1))


def early_return(rank: int) -> None:
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        return
    dist.all_reduce(torch.ones(1))


def raise_before_barrier(rank: int) -> None:
    if rank == 0:
        raise ValueError("bad input on rank 0")
    dist.barrier()


def test_collective_called_by_half_the_ranks():
    result = pytest_ddp.run(half_all_reduce, world_size=4, timeout=30)
    assert result.outcome == "deadlock"
    assert (result.diagnosis.kind, result.diagnosis.culprits, result.diagnosis.waiting) == ("partial", [2, 3], [0, 1])


def test_rank_returning_early():
    result = pytest_ddp.run(early_return, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "partial", [1])
    assert "all_reduce #2" in result.diagnosis.text


def test_exception_before_barrier():
    result = pytest_ddp.run(raise_before_barrier, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "rank_exited", [0])
    assert result.diagnosis.collective == "barrier"
    assert result.ranks[0].exception == "ValueError: bad input on rank 0"


@pytest.mark.ddp(world_size=4)
def test_fixed_every_rank_calls_the_collective(rank):
    t = torch.ones(1) if rank < 2 else torch.zeros(1)  # contribute nothing, but take part
    dist.all_reduce(t)
    assert t.item() == 2

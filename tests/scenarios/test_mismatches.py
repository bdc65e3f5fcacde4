"""Ranks that disagree on shapes, dtypes, the collective, or the order of collectives; a collective
made in a function called under one rank's branch."""

import pytest
import torch
import torch.distributed as dist

import pytest_ddp


def different_shapes(rank: int, shape0: tuple, shape1: tuple) -> None:
    dist.all_reduce(torch.ones(shape0 if rank == 0 else shape1))


def different_dtypes(rank: int) -> None:
    dist.all_reduce(torch.ones(3, dtype=torch.float32 if rank == 0 else torch.float64))


def different_collectives(rank: int) -> None:
    t = torch.ones(3)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def different_order(rank: int) -> None:
    a, b = torch.ones(2), torch.ones(2)
    group = dist.new_group([0, 1])
    if rank == 0:
        dist.all_reduce(a)
        dist.all_reduce(b, group=group)
    else:
        dist.all_reduce(b, group=group)
        dist.all_reduce(a)


def save_checkpoint(step: int) -> None:
    dist.broadcast_object_list([f"ckpt-{step}"], src=0)  # every rank must make it


def checkpoint_in_rank_zeros_hook(rank: int) -> None:
    for step in range(2):
        dist.all_reduce(torch.ones(4))
        if rank == 0:  # speechbrain#2401: a main-process-only hook
            save_checkpoint(step)


def test_shape_10_against_20():
    result = pytest_ddp.run(different_shapes, world_size=2, args=((10,), (20,)), timeout=30)
    assert result.outcome in ("deadlock", "failed")  # seen in flight, or after Gloo's size check aborted rank 0
    assert result.diagnosis.kind == "mismatch"
    assert "[[10]]" in result.diagnosis.text and "[[20]]" in result.diagnosis.text


def test_dtype_mismatch():
    result = pytest_ddp.run(different_dtypes, world_size=2, timeout=30)
    assert result.outcome in ("deadlock", "failed")
    assert result.diagnosis.kind == "mismatch"
    assert "float32" in result.diagnosis.text and "float64" in result.diagnosis.text


def test_same_size_different_shape_passes_on_gloo_but_the_sequences_differ():
    result = pytest_ddp.run(different_shapes, world_size=2, args=((2, 5), (10,)), timeout=30)
    assert result.outcome == "passed"  # Gloo lets it through
    assert result.collective_differences == [
        f"group WORLD, collective #1: rank 0 all_reduce shapes [[2, 5]] float32 ({result.ranks[0].collectives[0].site})"
        f" vs rank 1 all_reduce shapes [[10]] float32 ({result.ranks[1].collectives[0].site})"
    ]


def test_all_reduce_against_broadcast():
    result = pytest_ddp.run(different_collectives, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "mismatch")
    assert "all_reduce" in result.diagnosis.text and "broadcast" in result.diagnosis.text


def test_collectives_in_a_different_order():
    result = pytest_ddp.run(different_order, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "mismatch")
    assert "order of collectives" in result.diagnosis.text


@pytest.mark.ddp(world_size=2)
def test_fixed_same_shape_everywhere(rank):
    t = torch.full((10,), float(rank))
    dist.all_reduce(t)
    assert t.tolist() == [1.0] * 10


def test_a_collective_in_a_function_called_under_one_ranks_branch_names_that_rank():
    result = pytest_ddp.run(checkpoint_in_rank_zeros_hook, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "mismatch", [0])
    assert "Rank 0's call is in a branch of the code for one rank" in result.diagnosis.text

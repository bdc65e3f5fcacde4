"""all_gather_object with an object that does not pickle, and two that are said not to but do."""

import threading

import pytest
import torch
import torch.distributed as dist

import pytest_ddp


class Holder:
    def __init__(self, tensor):
        self.tensor = tensor


def gather(rank: int, kind: str) -> list:
    objects = {
        "lambda": lambda: rank,
        "lock": threading.Lock(),
        "tensor_in_plain_class": Holder(torch.ones(2) * rank),
        "nested_dict": [1, 2, 3, {4: "error"}],
    }
    gathered = [None, None]
    dist.all_gather_object(gathered, objects[kind] if rank == 0 else rank)
    return [type(g).__name__ for g in gathered]


@pytest.mark.parametrize(
    "kind, error", [("lambda", "Can't pickle local object"), ("lock", "cannot pickle '_thread.lock' object")]
)
def test_unpicklable_object_is_diagnosed(kind, error):
    result = pytest_ddp.run(gather, world_size=2, args=(kind,), timeout=30)
    assert result.outcome == "deadlock"
    assert (result.diagnosis.kind, result.diagnosis.culprits, result.diagnosis.waiting) == ("rank_exited", [0], [1])
    assert result.diagnosis.collective == "all_gather_object"
    assert error in result.ranks[0].exception
    assert result.ranks[0].collectives[-1].state == "raised"


# The objects said not to pickle, and the type each rank receives from rank 0.
PICKLE_FINE = {"tensor_in_plain_class": "Holder", "nested_dict": "list"}


@pytest.mark.ddp(world_size=2)
@pytest.mark.parametrize("kind", PICKLE_FINE)
def test_claimed_unpicklable_objects_pickle_fine(rank, kind):
    assert gather(rank, kind) == [PICKLE_FINE[kind], "int"]


@pytest.mark.ddp(world_size=2)
def test_fixed_gather_plain_data(rank):
    gathered = [None, None]
    dist.all_gather_object(gathered, {"rank": rank, "state": [rank] * 3})
    assert [g["rank"] for g in gathered] == [0, 1]

"""Distributed tests that are broken on purpose: each shows a diagnosed hang or failure.

`make demo` runs them and checks that each fails with the expected diagnosis.
"""

import threading
import time

import pytest
import torch
import torch.distributed as dist


@pytest.mark.ddp(world_size=2)
def test_rank_raises_while_peer_waits(rank):
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    dist.barrier()


@pytest.mark.ddp(world_size=2, timeout=5)
def test_rank_sleeps_past_the_timeout(rank):
    if rank == 1:
        time.sleep(3600)
    dist.barrier()


@pytest.mark.ddp(world_size=2)
def test_unpicklable_object_in_all_gather_object(rank):
    payload = {"rank": rank, "lock": threading.Lock() if rank == 0 else None}
    gathered = [None, None]
    dist.all_gather_object(gathered, payload)


@pytest.mark.ddp(world_size=4)
def test_only_half_the_ranks_call_all_reduce(rank):
    t = torch.ones(1)
    if rank < 2:
        dist.all_reduce(t)


@pytest.mark.ddp(world_size=2)
def test_ranks_disagree_on_the_collective(rank):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=1)

"""The seed articles' faults injected with pytest_ddp.faults instead of written by hand, each
diagnosed as its hand-written version is (test_partial_collectives.py, test_crashes_and_ddp.py,
test_unpicklable_objects.py, test_init_faults.py)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pytest_ddp
from pytest_ddp import faults


def barrier_once(rank: int) -> None:
    dist.barrier()


def ddp_steps(rank: int, steps: int = 3) -> None:
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    for _ in range(steps):
        model(torch.randn(8, 4)).pow(2).mean().backward()  # DDP's all_reduce, reached at the backend


def gather_objects(rank: int) -> list:
    gathered = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})
    return gathered


def late_init(rank: int) -> None:
    dist.init_process_group("gloo")
    dist.barrier()


def two_all_reduces(rank: int) -> None:
    dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1))


def test_exception_before_a_barrier():
    fault = faults.raise_(rank=0, at="barrier", exc=ValueError("bad input on rank 0"))
    result = pytest_ddp.run(barrier_once, world_size=2, timeout=30, faults=[fault])
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "rank_exited", [0])
    assert result.diagnosis.collective == "barrier"
    assert result.ranks[0].exception == "ValueError: bad input on rank 0"
    assert "injected: raise ValueError('bad input on rank 0') on rank 0 at barrier call 1" in result.diagnosis.text


def test_rank_out_of_memory_in_ddp_training():
    fault = faults.oom(rank=1, at="all_reduce", call=2, size=64 * 2**20)
    result = pytest_ddp.run(ddp_steps, world_size=2, timeout=30, faults=[fault])
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "rank_exited", [1])
    assert result.diagnosis.collective == "all_reduce"  # DDP's gradient bucket
    assert result.ranks[1].exception.startswith("MemoryError: injected by pytest-ddp: out of memory")
    assert result.ranks[1].peak_rss > 64 * 2**20


def test_crashed_node_in_ddp_training():
    result = pytest_ddp.run(ddp_steps, world_size=2, timeout=30, faults=[faults.kill(rank=1, at="all_reduce", call=2)])
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("failed", "rank_exited", [1])
    assert result.ranks[1].exit_code == -9
    assert result.injected == ["SIGKILL on rank 1 at all_reduce call 2"]


def test_unpicklable_object_in_all_gather_object():
    fault = faults.raise_(rank=0, at="all_gather_object", exc=TypeError("cannot pickle '_thread.lock' object"))
    result = pytest_ddp.run(gather_objects, world_size=2, timeout=30, faults=[fault])
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "rank_exited", [0])
    assert result.diagnosis.collective == "all_gather_object"


def test_rank_that_never_reaches_init():
    fault = faults.hang(rank=1, at="init_process_group")
    result = pytest_ddp.run(late_init, world_size=2, timeout=3, init=False, faults=[fault])
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("timeout", "timeout", [1])
    assert "rank 1 is running outside any collective" in result.diagnosis.text


def test_broken_connections():
    """Gloo wakes every rank, the disconnected one too: each raises "Connection closed by peer".
    The rank the test cut is named; the others were woken by it."""
    fault = faults.disconnect(rank=1, at="all_reduce", call=2)
    result = pytest_ddp.run(two_all_reduces, world_size=3, timeout=30, faults=[fault])
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("failed", "failed", [1])
    assert result.diagnosis.waiting == [0, 2]
    assert all("Connection closed by peer" in r.exception for r in result.ranks)
    assert result.injected == ["connections to its peers broken on rank 1 at all_reduce call 2"]

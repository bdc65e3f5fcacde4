"""pytest_ddp.run(): run a function on fresh ranks and look at what happened."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import pytest_ddp


def sum_of_ranks(rank: int, scale: float = 1.0) -> float:
    t = torch.tensor([float(rank) * scale])
    dist.all_reduce(t)
    print(f"rank {rank} says hello")
    return t.item()


def only_rank_0_waits(rank: int) -> None:
    if rank != 1:  # rank 1 skips the barrier
        dist.barrier()


def rank_1_raises(rank: int) -> None:
    if rank == 1:
        raise KeyError("missing shard")


def sleeps(rank: int) -> None:
    time.sleep(3600)


def dies(rank: int) -> None:
    if rank == 1:
        os._exit(3)


def own_init(rank: int) -> int:
    dist.init_process_group("gloo")
    size = dist.get_world_size()
    # As torch's tests do: Gloo's init can return on one rank before the other's handshake ends,
    # and a group destroyed at once then fails the other's init ("Connection closed by peer").
    dist.barrier()
    dist.destroy_process_group()
    return size


def test_passed_with_values_output_and_memory() -> None:
    result = pytest_ddp.run(sum_of_ranks, world_size=2, kwargs={"scale": 2.0})
    assert result.outcome == "passed" and result.diagnosis is None
    assert result.values == [2.0, 2.0]
    for r, rank in enumerate(result.ranks):
        assert rank.outcome == "passed" and rank.exception is None
        assert f"rank {r} says hello" in rank.stdout
        assert [(c.op, c.seq, c.state, c.shapes) for c in rank.collectives] == [("all_reduce", 1, "ok", [[1]])]
        assert rank.collectives[0].site.endswith("test_api.py:17")
        assert rank.peak_rss is not None and rank.peak_rss > 10_000_000
        assert rank.peak_cuda is None
        assert rank.exit_code == 0


def test_deadlock_is_diagnosed() -> None:
    result = pytest_ddp.run(only_rank_0_waits, world_size=2, timeout=30)
    assert result.outcome == "deadlock"
    assert (result.diagnosis.kind, result.diagnosis.culprits, result.diagnosis.waiting) == ("partial", [1], [0])
    assert result.diagnosis.collective == "barrier"
    assert "barrier #1" in result.diagnosis.text
    assert result.ranks[0].outcome == "stopped" and "in only_rank_0_waits" in result.ranks[0].traceback
    assert result.ranks[0].exit_code == -9  # stopped while hung
    assert result.ranks[1].outcome == "passed"


def test_failed_ranks_carry_exception_and_traceback() -> None:
    result = pytest_ddp.run(rank_1_raises, world_size=2)
    assert result.outcome == "failed"
    assert (result.diagnosis.kind, result.diagnosis.culprits) == ("failed", [1])
    assert result.ranks[1].exception == "KeyError: 'missing shard'"
    assert "rank_1_raises" in result.ranks[1].traceback


def test_timeout() -> None:
    result = pytest_ddp.run(sleeps, world_size=1, timeout=2)
    assert result.outcome == "timeout" and result.diagnosis.kind == "timeout"
    assert "in sleeps" in result.ranks[0].traceback


def test_a_rank_that_dies_has_its_exit_code() -> None:
    result = pytest_ddp.run(dies, world_size=2, timeout=30)
    assert result.outcome in ("failed", "deadlock")
    assert result.ranks[1].exit_code == 3 and result.ranks[1].outcome == "failed"
    assert result.diagnosis.kind == "rank_exited" and result.diagnosis.culprits == [1]


def test_init_false_gives_the_torchrun_environment() -> None:
    result = pytest_ddp.run(own_init, world_size=2, init=False)
    assert result.outcome == "passed", result.diagnosis and result.diagnosis.text
    assert result.values == [2, 2]
    assert [c.op for c in result.ranks[0].collectives] == ["init_process_group", "barrier", "destroy_process_group"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_size": 0}, "world_size=0"),
        ({"backend": "ucc"}, "backend='ucc'"),
        ({"timeout": -1}, "timeout=-1"),
        ({"world_size": 1_000_000}, "world_size=1000000: this machine holds at most"),
        ({"timeout": float("inf")}, "timeout=inf: must be a number of seconds > 0 and <= 1000000"),
        ({"grace": 0}, "grace=0: must be a number of seconds > 0"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        pytest_ddp.run(sum_of_ranks, **kwargs)


def test_local_functions_are_refused() -> None:
    def local(rank: int) -> None:
        pass

    with pytest.raises(ValueError, match="module-level function"):
        pytest_ddp.run(local)


def test_ranks_that_could_not_start_are_a_failed_result_that_says_why() -> None:
    from pytest_ddp.api import _result
    from pytest_ddp.config.spec import RankSpec
    from pytest_ddp.groups.runner import StartFailure

    spec = RankSpec(2, "gloo", 10.0, grace=2.0)
    failure = StartFailure("m.f", spec, "rank 1 could not start:\nOSError: no route", 0.5)
    result = _result(failure)
    assert (result.outcome, result.ranks, result.values) == ("failed", [], [])
    assert result.diagnosis is not None
    assert result.diagnosis.text.splitlines()[0] == "ddp: rank 1 could not start"
    assert "OSError: no route" in result.diagnosis.text

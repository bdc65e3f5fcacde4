"""Each way distributed code hangs, diagnosed: the right kind, rank and collective, in about a second.

One inner pytest session (a real one, run in this process by the first test
that needs it) runs every broken pattern below as a ddp test with
``--ddp-report-dir``; each test here reads that pattern's JSON report. The
same session runs OTHERS, whose tests here read their outcomes and failure sections.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass

import pytest

from conftest import HEADER, ModuleShared, Session, failure_section, outcomes, session_in_process

BROKEN = '''
import os, time
import pytest, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


@pytest.mark.ddp(world_size=2, timeout=60)
def test_raise_before_barrier(rank):
    if rank == 0:
        raise RuntimeError("rank 0 gives up")
    dist.barrier()


@pytest.mark.ddp(world_size=2, timeout=60)
def test_unpicklable_object(rank):
    gathered = [None, None]
    dist.barrier()
    dist.all_gather_object(gathered, (lambda: rank) if rank == 0 else rank)


@pytest.mark.ddp(world_size=4, timeout=60)
def test_half_the_ranks_all_reduce(rank):
    if rank < 2:
        dist.all_reduce(torch.ones(1))


@pytest.mark.ddp(world_size=2, timeout=60)
def test_all_reduce_against_broadcast(rank):
    t = torch.ones(3)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


@pytest.mark.ddp(world_size=2, timeout=60)
def test_shapes_10_against_20(rank):
    dist.all_reduce(torch.ones(10 if rank == 0 else 20))


@pytest.mark.ddp(world_size=2, timeout=60)
def test_both_recv_first(rank):
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)
    dist.send(t, dst=1 - rank)


@pytest.mark.ddp(world_size=2, timeout=60)
def test_return_early_skipping_the_last_collective(rank):
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        return
    dist.all_reduce(torch.ones(1))


@pytest.mark.ddp(world_size=2, timeout=60)
def test_os_exit_inside_the_test(rank):
    if rank == 1:
        os._exit(1)
    dist.all_reduce(torch.ones(1))


@pytest.mark.ddp(world_size=2, timeout=60)
def test_ddp_rank_skips_backward(rank):
    model = DDP(nn.Linear(4, 1))
    loss = model(torch.randn(2, 4)).sum()
    if rank != 1:  # rank 1 skips it
        loss.backward()
'''

# test name -> (status, kind, culprits, collective); ANY: not checked
ANY = object()
EXPECTED = {
    "test_raise_before_barrier": ("deadlock", "rank_exited", [0], "barrier"),
    "test_unpicklable_object": ("deadlock", "rank_exited", [0], "all_gather_object"),
    "test_half_the_ranks_all_reduce": ("deadlock", "partial", [2, 3], "all_reduce"),
    # Two ranks, two operations: a tie, both named, no operation singled out.
    "test_all_reduce_against_broadcast": ("deadlock", "mismatch", [0, 1], None),
    # Seen while both wait (deadlock), or after Gloo's size check aborted rank 0 (done).
    "test_shapes_10_against_20": (ANY, "mismatch", [0, 1], "all_reduce"),
    "test_both_recv_first": ("deadlock", "p2p_cycle", [0, 1], "recv"),
    "test_return_early_skipping_the_last_collective": ("deadlock", "partial", [1], "all_reduce"),
    # Seen while rank 0 still waits (deadlock), or after Gloo woke it with an error (done).
    "test_os_exit_inside_the_test": (ANY, "rank_exited", [1], ANY),
    "test_ddp_rank_skips_backward": ("deadlock", "partial", [1], "all_reduce"),
}


# A passing test whose ranks' collectives differ (Gloo lets a shape of the same size through), the
# same with check_collectives=False, and a failure whose report shows each rank's peak memory.
OTHERS = """
@pytest.mark.ddp(world_size=2)
def test_shapes(rank):
    dist.all_reduce(torch.ones((2, 5) if rank == 0 else (10,)))  # Gloo lets this through


@pytest.mark.ddp(world_size=2, check_collectives=False)
def test_shapes_unchecked(rank):
    dist.all_reduce(torch.ones((2, 5) if rank == 0 else (10,)))


@pytest.mark.ddp(world_size=2)
def test_one_waits(rank):
    if rank == 0:
        dist.barrier()
"""


@dataclass
class Broken:
    """The session's result, and the JSON reports of its failed tests by test name."""

    result: pytest.RunResult
    reports: dict[str, dict]


@pytest.fixture
def broken(module_shared: ModuleShared, pytester: pytest.Pytester) -> Broken:
    """Every broken pattern and OTHERS, run once."""
    return module_shared.once("broken", lambda: run_broken(pytester))


@pytest.fixture
def reports(broken: Broken) -> dict[str, dict]:
    return broken.reports


def run_broken(pytester: pytest.Pytester) -> Broken:
    files = {"test_broken.py": BROKEN, "test_others.py": HEADER + textwrap.dedent(OTHERS)}
    result = session_in_process(pytester, "broken", Session(files, ("--ddp-report-dir=reports", "-rA")), 1)
    report_dir = pytester.path / "broken" / "reports"
    found = {}
    for path in report_dir.glob("*.json"):
        if path.name.endswith(".trace.json"):
            continue  # the same report as a Chrome trace
        data = json.loads(path.read_text())
        found[data["test"].rsplit("::", 1)[-1]] = data
    return Broken(result, found)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_pattern_is_diagnosed(reports, name: str) -> None:
    status, kind, culprits, collective = EXPECTED[name]
    report = reports[name]
    assert (report["kind"], report["culprits"]) == (kind, culprits), report["summary"]
    assert status is ANY or report["status"] == status, report["summary"]
    assert collective is ANY or report["collective"] == collective, report["summary"]
    # Diagnosed as it happened, not by the 60 s timeout (how fast: benchmarks, not tests).
    assert report["status"] != "timeout", report["summary"]


def test_unpicklable_object_report_names_the_error_and_line(reports) -> None:
    summary = reports["test_unpicklable_object"]["summary"]
    assert "rank 0 raised" in summary and "pickle" in summary
    assert "all_gather_object #2 (test_broken.py:" in summary  # barrier was #1


def test_mismatch_report_shows_both_shapes(reports) -> None:
    summary = reports["test_shapes_10_against_20"]["summary"]
    assert "rank 0 all_reduce shapes [[10]] float32" in summary
    assert "rank 1 all_reduce shapes [[20]] float32" in summary


def test_os_exit_report_names_the_exit_code(reports) -> None:
    assert "rank 1 died (exit code 1)" in reports["test_os_exit_inside_the_test"]["summary"]


def ddp_step(rank: int) -> list[float]:
    """One DDP training step; runs on the ranks of the test below."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    torch.manual_seed(rank)
    model(torch.randn(2, 4)).sum().backward()
    return model.module.weight.grad.flatten().tolist()


def test_passing_ddp_step_shows_the_reducers_allreduce() -> None:
    import pytest_ddp

    result = pytest_ddp.run(ddp_step, world_size=2, timeout=60)
    assert result.outcome == "passed", result.diagnosis and result.diagnosis.text
    assert result.values[0] == result.values[1]  # gradients were averaged
    for rank in result.ranks:
        calls = [(c.op, c.group, c.state, c.extra.get("via")) for c in rank.collectives]
        # DDP's constructor (parameter check, then broadcasts), then the gradient bucket.
        assert calls[0] == ("all_gather", "WORLD", "ok", "backend")
        assert calls[-1] == ("all_reduce", "WORLD", "ok", "backend")
        assert {op for op, *_ in calls[1:-1]} == {"broadcast"}
        assert [c.seq for c in rank.collectives] == list(range(1, len(calls) + 1))
        assert rank.collectives[-1].shapes == [[5]]  # the bucket: 4 weights and a bias


def test_passing_test_whose_collectives_differ_fails(broken: Broken) -> None:
    assert outcomes(broken.result, "test_others.py")["test_shapes"] == "FAILED"
    failure_section(broken.result, "test_shapes").fnmatch_lines(
        [
            "*the ranks' collective sequences differ:*",
            "*group WORLD, collective #1: rank 0 all_reduce shapes *2, 5* float32 *"
            " vs rank 1 all_reduce shapes *10* float32*",
        ]
    )


def test_check_collectives_false_lets_it_pass(broken: Broken) -> None:
    assert outcomes(broken.result, "test_others.py")["test_shapes_unchecked"] == "PASSED"


def test_failure_report_shows_peak_memory_per_rank(broken: Broken) -> None:
    assert outcomes(broken.result, "test_others.py")["test_one_waits"] == "FAILED"
    failure_section(broken.result, "test_one_waits").fnmatch_lines(
        ["rank 0: waiting in barrier #1*; peak RSS * MB", "rank 1: finished (passed)*; peak RSS * MB"]
    )

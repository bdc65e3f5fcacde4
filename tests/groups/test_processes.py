"""Rank processes: loopback-only rendezvous, xdist (and faults under it), GPU skips, and no orphans ever."""

from __future__ import annotations

import inspect
import signal
from collections.abc import Iterator

import pytest

from conftest import (
    HEADER,
    LOOPBACK,
    Controller,
    Session,
    controllers_started_together,
    listening_addresses,
    live_pids,
    outcomes,
    sessions_together,
    wait_for,
)

LOOPBACK_CHECK = f"""
{inspect.getsource(listening_addresses)}
LOOPBACK = {LOOPBACK!r}

@pytest.mark.ddp(world_size=2)
def test_nothing_listens_beyond_loopback(rank):
    dist.barrier()
    controller = os.getppid()
    addresses = listening_addresses(os.getpid()) + listening_addresses(controller)
    assert addresses, "expected the store's listening socket at least"
    assert set(addresses) <= LOOPBACK, addresses
"""


def test_store_and_gloo_listen_on_loopback_only(ddp_pytester) -> None:
    ddp_pytester.run(LOOPBACK_CHECK).assert_outcomes(passed=1)


SUMS = "".join(
    f"""
@pytest.mark.ddp(world_size=2)
def test_sum_{i}(rank):
    t = torch.tensor([rank + {i}.0])
    dist.all_reduce(t)
    assert t.item() == 1 + 2 * {i}
"""
    for i in range(4)
)

XDIST_FAULTS = """
import pytest, torch
import torch.distributed as dist
from pytest_ddp import faults


@pytest.mark.ddp(world_size=2, faults=[faults.raise_(rank=1, at="all_reduce", exc=ValueError)])
def test_fault(rank):
    if rank == 1:
        with pytest.raises(ValueError):
            dist.all_reduce(torch.ones(1))
    else:
        dist.barrier()  # rank 1's all_reduce never took part
    if rank == 1:
        dist.barrier()


@pytest.mark.parametrize("n", range(4))
@pytest.mark.ddp(world_size=2)
def test_no_fault(rank, n):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@pytest.mark.ddp(world_size=2, faults=[faults.kill(rank=0, at="all_reduce", call=2)])
def test_never_fires(rank):
    dist.all_reduce(torch.ones(1))
"""


@pytest.fixture(scope="module")
def xdist_session(tmp_path_factory: pytest.TempPathFactory) -> pytest.RunResult:
    """One session in 2 pytest-xdist workers, of the two modules the tests below read."""
    files = {"test_sums.py": HEADER + SUMS, "test_xdist_faults.py": XDIST_FAULTS}
    return sessions_together(tmp_path_factory.mktemp("xdist"), {"s": Session(files, ("-n", "2", "-rA"))})["s"]


def test_xdist_runs_ddp_tests_in_parallel_without_clashes(xdist_session: pytest.RunResult) -> None:
    assert outcomes(xdist_session, "test_sums.py") == {f"test_sum_{i}": "PASSED" for i in range(4)}


def test_faults_under_xdist_fire_in_their_own_test_only(xdist_session: pytest.RunResult) -> None:
    no_fault = {f"test_no_fault[{n}]": "PASSED" for n in range(4)}
    expected = {"test_fault": "PASSED", **no_fault, "test_never_fires": "FAILED"}
    assert outcomes(xdist_session, "test_xdist_faults.py") == expected
    never_fired = "*injected faults never fired: SIGKILL on rank 0 at all_reduce call 2*"
    xdist_session.stdout.fnmatch_lines([never_fired])


def test_nccl_without_enough_gpus_is_skipped_before_spawning(ddp_pytester) -> None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    result = ddp_pytester.run(
        f"""
        @pytest.mark.ddp(world_size={gpus + 1})
        def test_on_gpus(device):
            assert device.type == "cuda"
        """,
        "--ddp-backend=nccl",
        "-rs",
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*nccl test needs {gpus + 1} GPUs, {gpus} visible*"])
    result.stdout.no_fnmatch_line("*rank group* started*")


# -- no orphans -----------------------------------------------------------------

HANGING_TEST = """
import os, time, pytest, torch.distributed as dist

@pytest.mark.ddp(world_size=2, timeout=600)
def test_hang(rank):
    with open(os.path.join(os.environ["PID_DIR"], f"{{rank}}.pid"), "w") as f:
        f.write(str(os.getpid()))
    {body}
"""


SIGNALS = [signal.SIGKILL, signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


@pytest.fixture(scope="module")
def controllers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Controller]]:
    """The controllers of the test below, started together, one per signal: SIGINT's, SIGTERM's
    and SIGHUP's ranks sleep; SIGKILL's rank 0 is blocked in a collective (a barrier its rank 1,
    asleep, never calls), which dies with its controller as a sleeping rank does (a controller of
    its own cost a pytest, a forkserver and two ranks, each importing torch)."""
    sleeping = HANGING_TEST.format(body="time.sleep(3600)")
    blocked = HANGING_TEST.format(body="if rank == 0: dist.barrier()\n    time.sleep(3600)")
    sources = {how.name: blocked if how == signal.SIGKILL else sleeping for how in SIGNALS}
    with controllers_started_together(tmp_path_factory.mktemp("controllers"), sources) as started:
        yield started


@pytest.mark.parametrize("how", SIGNALS, ids=lambda s: s.name)
def test_ranks_die_with_their_controller(controllers: dict[str, Controller], how: signal.Signals) -> None:
    controller = controllers[how.name]
    ranks = controller.rank_pids()
    controller.process.send_signal(how)
    code = controller.process.wait(timeout=60)
    wait_for(lambda: not live_pids(ranks), "the ranks to die", limit=10)
    # Ctrl-C ends the session as pytest does (status 2), SIGTERM and SIGHUP (a closed terminal)
    # kill it as they kill pytest; after each, nothing of multiprocessing's is left in its TMPDIR
    # (SIGKILL leaves it).
    assert code == {signal.SIGINT: 2}.get(how, -how)
    if how != signal.SIGKILL:
        assert not list(controller.tmpdir.glob("pymp-*"))

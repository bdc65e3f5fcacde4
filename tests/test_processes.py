"""Rank processes: loopback-only rendezvous, xdist, GPU skips, and no orphans ever."""

from __future__ import annotations

import inspect
import signal
from collections.abc import Iterator

import pytest

from conftest import LOOPBACK, Controller, controllers_started_together, listening_addresses, live_pids, wait_for

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


def test_xdist_runs_ddp_tests_in_parallel_without_clashes(ddp_pytester) -> None:
    body = "".join(
        f"""
@pytest.mark.ddp(world_size=2)
def test_sum_{i}(rank):
    t = torch.tensor([rank + {i}.0])
    dist.all_reduce(t)
    assert t.item() == 1 + 2 * {i}
"""
        for i in range(4)
    )
    result = ddp_pytester.run_subprocess(body, "-n", "2")
    result.assert_outcomes(passed=4)


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


SIGNALS = [signal.SIGKILL, signal.SIGINT, signal.SIGTERM]


@pytest.fixture(scope="module")
def controllers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Controller]]:
    """The controllers of the tests below, started together: one whose ranks sleep per signal,
    and one whose rank 0 is blocked in a barrier."""
    sleeping = HANGING_TEST.format(body="time.sleep(3600)")
    blocked = HANGING_TEST.format(body="if rank == 0: dist.barrier()\n    time.sleep(3600)")
    sources = {how.name: sleeping for how in SIGNALS} | {"blocked": blocked}
    with controllers_started_together(tmp_path_factory.mktemp("controllers"), sources) as started:
        yield started


@pytest.mark.parametrize("how", SIGNALS, ids=lambda s: s.name)
def test_ranks_die_with_their_controller(controllers: dict[str, Controller], how: signal.Signals) -> None:
    controller = controllers[how.name]
    ranks = controller.rank_pids()
    controller.process.send_signal(how)
    code = controller.process.wait(timeout=60)
    wait_for(lambda: not live_pids(ranks), "the ranks to die", limit=10)
    # Ctrl-C ends the session as pytest does (status 2), SIGTERM kills it as it kills pytest;
    # after either, nothing of multiprocessing's is left in its TMPDIR (SIGKILL leaves it).
    assert code == {signal.SIGINT: 2}.get(how, -how)
    if how != signal.SIGKILL:
        assert not list(controller.tmpdir.glob("pymp-*"))


def test_ranks_blocked_in_a_collective_die_with_their_controller(controllers: dict[str, Controller]) -> None:
    controller = controllers["blocked"]
    ranks = controller.rank_pids()
    controller.process.kill()
    controller.process.wait(timeout=60)
    wait_for(lambda: not live_pids(ranks), "the ranks to die", limit=10)

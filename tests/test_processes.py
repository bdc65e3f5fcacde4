"""Rank processes: loopback-only rendezvous, xdist, GPU skips, and no orphans ever."""

from __future__ import annotations

import inspect
import signal
from pathlib import Path

import pytest

from conftest import LOOPBACK, listening_addresses, live_pids, wait_for

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


def _rank_pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in pid_dir.glob("*.pid")]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_ranks_die_with_their_controller(start_controller, how) -> None:
    controller, pid_dir = start_controller(HANGING_TEST.format(body="time.sleep(3600)"))
    ranks = _rank_pids(pid_dir)
    controller.send_signal(how)
    controller.wait(timeout=60)
    wait_for(lambda: not live_pids(ranks), "the ranks to die", limit=10)


def test_ranks_blocked_in_a_collective_die_with_their_controller(start_controller) -> None:
    body = "if rank == 0: dist.barrier()\n    time.sleep(3600)"
    controller, pid_dir = start_controller(HANGING_TEST.format(body=body))
    ranks = _rank_pids(pid_dir)
    controller.kill()
    controller.wait(timeout=60)
    wait_for(lambda: not live_pids(ranks), "the ranks to die", limit=10)

"""Launched mode on one machine, under real launchers: torchrun and MPICH's mpiexec (4 processes).

torchrun's rendezvous store listens on every interface, so its runs go into a
network namespace of their own whose only interface is loopback.

Each session runs once under each launcher it is asserted for (a fixture, tests/launched/runs.py),
and the tests read it: the suite under both, the teardowns at a group's stop under torchrun (the
launched group's stop is the same code under every launcher). The collections that differ run
under torchrun on two nodes (test_two_nodes.py) and under srun (test_slurm_launched.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import suite
from .runs import LAUNCHERS, Sessions, shared

LAUNCHER_NAMES = list(LAUNCHERS)


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory: pytest.TempPathFactory) -> Sessions:
    return Sessions(lambda name: tmp_path_factory.mktemp(f"suite-{name}"), suite.write_suite, 4, "-rs")


@pytest.mark.parametrize("launcher", LAUNCHER_NAMES)
def test_one_session_under_the_launcher(suite_runs: Sessions, launcher: str) -> None:
    run = shared(suite_runs, launcher)
    suite.check_suite(run.result, run.folder)


@pytest.mark.parametrize("launcher", LAUNCHER_NAMES)
def test_a_launched_session_leaves_no_folder_behind(suite_runs: Sessions, launcher: str) -> None:
    """The suite fails: once one launched pytest exits non-zero, the launcher ends the others still
    running (torchrun with SIGTERM). Each left a ``pymp-*`` folder (its forkserver's socket) in
    TMPDIR that way."""
    run = shared(suite_runs, launcher)
    assert run.left_in_tmp == [], run.result.output


# Torn down when the world_size=2 group is stopped to make room for test_b's group
# (--ddp-max-groups=1): the stop's report of each rank, rank 1's from another pytest.
# Rank 1's teardown of `resource` runs ``ending``. One module per ending, all in one session.
def teardown_at_stop(name: str, ending: str) -> str:
    return f"""
import os, sys, threading
import pytest, torch.distributed as dist


@pytest.fixture(scope="module")
def resource(rank):
    yield
    if rank == 1:
        print("rank 1 tears resource down ({name})", file=sys.stderr)
        {ending}


@pytest.mark.ddp(world_size=2)
def test_a(resource):
    dist.barrier()


@pytest.mark.ddp(world_size=1)
def test_b():
    pass


@pytest.mark.ddp(world_size=2)
def test_c():
    dist.barrier()
"""


ENDINGS = {
    "raise": 'raise RuntimeError("rank 1\'s teardown broke")',
    "exit": "os._exit(3)",
    "hang": "threading.Event().wait()",
}

# The controller (rank 0's pytest) gives a rank 1 s, not 5, to finish its teardown at a group's stop.
SHORT_STOP_WAIT = """
import pytest_ddp.groups.group


def pytest_configure(config):
    pytest_ddp.groups.group.STOP_WAIT = 1.0
"""


@pytest.fixture(scope="module")
def teardown_runs(tmp_path_factory: pytest.TempPathFactory) -> Sessions:
    """A session of one module per ending (test_teardown_<ending>.py), on 2 processes."""

    def prepare(folder: Path) -> None:
        for name, ending in ENDINGS.items():
            (folder / f"test_teardown_{name}.py").write_text(teardown_at_stop(name, ending))
        (folder / "conftest.py").write_text(SHORT_STOP_WAIT)

    return Sessions(lambda name: tmp_path_factory.mktemp(f"teardown-{name}"), prepare, 2, "--ddp-max-groups=1")


def stop_report(output: str, ending: str) -> str:
    """The report of the stop of the group that held test_teardown_<ending>.py's `resource`."""
    output = output.split("short test summary info")[0]
    sections = output.split("ERROR at teardown of ddp group")
    [section] = [part for part in sections if f"test_teardown_{ending}.py::test_a" in part]
    return section


def test_a_teardown_failure_at_a_groups_stop_on_another_rank_is_reported(teardown_runs: Sessions) -> None:
    output = shared(teardown_runs, "torchrun").result.output
    report = stop_report(output, "raise")
    assert "ranks 0, 1: failed" not in output and "rank 1: failed" in report, output
    assert "RuntimeError: rank 1's teardown broke" in report, output
    assert shared(teardown_runs, "torchrun").result.returncode != 0


@pytest.mark.parametrize(
    "ending, said",
    [
        pytest.param("exit", "died (exit code 3) during the teardown", id="exit"),
        pytest.param("hang", "did not finish the teardown", id="hang"),
    ],
)
def test_a_rank_that_ends_in_the_teardown_at_a_groups_stop_on_another_rank_is_reported(
    teardown_runs: Sessions, ending: str, said: str
) -> None:
    result = shared(teardown_runs, "torchrun").result
    report = stop_report(result.output, ending)
    assert "ranks 0, 1: failed" not in result.output and "rank 1: failed" in report, result.output
    assert f"{said} of the fixtures it still held when its group was stopped" in report, result.output
    assert f"rank 1 tears resource down ({ending})" in report, result.output
    assert result.returncode != 0

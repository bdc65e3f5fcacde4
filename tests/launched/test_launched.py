"""Launched mode on one machine, under MPICH's mpiexec (4 processes): the suite, and teardowns
at a group's stop on another rank than 0.

mpiexec's hydra listens on every interface, so its run goes into a network namespace of its own
whose only interface is loopback.

Each launcher runs the suite once: mpiexec here, torchrun on two nodes (test_two_nodes.py), SLURM
in an sbatch script (test_slurm_launched.py). The teardowns run in this session, beside the suite
(the launched group's stop is the same code under every launcher). The collections that differ
run under torchrun on two nodes and under srun.
"""

from __future__ import annotations

import pytest

from . import suite
from .runs import Shared, launched_session, mpiexec, mpiexec_unavailable


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
def session(tmp_path_factory: pytest.TempPathFactory) -> Shared:
    """The suite (test_launched.py) and one module per ending (test_teardown_<ending>.py) in one
    session on 4 processes; no process of it outlived it. --ddp-max-groups=1 stops a group to make
    room for the next: the teardowns' (and the suite's, between its world sizes 4 and 2)."""
    if (why := mpiexec_unavailable()) is not None:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("suite")
    suite.write_suite(folder, SHORT_STOP_WAIT)
    for name, ending in ENDINGS.items():
        (folder / f"test_teardown_{name}.py").write_text(teardown_at_stop(name, ending))
    run = launched_session(mpiexec(4, "-rs", "--ddp-max-groups=1"), folder)
    assert not run.left, f"left behind: {run.left}"
    return run


def test_one_session_under_mpiexec(session: Shared) -> None:
    suite.check_suite(session.result, session.folder)


def test_a_launched_session_leaves_no_folder_behind(session: Shared) -> None:
    """The suite fails: once one launched pytest exits non-zero, the launcher ends the others still
    running. Each left a ``pymp-*`` folder (its forkserver's socket) in TMPDIR that way
    (test_two_nodes.py asserts it under torchrun, whose agent ends them with SIGTERM)."""
    assert session.left_in_tmp == [], session.result.output


def stop_report(output: str, ending: str) -> str:
    """The report of the stop of the group that held test_teardown_<ending>.py's `resource`."""
    output = output.split("short test summary info")[0]
    sections = output.split("ERROR at teardown of ddp group")
    [section] = [part for part in sections if f"test_teardown_{ending}.py::test_a" in part]
    return section


def test_a_teardown_failure_at_a_groups_stop_on_another_rank_is_reported(session: Shared) -> None:
    output = session.result.output
    report = stop_report(output, "raise")
    assert "ranks 0, 1: failed" not in output and "rank 1: failed" in report, output
    assert "RuntimeError: rank 1's teardown broke" in report, output
    assert session.result.returncode != 0


@pytest.mark.parametrize(
    "ending, said",
    [
        pytest.param("exit", "died (exit code 3) during the teardown", id="exit"),
        pytest.param("hang", "did not finish the teardown", id="hang"),
    ],
)
def test_a_rank_that_ends_in_the_teardown_at_a_groups_stop_on_another_rank_is_reported(
    session: Shared, ending: str, said: str
) -> None:
    result = session.result
    report = stop_report(result.output, ending)
    assert "ranks 0, 1: failed" not in result.output and "rank 1: failed" in report, result.output
    assert f"{said} of the fixtures it still held when its group was stopped" in report, result.output
    assert f"rank 1 tears resource down ({ending})" in report, result.output
    assert result.returncode != 0

"""Launched mode on one machine, under real launchers: torchrun (4 processes) and MPICH's mpiexec.

torchrun's rendezvous store listens on every interface, so its runs go into a
network namespace of their own whose only interface is loopback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from . import suite
from .nodes import TORCHRUN, isolated_node_command, namespaces_unavailable

PYTHON = sys.executable
MPIEXEC = str(Path(PYTHON).parent / "mpiexec")


def torchrun(nproc: int, *pytest_args: str) -> list[str]:
    command = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "--no-python", PYTHON]
    return isolated_node_command([*command, *suite.pytest_command(*pytest_args)])


def mpiexec(nproc: int, *pytest_args: str) -> list[str]:
    """MPICH's hydra (its control port listens on every interface: isolated too).  Not
    gforker: it cuts a process's output at its first byte above 127 (measured), and
    torch's own messages carry emoji."""
    return isolated_node_command([MPIEXEC, "-n", str(nproc), PYTHON, *suite.pytest_command(*pytest_args)])


def _torchrun_unavailable() -> str | None:
    return namespaces_unavailable() or (None if Path(TORCHRUN).exists() else "no torchrun beside this Python")


def _mpiexec_unavailable() -> str | None:
    return namespaces_unavailable() or (
        None if Path(MPIEXEC).exists() else "no MPICH mpiexec beside this Python (pip install 'pytest-ddp[mpi]')"
    )


LAUNCHERS = [
    pytest.param(torchrun, _torchrun_unavailable, id="torchrun"),
    pytest.param(mpiexec, _mpiexec_unavailable, id="mpiexec"),
]


@pytest.mark.parametrize("launcher, unavailable", LAUNCHERS)
def test_one_session_under_the_launcher(launcher, unavailable, folder: Path) -> None:  # type: ignore[no-untyped-def]
    if (why := unavailable()) is not None:
        pytest.skip(why)
    suite.write_suite(folder)
    result = suite.run(launcher(4, "-rs"), folder)
    suite.check_suite(result, folder)


@pytest.mark.parametrize("launcher, unavailable", LAUNCHERS)
def test_collections_that_differ_stop_every_rank(launcher, unavailable, folder: Path) -> None:  # type: ignore[no-untyped-def]
    if (why := unavailable()) is not None:
        pytest.skip(why)
    suite.write_suite(folder, suite.DIFFERENT_COLLECTION)
    result = suite.run(launcher(4), folder)
    suite.check_collection_differs(result)


# Torn down when the world_size=2 group is stopped to make room for test_b's group
# (--ddp-max-groups=1): the stop's report of each rank, rank 1's from another pytest.
# Rank 1's teardown of `resource` runs ``ending``.
def teardown_at_stop(ending: str) -> str:
    return f"""
import os, sys, threading
import pytest, torch.distributed as dist


@pytest.fixture(scope="module")
def resource(rank):
    yield
    if rank == 1:
        print("rank 1 tears resource down", file=sys.stderr)
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


@pytest.mark.parametrize("launcher, unavailable", LAUNCHERS)
def test_a_teardown_failure_at_a_groups_stop_on_another_rank_is_reported(launcher, unavailable, folder: Path) -> None:  # type: ignore[no-untyped-def]
    if (why := unavailable()) is not None:
        pytest.skip(why)
    (folder / "test_teardown.py").write_text(teardown_at_stop('raise RuntimeError("rank 1\'s teardown broke")'))
    result = suite.run(launcher(2, "--ddp-max-groups=1"), folder)
    assert "ranks 0, 1: failed" not in result.output and "rank 1: failed" in result.output, result.output
    assert "RuntimeError: rank 1's teardown broke" in result.output, result.output
    assert result.returncode != 0


# The controller (rank 0's pytest) gives a rank 1 s, not 5, to finish its teardown at a group's stop.
SHORT_STOP_WAIT = """
import pytest_ddp.groups.group


def pytest_configure(config):
    pytest_ddp.groups.group.STOP_WAIT = 1.0
"""


@pytest.mark.parametrize(
    "ending, said",
    [
        pytest.param("os._exit(3)", "died (exit code 3) during the teardown", id="exit"),
        pytest.param("threading.Event().wait()", "did not finish the teardown", id="hang"),
    ],
)
@pytest.mark.parametrize("launcher, unavailable", LAUNCHERS)
def test_a_rank_that_ends_in_the_teardown_at_a_groups_stop_on_another_rank_is_reported(  # type: ignore[no-untyped-def]
    launcher, unavailable, folder: Path, ending: str, said: str
) -> None:
    if (why := unavailable()) is not None:
        pytest.skip(why)
    (folder / "test_teardown.py").write_text(teardown_at_stop(ending))
    (folder / "conftest.py").write_text(SHORT_STOP_WAIT)
    result = suite.run(launcher(2, "--ddp-max-groups=1"), folder)
    assert "ranks 0, 1: failed" not in result.output and "rank 1: failed" in result.output, result.output
    assert f"{said} of the fixtures it still held when its group was stopped" in result.output, result.output
    assert "rank 1 tears resource down" in result.output, result.output
    assert result.returncode != 0

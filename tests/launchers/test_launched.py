"""Launched mode on one machine, under real launchers: torchrun (4 processes) and MPICH's mpiexec.

torchrun's rendezvous store listens on every interface, so its runs go into a
network namespace of their own whose only interface is loopback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from . import suite
from .nodes import isolated_node_command, namespaces_unavailable

PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
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

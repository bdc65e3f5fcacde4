"""The launchers' command lines on one machine, and a launched session shared among the tests
that assert different things about the same run.

A launched session costs 8 to 25 s: pytest processes that each import torch (and so does
each one's forkserver), their ranks, the launcher. Each is run once (:func:`launched_session`,
called by a fixture of module scope in the test file), and the tests read it.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from . import suite
from .nodes import TORCHRUN, isolated_node_command, namespaces_unavailable

PYTHON = sys.executable
MPIEXEC = str(Path(PYTHON).parent / "mpiexec")


def mpiexec(nproc: int, *pytest_args: str) -> list[str]:
    """MPICH's hydra (its control port listens on every interface: isolated too).  Not
    gforker: it cuts a process's output at its first byte above 127 (measured), and
    torch's own messages carry emoji."""
    return isolated_node_command([MPIEXEC, "-n", str(nproc), PYTHON, *suite.pytest_command(*pytest_args)])


def torchrun_unavailable() -> str | None:
    return namespaces_unavailable() or (None if Path(TORCHRUN).exists() else "no torchrun beside this Python")


def mpiexec_unavailable() -> str | None:
    return namespaces_unavailable() or (
        None if Path(MPIEXEC).exists() else "no MPICH mpiexec beside this Python (pip install 'pytest-ddp[mpi]')"
    )


# Each launcher's pytest writes a status and a log; each in a basetemp of its own (its log is
# there), not one that the others wipe. Appended to suite.CONFTEST, whose names it uses.
OWN_BASETEMP = '''
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if _rank.current() is None:
        rank = next(os.environ[name] for name in RANK_VARIABLES if name in os.environ)
        config.option.basetemp = os.path.abspath("basetemp" + rank)
'''


@dataclass
class Shared:
    """A finished launched session, for the tests that assert on it; ``left``: its processes
    that outlived it (each ended once seen); ``left_in_tmp``: what it left in its own TMPDIR."""

    result: suite.Result
    folder: Path
    left: list[str]
    left_in_tmp: list[str]


def launched_session(argv: list[str], where: Path) -> Shared:
    """Run the launcher command ``argv`` in ``where`` (its files written), with a TMPDIR of its own;
    what came of it, and what it left behind."""
    tmp = suite.private_tmp()
    try:
        result = suite.run(argv, where, env=suite.launched_environment(tmp))
    finally:
        left = suite.wait_for_no_leftovers(str(where))
        left_in_tmp = suite.files_left_in(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    return Shared(result, where, left, left_in_tmp)

"""The launchers' command lines on one machine, and launched sessions shared among the tests
that assert different things about the same run.

A launched session costs 8 to 25 s: pytest processes that each import torch (and so does
each one's forkserver), their ranks, the launcher. Each is run once (Sessions, held by a
fixture of module or session scope), and the tests read it. The runs of a session under
torchrun and under mpiexec go one after the other: they are CPU-bound, and two at once took
as long on 2 cores (measured: 23.8 and 27.0 s together, 25.9 and 25.5 s one after the other).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


def torchrun_unavailable() -> str | None:
    return namespaces_unavailable() or (None if Path(TORCHRUN).exists() else "no torchrun beside this Python")


def mpiexec_unavailable() -> str | None:
    return namespaces_unavailable() or (
        None if Path(MPIEXEC).exists() else "no MPICH mpiexec beside this Python (pip install 'pytest-ddp[mpi]')"
    )


# Each launcher: its command line, and why it cannot run here (None: it can).
LAUNCHERS: dict[str, tuple[Callable[..., list[str]], Callable[[], str | None]]] = {
    "torchrun": (torchrun, torchrun_unavailable),
    "mpiexec": (mpiexec, mpiexec_unavailable),
}

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


class Sessions:
    """The same launched session under each launcher, each run the first time a test asks for
    it (``prepare`` writes the session's files into its folder): then the tests that assert on
    one run read it. ``sessions[name]``: that launcher's session, or why it cannot run here."""

    def __init__(
        self, folder: Callable[[str], Path], prepare: Callable[[Path], object], nproc: int, *pytest_args: str
    ) -> None:
        self._folder = folder
        self._prepare = prepare
        self._argv = (nproc, *pytest_args)
        self._runs: dict[str, Shared | str | Exception] = {}

    def __getitem__(self, name: str) -> Shared | str:
        if name not in self._runs:
            command, unavailable = LAUNCHERS[name]
            try:
                self._runs[name] = unavailable() or self._run(name, command)
            except Exception as error:  # a run that timed out, say: not run again for the next test
                self._runs[name] = error
        run = self._runs[name]
        if isinstance(run, Exception):
            raise run
        return run

    def _run(self, name: str, command: Callable[..., list[str]]) -> Shared:
        where, tmp = self._folder(name), suite.private_tmp()
        self._prepare(where)
        try:
            result = suite.run(command(*self._argv), where, env=suite.launched_environment(tmp))
        finally:
            left = suite.wait_for_no_leftovers(str(where))
            left_in_tmp = suite.files_left_in(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
        return Shared(result, where, left, left_in_tmp)


def shared(runs: Sessions, name: str) -> Shared:
    """The session of this name, which no process of it outlived; a skip saying why it could
    not run where it could not."""
    run = runs[name]
    if isinstance(run, str):
        pytest.skip(run)
    assert not run.left, f"left behind: {run.left}"
    return run

"""The launchers' command lines on one machine, and launched sessions started together and
shared among the tests that assert different things about the same run.

A launched session costs 10 to 25 s: four pytest processes that each import torch, their
ranks, the launcher. Each is run once, and the tests that read it assert on that one run
(a fixture of module or session scope). Runs that are alike (the same suite under torchrun
and under mpiexec) start together: a run spends about half of its time waiting (for its
processes, for a hang to be judged, for a stopped rank), so two at once take little more
than one on two cores; no more than two, so that the machine is not oversubscribed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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


class Started:
    """One launched session under way: its processes (a launcher, or one agent per node), each
    one's output in a file of its own (read once all ended: no pipe fills meanwhile), and what
    to do once they ended (``close``: the nodes they ran on go)."""

    def __init__(self, folder: Path, timeout: float = 240, close: Callable[[], object] = lambda: None) -> None:
        self.folder = folder
        self.deadline = time.monotonic() + timeout
        self.processes: list[subprocess.Popen[Any]] = []
        self.outputs: list[IO[str]] = []
        self.close = close

    def output(self) -> IO[str]:
        """A file for one more process's output (its stdout and stderr)."""
        self.outputs.append(tempfile.TemporaryFile("w+", errors="replace"))  # noqa: SIM115 (closed in finish)
        return self.outputs[-1]

    def finish(self) -> list[tuple[int, str]]:
        """Each process's exit status and output, once all have ended; killed at the deadline."""
        try:
            for process in self.processes:
                process.wait(timeout=max(self.deadline - time.monotonic(), 0))
        finally:
            self.kill()
        ended = []
        for process, output in zip(self.processes, self.outputs):
            output.seek(0)
            ended.append((process.returncode, output.read()))
            output.close()
        return ended

    def kill(self) -> None:
        """Whatever still runs (after a failure) goes; then ``close``."""
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)  # each in a session of its own
                except ProcessLookupError:
                    pass
                process.wait()
        close, self.close = self.close, lambda: None
        close()


def start_launcher(argv: list[str], folder: Path, timeout: float = 240) -> Started:
    """``argv`` (a launcher's command line) run in ``folder`` as suite.run runs it, in the background."""
    run = Started(folder, timeout)
    run.processes.append(subprocess.Popen(argv, cwd=folder, env=suite.launched_environment(), stdout=run.output(),
                                          stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
    return run


@dataclass
class Shared:
    """A finished launched session, for the tests that assert on it: the result of its first
    process (the launcher, or node 0's agent), and each process's exit status and output."""

    result: suite.Result
    folder: Path
    ended: list[tuple[int, str]]


def together(started: Mapping[str, Started | str]) -> dict[str, Shared | str]:
    """Wait for sessions started together (a name's value is a skip reason where one could not
    start); then check that none of them left a process behind. The sessions by name (or the
    reason)."""
    done: dict[str, Shared | str] = {}
    runs = [run for run in started.values() if not isinstance(run, str)]
    try:
        for name, run in started.items():
            if isinstance(run, str):
                done[name] = run
                continue
            ended = run.finish()
            done[name] = Shared(suite.collect(run.folder, *ended[0]), run.folder, ended)
    finally:
        for run in runs:
            run.kill()  # after a failure above: the others go too
        left = [line for run in runs for line in suite.wait_for_no_leftovers(str(run.folder))]
    assert not left, f"left behind: {left}"
    return done


def launched_together(
    folder: Callable[[str], Path], prepare: Callable[[Path], object], nproc: int, *pytest_args: str
) -> dict[str, Shared | str]:
    """The same session (``prepare`` writes its files into the folder) under each launcher that
    can run here, started together; by launcher name, the session or why it could not run."""
    started: dict[str, Started | str] = {}
    for name, (command, unavailable) in LAUNCHERS.items():
        if (why := unavailable()) is not None:
            started[name] = why
            continue
        started[name] = start_launcher(command(nproc, *pytest_args), prepared(folder(name), prepare))
    return together(started)


def prepared(folder: Path, prepare: Callable[[Path], object]) -> Path:
    prepare(folder)
    return folder


def shared(runs: Mapping[str, Shared | str], name: str) -> Shared:
    """The session of this name, or a skip saying why it could not run."""
    run = runs[name]
    if isinstance(run, str):
        pytest.skip(run)
    return run

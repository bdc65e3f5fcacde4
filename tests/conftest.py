"""Shared helpers for the plugin's own tests.

Plugin behaviour is tested the way pytest plugins are: ``pytester`` writes a
test file and runs a real inner pytest session, whose ddp tests run on real
rank processes.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

# Imported here, before any in-process inner session: pytester restores
# sys.modules after each run, and torch imported twice in one process crashes.
import torch.distributed  # noqa: F401

HEADER = "import os, sys, time\nimport pytest, torch, torch.distributed as dist\n"


class DdpPytester:
    """Write a test module and run it in an inner pytest session."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester

    def write(self, body: str, name: str = "test_it") -> Path:
        return self.pytester.makepyfile(**{name: HEADER + textwrap.dedent(body)})

    def run(self, body: str, *args: str) -> pytest.RunResult:
        self.write(body)
        return self.pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)

    def run_subprocess(self, body: str, *args: str, timeout: float = 120) -> pytest.RunResult:
        self.write(body)
        return self.pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=timeout)


def line_of(path: Path, text: str) -> int:
    """The 1-based number of the first line of ``path`` that contains ``text``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


@pytest.fixture
def ddp_pytester(pytester: pytest.Pytester) -> DdpPytester:
    return DdpPytester(pytester)


def live_pids(pids: list[int]) -> list[int]:
    """The pids among these that still run (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def rank_processes() -> list[int]:
    """Pids of every pytest-ddp rank process on this machine (named ``ddp-rank<N>``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("ddp-rank"):
            pids.append(int(entry))
    return live_pids(pids)




def ranks_working_in(folder: Path) -> list[int]:
    """Rank processes whose working directory is ``folder`` (those of one inner session)."""
    found = []
    for pid in rank_processes():
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(folder):
                found.append(pid)
        except OSError:
            continue
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.fixture(autouse=True)
def no_rank_left_behind(request: pytest.FixtureRequest):
    """Every test leaves no rank process of its own behind (ranks are children of
    the forkserver, a child of this process), but for this session's own warm groups."""
    yield
    controller = request.config.pluginmanager.get_plugin("ddp_controller")
    own = set(controller.pool.pids()) if controller is not None else set()
    me = os.getpid()
    left = [pid for pid in rank_processes() if _parent(_parent(pid) or 0) == me and pid not in own]
    assert not left, f"rank processes left behind: {left}"

"""Signals to a running launched session (launched/signals.py): Ctrl-C and SIGTERM to a real torchrun
session (one machine, a network namespace) stop it at once, leaving nothing.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import wait_for

from . import suite
from .nodes import TORCHRUN, isolated_node_command
from .runs import torchrun_unavailable

pytestmark = pytest.mark.usefixtures("own_process")


# -- real torchrun sessions ---------------------------------------------------------------

# Rank 0 writes UP once both ranks are inside the test, which then waits for ever.
HANG_WHEN_UP = '''
import os, threading
import pytest, torch.distributed as dist

UP = {up!r}


@pytest.mark.ddp(world_size=2, timeout=3600)
def test_waits(rank):
    dist.barrier()
    if rank == 0:
        open(UP + ".tmp", "w").close()
        os.rename(UP + ".tmp", UP)
    threading.Event().wait()
'''


def _torchrun(folder: Path, *pytest_args: str) -> list[str]:
    """torchrun on 2 processes, its own logs in ``folder`` (else it leaves them in TMPDIR)."""
    command = [TORCHRUN, "--standalone", "--nproc-per-node=2", f"--log-dir={folder / 'torchrun-logs'}",
               "--no-python", sys.executable]  # fmt: skip
    return isolated_node_command([*command, *suite.pytest_command(*pytest_args)])


@dataclasses.dataclass
class Waiting:
    """A torchrun session of waiting_sessions: its launcher, its folder (output.txt holds what it
    printed) and its own TMPDIR."""

    launcher: subprocess.Popen[bytes]
    folder: Path
    tmp: Path


SIGNALLED = ["ctrl-c", "sigterm"]


@pytest.fixture(scope="module")
def waiting_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Waiting]]:
    """A torchrun session per signal of the test below, whose test waits for ever once both ranks
    are in it: all started at once, then waited for until each one's test is up (each mostly waits
    for its imports and its peers). No process of them outlives the module."""
    if (why := torchrun_unavailable()) is not None:
        pytest.skip(why)
    started: dict[str, Waiting] = {}
    try:
        for how in SIGNALLED:
            folder = tmp_path_factory.mktemp(f"signalled-{how}")
            tmp = suite.private_tmp()
            (folder / "test_session.py").write_text(HANG_WHEN_UP.format(up=str(folder / "up")))
            (folder / "conftest.py").write_text(suite.CONFTEST)
            with open(folder / "output.txt", "w") as output:
                launcher = subprocess.Popen(
                    _torchrun(folder), cwd=folder, env=suite.launched_environment(tmp), stdout=output,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            started[how] = Waiting(launcher, folder, tmp)
        for waiting in started.values():  # up: a file the test writes once both ranks are in it
            up, launcher = waiting.folder / "up", waiting.launcher
            wait_for(lambda up=up, launcher=launcher: up.exists() or launcher.poll() is not None,
                     f"{up} or the launcher's end")
            assert launcher.poll() is None, (waiting.folder / "output.txt").read_text()
        yield started
    finally:
        for waiting in started.values():
            if waiting.launcher.poll() is None:
                os.killpg(waiting.launcher.pid, signal.SIGKILL)
                waiting.launcher.wait()
            suite.wait_for_no_leftovers(str(waiting.folder))  # ends what a failed test left
            shutil.rmtree(waiting.tmp, ignore_errors=True)


@pytest.mark.parametrize("how", SIGNALLED)
def test_a_signal_stops_a_launched_session_at_once_leaving_nothing(
    waiting_sessions: dict[str, Waiting], how: str
) -> None:
    """Ctrl-C (SIGINT to torchrun's process group, as a terminal sends it) or SIGTERM to torchrun
    (a batch system's cancel) while a test runs: every launched pytest stops as pytest does on
    Ctrl-C, with status 2; no process and no file is left."""
    waiting = waiting_sessions[how]
    if how == "ctrl-c":
        os.killpg(waiting.launcher.pid, signal.SIGINT)
    else:
        waiting.launcher.send_signal(signal.SIGTERM)
    returncode = waiting.launcher.wait(timeout=120)
    result = suite.collect(waiting.folder, returncode, (waiting.folder / "output.txt").read_text(errors="replace"))
    assert result.codes == {0: 2, 1: 2}, (result.codes, result.output)
    assert "KeyboardInterrupt" in result.output and result.returncode != 0, result.output
    assert suite.wait_for_no_leftovers(str(waiting.folder)) == []
    assert suite.files_left_in(waiting.tmp) == [], result.output

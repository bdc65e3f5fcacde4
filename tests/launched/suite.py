"""The test file every launcher runs, and what must come of it (launched mode, docs/launchers.md).

One file with passing tests, a failing one, a rank that raises before a barrier,
a rank killed, a hang between passing tests, an unmarked test and one that
needs more ranks than were launched, run by a real launcher on 4 processes.
Whatever the launcher, it must give one report (rank 0's), one junitxml, the
hang diagnosed with every rank's stack, the same exit status on every rank,
and no process left behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from pytest_ddp.common import procfs

SUITE = '''
import os, signal
import pytest, torch, torch.distributed as dist


def test_unmarked_runs_once():
    open(f"unmarked.{os.getpid()}", "w").close()


@pytest.mark.ddp(world_size=4)
def test_pass(rank, world_size):
    t = torch.ones(1) * rank
    dist.all_reduce(t)
    assert t.item() == sum(range(world_size))


@pytest.mark.ddp(world_size=2)
def test_fail(rank):
    assert rank == 0, "rank 1 disagrees"


@pytest.mark.ddp(world_size=4)
def test_raise_before_barrier(rank):
    if rank == 1:
        raise ValueError("rank 1 raises")
    dist.barrier()


@pytest.mark.ddp(world_size=4)
def test_hang(rank):
    if rank != 3:
        dist.all_reduce(torch.ones(1))


@pytest.mark.ddp(world_size=4)
def test_rank_killed(rank):
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.ddp(world_size=4)
def test_after_the_hang(rank):
    dist.barrier()


@pytest.mark.ddp(world_size=8)
def test_needs_eight(rank):
    pass
'''

# Each launched pytest writes the status it exits with (pytest returns session.exitstatus
# after unconfigure) to codes/rank<N>; the ranks pytest-ddp forks write nothing.
CONFTEST = '''
import os
from pytest_ddp.rank import context as _rank

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
_session = None


def pytest_sessionstart(session):
    global _session
    _session = session


def pytest_unconfigure(config):
    if _rank.current() is not None or _session is None:
        return
    rank = next(os.environ[name] for name in RANK_VARIABLES if name in os.environ)
    os.makedirs("codes", exist_ok=True)
    with open(os.path.join("codes", ".rank" + rank), "w") as f:  # whole or not at all: a launcher may stop it
        f.write(str(int(_session.exitstatus)))
    os.replace(os.path.join("codes", ".rank" + rank), os.path.join("codes", "rank" + rank))
'''

# Drops the last test on global rank 2: collections that differ.
DIFFERENT_COLLECTION = '''
import os

def pytest_collection_modifyitems(items):
    rank = next((os.environ[n] for n in ("RANK", "SLURM_PROCID", "PMI_RANK") if n in os.environ), None)
    if rank == "2":
        items.pop()
'''

# The module SUITE is written as (junitxml's classname of its tests).
SUITE_MODULE = "test_launched"

OUTCOMES = {
    "test_unmarked_runs_once": "passed",
    "test_pass": "passed",
    "test_fail": "failed",
    "test_raise_before_barrier": "failed",
    "test_hang": "failed",
    "test_rank_killed": "failed",
    "test_after_the_hang": "passed",
    "test_needs_eight": "skipped",
}


def write_suite(folder: Path, conftest_extra: str = "") -> None:
    (folder / f"{SUITE_MODULE}.py").write_text(SUITE)
    (folder / "conftest.py").write_text(CONFTEST + conftest_extra)


def pytest_command(*args: str) -> list[str]:
    """What each launched process runs (after the launcher's own arguments)."""
    return ["-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "--junitxml=report.xml", *args]


def launched_environment(tmp: Path | None = None) -> dict[str, str]:
    """What a launcher runs with: this environment, one thread for torch's ops, nothing of this
    session's (its addopts, its xdist worker), and ``tmp`` (:func:`private_tmp`) as TMPDIR if given."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


@dataclass
class Result:
    returncode: int
    output: str
    codes: dict[int, int]  # each launched pytest's exit status
    outcomes: dict[str, str]  # junitxml: test name in SUITE's file -> passed/failed/skipped


def run(argv: list[str], folder: Path, timeout: float = 240, env: dict[str, str] | None = None) -> Result:
    """Run a launcher command in ``folder``; its output, statuses and junitxml."""
    proc = subprocess.run(
        argv, cwd=folder, env=env or launched_environment(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout, start_new_session=True,
    )
    return collect(folder, proc.returncode, proc.stdout)


# torchrun's failure summary: each worker's real exit status.
TORCHRUN_EXIT = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\n\s*exitcode\s*:\s*(-?\d+)")


def collect(folder: Path, returncode: int, output: str) -> Result:
    """The run's statuses: what each pytest wrote at unconfigure, overridden where torchrun lists a
    worker's exit status, that (a process that its launcher signalled after the session's end
    exits with the session's status at once, before its conftest could write it)."""
    codes = {int(path.name[4:]): int(path.read_text()) for path in (folder / "codes").glob("rank*")}
    codes.update({int(rank): int(code) for rank, code in TORCHRUN_EXIT.findall(output)})
    return Result(returncode, output, codes, junit_outcomes(folder / "report.xml"))


def junit_outcomes(path: Path) -> dict[str, str]:
    """The outcomes of SUITE's tests (SUITE_MODULE; the session may hold other files)."""
    if not path.exists():
        return {}
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("classname") != SUITE_MODULE:
            continue
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcomes[case.get("name", "")] = outcome
    return outcomes


def check_suite(result: Result, folder: Path) -> None:
    """What every launcher must give for SUITE, run with ``-rs`` (see the module's docstring)."""
    out = result.output
    assert result.outcomes == OUTCOMES, out
    # One report: only rank 0's pytest writes to the terminal.
    assert out.count("short test summary info") == 1, out
    assert "ddp: the other ranks' pytest output: rank 1" in out
    assert f"SKIPPED [1] {SUITE_MODULE}.py:" in out and "needs world_size=8; launched by" in out, out
    # The hang: rank 3 named, the others' stacks in the report.
    assert "[ddp deadlock, partial" in out and "rank 3 never called all_reduce #1 (returned from its test)" in out, out
    assert "ranks 0-2: Python stacks when stopped" in out, out
    assert f'{SUITE_MODULE}.py", line' in out.split("ranks 0-2: Python stacks when stopped")[1]
    # The raise and the kill: the rank at fault, not a cascade.
    assert "rank 1 failed (ValueError: rank 1 raises)" in out, out
    assert "rank 2 died (killed by SIGKILL)" in out, out
    # The unmarked test ran once, on rank 0; one junitxml; the same status everywhere.
    assert len(list(folder.glob("unmarked.*"))) == 1
    assert result.codes == dict.fromkeys(range(4), 1), (result.codes, out)
    assert result.returncode != 0


def check_collection_differs(result: Result, nproc: int = 4, stopped: bool = False) -> None:
    """What every launcher must give for SUITE with DIFFERENT_COLLECTION, on ``nproc`` processes;
    ``stopped``: the launcher stops the other workers once one failed (torchrun's agent, on one
    node or two: "Sending process ... closing signal SIGTERM", seen under load), so a rank other
    than 0 may end with -15 before its own status 4."""
    out = result.output
    assert "the ranks collected different tests" in out, out
    assert "rank 2 (on " in out and f"1 not collected here: {SUITE_MODULE}.py::test_needs_eight" in out, out
    ended = {r: -15 if stopped and r != 0 and code == -15 else 4 for r, code in result.codes.items()}
    assert result.codes == ended and sorted(ended) == list(range(nproc)), (result.codes, out)
    assert out.count("the ranks collected different tests") == 1  # rank 0's terminal only


def check_hosts_logged_why(folder: Path, nproc: int) -> None:
    """What each launched rank's pytest (a host) was told by rank 0's when the collections differ
    (SUITE with DIFFERENT_COLLECTION), as its log in basetemp<rank> (runs.OWN_BASETEMP) shows it."""
    for rank in range(1, nproc):
        log = (folder / f"basetemp{rank}" / f"ddp-rank{rank}.log").read_text()
        assert "ddp: the ranks collected different tests" in log and "test_needs_eight" in log, log


def private_tmp() -> Path:
    """A TMPDIR for one launched session alone (short: it holds Unix sockets' paths): what is
    left in it once the session ended is the session's (:func:`files_left_in`)."""
    return Path(tempfile.mkdtemp(prefix="ddp-l-", dir="/tmp"))


def files_left_in(tmp: Path) -> list[str]:
    """What a session left in its own TMPDIR, pytest's own basetemps (it keeps the last three) and
    torchrun's logs (its folder for them, without ``--log-dir``) aside."""
    return sorted(name for name in os.listdir(tmp) if not name.startswith(("pytest-of-", "torchelastic_")))


def leftovers(folder: str) -> list[str]:
    """Live processes of the session run in ``folder``: its command line names the folder
    (launchers, launched pytest) or it works in it (their forkservers and ranks)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        stat = procfs.stat(entry)
        if stat is None:
            continue
        state, name = stat.state, stat.name
        if state != "Z" and (folder in command or cwd == folder or cwd.startswith(folder + "/")):
            found.append(f"{entry} {name}: {command[:200]}")
    return found


def wait_for_no_leftovers(folder: str, timeout: float = 15.0) -> list[str]:
    """The processes still there once they had ``timeout`` seconds to go (launchers reap theirs late)."""
    deadline = time.monotonic() + timeout
    while (left := leftovers(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for line in left:  # leave nothing behind for the next test, whatever this one says
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left

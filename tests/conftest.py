"""Shared helpers for the plugin's own tests.

Plugin behaviour is tested the way pytest plugins are: ``pytester`` writes a
test file and runs a real inner pytest session, whose ddp tests run on real
rank processes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno

# Imported here, as torch below: dropped by pytester after an in-process inner session, they were
# imported again by the next one, whose first rank then started a forkserver of its own (a fresh
# interpreter importing torch and pytest: about 1 s a session). Kept, one forkserver serves every
# in-process session of this process, as it serves every group of one session.
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import multiprocessing.resource_tracker  # noqa: F401
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

# Imported here, before any in-process inner session: pytester restores
# sys.modules after each run, and torch imported twice in one process crashes.
# The plugin imports its modules on first use (nothing until used): imported inside an inner
# session, they would be imported again by the next, and a Fault made from one copy of
# pytest_ddp.faults would not be a Fault to the other. An inner session's controller imports
# torch.distributed._functional_collectives (the recorder hooks them), which registers torch's
# c10d_functional operators: imported again once pytester dropped it (DTensor imports it, and so
# torch.distributed.checkpoint), it fails ("Only a single TORCH_LIBRARY can be used ...").
import torch.distributed
import torch.distributed._functional_collectives  # noqa: F401

import pytest_ddp.api
import pytest_ddp.controller
import pytest_ddp.faults  # noqa: F401
from pytest_ddp.common import procfs

T = TypeVar("T")

# The files that take longest, longest first (each one's seconds in a fresh clone's `make test`,
# 2026-11-29: 42 s down to 10 s): they run before the others. pytest-xdist's --dist loadfile (with
# --no-loadscope-reorder, Makefile) hands files to its workers in collection order; by default it
# hands them out by their number of tests, and a long file of one or two tests (the wheel's,
# SLURM's) came last, keeping one worker busy for 20 to 30 s while the other had nothing left.
LONGEST_FILES = (
    "report/test_report_edges.py", "adopt/test_adopt.py", "launched/test_slurm_launched.py",
    "groups/test_mpi_world_edges.py", "launched/test_two_nodes.py", "groups/test_processes.py",
    "test_controller_edges.py", "groups/test_mpi_group.py", "rank/test_rank_edges.py", "test_failures.py",
    "matrix/test_matrix_fast.py", "record/test_compiled_code.py", "launched/test_launched.py",
    "launched/test_signals.py", "libraries/test_deepspeed.py", "scenarios/test_mpi_halts.py",
    "record/test_mpi_recorder.py", "groups/test_warm_groups.py", "scenarios/test_init_faults.py", "test_wheel.py",
    "config/test_settings.py", "record/test_recorder.py",
)  # fmt: skip


# The files whose tests start no process (no rank, no inner pytest session, no subprocess): pure
# logic, the verdicts and their words, the protocol, the report's text, the layers. `make check` runs
# them alone after the lint (pytest --check), in seconds. A test that starts a process goes elsewhere.
CHECK_FILES = (
    "diagnose/test_watchdog.py", "diagnose/test_majority.py", "common/test_protocol.py",
    "diagnose/test_mpi_watchdog.py", "report/test_timeline.py", "report/test_report_scale.py", "test_layers.py",
    "matrix/test_matrix_verdicts.py", "diagnose/test_code_paths.py", "diagnose/test_rank_tests.py",
    "common/test_ops.py",
    "diagnose/test_init_fault_rules.py", "diagnose/test_left_mid_call.py", "diagnose/test_rank_words.py",
    "diagnose/test_own_lines.py", "diagnose/test_code_ties.py", "record/test_describe.py",
    "report/test_stacks_when_stopped.py", "report/test_sequence_table.py", "report/test_report_files.py",
    "test_field_corpus.py", "report/test_failure.py", "groups/test_group.py",
)  # fmt: skip

TESTS = Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--check", action="store_true", help="only conftest.CHECK_FILES' tests (make check)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under --check, every test file but CHECK_FILES' is left uncollected (not imported)."""
    if not config.getoption("check"):
        return None
    a_test_file = collection_path.name.startswith("test_") and collection_path.suffix == ".py"
    return True if a_test_file and collection_path not in {TESTS / name for name in CHECK_FILES} else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONGEST_FILES' tests first, in that order; the others after them, as collected. A file named in
    LONGEST_FILES or CHECK_FILES that is not there (renamed, deleted) fails the collection."""
    for listed, names in (("LONGEST_FILES", LONGEST_FILES), ("CHECK_FILES", CHECK_FILES)):
        missing = [name for name in names if not (TESTS / name).is_file()]
        assert not missing, f"conftest.{listed} names files that are not there: {missing}"
    rank = {str(TESTS / name): position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(str(item.path), len(LONGEST_FILES)))


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


@dataclass
class Session:
    """An inner pytest session of sessions_together: its files (name -> source, dedented), its
    arguments, what it sets in the environment, and the command it runs under (``setpriv ...``)."""

    files: dict[str, str]
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()

    @classmethod
    def of(cls, body: str, *args: str, **env: str) -> Session:
        """The session of one module, test_it.py: HEADER, then ``body``."""
        return cls({"test_it.py": HEADER + textwrap.dedent(body)}, args, env)


def sessions_together(
    folder: Path, sessions: dict[str, Session], timeout: float = 120, at_once: int | None = None
) -> dict[str, pytest.RunResult]:
    """Inner pytest sessions in subprocesses, as ``pytester.runpytest_subprocess`` runs one, all
    started at once (at most ``at_once`` at a time: each holds a controller, a forkserver and
    its ranks) and then waited for; each runs in ``folder/<its name>`` and has ``timeout``
    seconds once started. Such a session spends much of its time waiting (for its ranks, for a
    stopped rank), so the ones of a file whose tests each assert on one of them run together.
    Their results by name."""

    def run(name: str, session: Session) -> pytest.RunResult:
        cwd = folder / name
        cwd.mkdir(parents=True)
        for file, source in session.files.items():
            (cwd / file).write_text(textwrap.dedent(source))
        env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
        paths = [str(cwd), env.get("PYTHONPATH", "")]
        env.update(HOME=str(cwd), PY_COLORS="0", PYTHONPATH=os.pathsep.join(filter(None, paths)))
        env.update(session.env)
        command = [sys.executable, "-m", "pytest", f"--basetemp={cwd / 'basetemp'}", "-p", "no:cacheprovider"]
        with open(cwd / "stdout", "w") as out, open(cwd / "stderr", "w") as err:
            # On its timeout, subprocess.run kills the session (its ranks die with it) and raises.
            ret = subprocess.run(
                [*session.prefix, *command, *session.args],
                cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, timeout=timeout,
            ).returncode  # fmt: skip
        out_lines, err_lines = ((cwd / stream).read_text().splitlines() for stream in ("stdout", "stderr"))
        return pytest.RunResult(ret, out_lines, err_lines, 0.0)

    with concurrent.futures.ThreadPoolExecutor(at_once or len(sessions) or 1) as pool:
        running = {name: pool.submit(run, name, session) for name, session in sessions.items()}
        return {name: future.result() for name, future in running.items()}


def session_in_process(
    pytester: pytest.Pytester, name: str, session: Session, status: int | None = None
) -> pytest.RunResult:
    """An inner pytest session run in this process (no interpreter, torch or plugin to start:
    about 5 s of CPU fewer than in a subprocess), in ``pytester.path/<name>``; the environment is
    as before after it, what the session set (its ``env``, and what its controller set) undone.
    It must leave no rank process, and end with ``status`` where one is given.
    A session under a ``prefix`` (``setpriv``) needs a process of its own: sessions_together."""
    assert not session.prefix, "a session under a prefix runs in a process of its own"
    folder = pytester.mkdir(name)
    for file, source in session.files.items():
        (folder / file).write_text(textwrap.dedent(source))
    environment, cwd = dict(os.environ), os.getcwd()
    os.environ.update(session.env)
    os.chdir(folder)
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *session.args)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environment)
    assert status is None or result.ret == status, "\n".join(result.outlines[-60:] + result.errlines[-30:])
    assert not ranks_working_in(folder), "the inner session left rank processes behind"
    return result


def outcomes(result: pytest.RunResult, module: str) -> dict[str, str]:
    """The outcome of each test of ``module`` (its name and parameters: ``test_a[1]``), as the
    short summary of a ``-rA`` session says it: the tests of one module of a session of several."""
    summary = [re.match(rf"(PASSED|FAILED|ERROR) {re.escape(module)}::(\S+)", line) for line in result.outlines]
    return {found[2]: found[1] for found in summary if found}


def failure_section(result: pytest.RunResult, title: str) -> pytest.LineMatcher:
    """The lines of the failure (or error) section of ``title`` (``test_x``, ``Class.test``,
    ``ERROR at setup of test_x``) in ``result``'s output: one test's part of a session of several."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if re.fullmatch(rf"_+ {re.escape(title)} _+", line))
    end = next((i for i in range(start + 1, len(lines)) if re.fullmatch(r"(_+ .+ _+|=+ .+ =+)", lines[i])), len(lines))
    return pytest.LineMatcher(lines[start + 1 : end])


# 127.0.0.1 and ::1 as /proc/net/tcp and tcp6 write them.
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}


def listening_addresses(pid: int) -> list[str]:
    """The local addresses (hex, as in /proc/net/tcp) of the TCP sockets ``pid`` listens on.
    Also run inside ranks (test_processes.LOOPBACK_CHECK): it uses nothing but ``os``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(fields[1].split(":")[0])
    return found


def line_of(path: Path, text: str) -> int:
    """The 1-based number of the first line of ``path`` that contains ``text``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


@pytest.fixture(autouse=True, scope="session")
def _not_in_ci() -> Iterator[None]:
    """The sessions a test starts (module fixtures' too) print as on a developer's terminal: where
    $CI or $BUILD_NUMBER is set, pytest writes each failure's message whole in its short summary,
    not cut at the terminal's width, and a test that counts a line would count it twice."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("CI", "BUILD_NUMBER"):
            patch.delenv(name, raising=False)
        yield


@pytest.fixture
def ddp_pytester(pytester: pytest.Pytester) -> DdpPytester:
    return DdpPytester(pytester)


@pytest.fixture
def foreign_address() -> str:
    """An IPv4 address this machine does not have (it cannot be bound here), from the ranges kept
    for documentation (RFC 5737), one of which this machine's own network may use."""
    for address in ("203.0.113.1", "198.51.100.1", "192.0.2.1"):
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError as error:
                if error.errno == errno.EADDRNOTAVAIL:  # as the recorder tells it
                    return address
    pytest.skip("every documentation address can be bound here")


class ModuleShared:
    """What a module's tests share (an inner session run in this process, its result), made by
    the first of them that needs it: such a fixture needs ``pytester``, which is made for each
    test, so it cannot be module-scoped itself. What failed to be made fails every test that
    needs it, and is not made again."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}

    def once(self, name: str, make: Callable[[], T]) -> T:
        if name not in self._made:
            try:
                self._made[name] = make()
            except (Exception, pytest.fail.Exception, pytest.skip.Exception) as error:
                self._made[name] = error  # pytest.fail() and skip() are BaseExceptions
        made = self._made[name]
        if isinstance(made, BaseException):
            raise made
        return cast(T, made)


@pytest.fixture(scope="module")
def module_shared() -> ModuleShared:
    return ModuleShared()


# User nobody's uid and gid: the other local user of the tests that need one (as root).
NOBODY = 65534


def as_nobody(then: Callable[[], object]) -> int:
    """A child that becomes user nobody and runs ``then`` (listen on a socket bound here: the
    kernel's credentials are listen()'s; or connect somewhere), then waits to be killed; its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            then()
            signal.pause()  # until killed
        finally:
            os._exit(0)
    return pid


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    found = procfs.stat(pid)
    return found is not None and found.state != "Z"


def live_pids(pids: list[int]) -> list[int]:
    """The pids among these that still run (zombies count as gone)."""
    return [pid for pid in pids if alive(pid)]


def processes_named(prefix: str) -> dict[int, str]:
    """The processes on this machine whose name (``comm``) starts with ``prefix``: pid -> name."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith(prefix):
            found[int(entry)] = name
    return found


def rank_processes() -> list[int]:
    """Pids of every pytest-ddp rank process on this machine (named ``ddp-rank<N>``)."""
    return live_pids(list(processes_named("ddp-rank")))


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


def parent(pid: int) -> int | None:
    """``pid``'s parent, or None once it is gone."""
    return procfs.parent_of(pid)


# Inside an MPI rank (a test's source, which imports os): its stand-in, the process the launcher
# started for it, named ``ddp-standin<N>``, its command line ending with the world's folder (where the
# rank's stdout is); the launcher is the stand-in's parent.
STAND_IN_OF_AN_MPI_RANK = """
def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

def stand_in_of(rank):
    folder = os.path.dirname(os.path.realpath("/proc/self/fd/1"))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/cmdline") as f:
                last = f.read().split("\\0")[-2]
        except (OSError, IndexError):
            continue
        if name == f"ddp-standin{rank}" and os.path.realpath(last) == folder:
            return int(pid)
    raise LookupError(f"no stand-in of rank {rank} in {folder}")
"""


def stand_ins_under(ancestor: int) -> list[int]:
    """The MPI stand-ins (``ddp-standin<N>``) that descend from ``ancestor``, in rank order."""
    found = {}
    for pid, name in processes_named("ddp-standin").items():
        up = parent(pid)
        while up is not None and up > 1 and up != ancestor:
            up = parent(up)
        if up == ancestor:
            found[int(name.removeprefix("ddp-standin"))] = pid
    return [found[rank] for rank in sorted(found)]


@pytest.fixture(autouse=True)
def no_rank_left_behind(request: pytest.FixtureRequest):
    """Every test leaves no rank process of its own behind (ranks are children of
    the forkserver, a child of this process), but for this session's own warm groups."""
    yield
    controller = request.config.pluginmanager.get_plugin("ddp_controller")
    own = set(controller.pool.pids()) if controller is not None else set()
    me = os.getpid()
    left = [pid for pid in rank_processes() if parent(parent(pid) or 0) == me and pid not in own]
    assert not left, f"rank processes left behind: {left}"


def poll(condition: Callable[[], object], limit: float, interval: float = 0.05) -> bool:
    """Whether ``condition`` came to hold within ``limit`` seconds (asked every ``interval``)."""
    end = time.monotonic() + limit
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(interval)
    return True


def wait_for(condition: Callable[[], object], what: str, limit: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail after ``limit`` seconds."""
    if not poll(condition, limit):
        raise AssertionError(f"gave up waiting for {what}")


def _as_from_a_terminal() -> None:
    for number in (signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


@contextlib.contextmanager
def controllers_started_together(folder: Path, sources: dict[str, str]) -> Iterator[dict[str, Controller]]:
    """A pytest controller per name, each running its test module ``sources[name]`` (as
    ``test_hang.py``, in a folder of its own under ``folder``) whose 2 ranks each write their
    pid to ``$PID_DIR/<rank>.pid``: all started at once, then waited for until every one's
    ranks have (a controller and its ranks mostly wait for their imports and each other: the
    controllers of one parametrization start together, not one after another). By name; no
    controller outlives the block."""
    # A controller killed by SIGKILL cannot remove what multiprocessing put in its TMPDIR
    # (the forkserver's socket): give each one of its own, removed here. Short, for the
    # socket's path.
    tmpdir = tempfile.mkdtemp(prefix="ddp-ctl-")
    started: dict[str, Controller] = {}
    try:
        for name, source in sources.items():
            cwd = folder / name
            pid_dir = cwd / "pids"
            pid_dir.mkdir(parents=True)
            own_tmpdir = Path(tmpdir) / name
            own_tmpdir.mkdir()
            (cwd / "test_hang.py").write_text(source)
            process = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_hang.py"],
                cwd=cwd,
                env=dict(os.environ, PID_DIR=str(pid_dir), TMPDIR=str(own_tmpdir)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # As from a terminal: Ctrl-C interrupts and a closed terminal hangs up (a shell may
                # have handed us SIGINT ignored, and nohup SIGHUP: the controller would keep it so).
                preexec_fn=_as_from_a_terminal,
            )
            started[name] = Controller(process, pid_dir, own_tmpdir)
        for name, controller in started.items():
            wait_for(controller.ranks_started, f"both ranks of {name} to start")
        yield started
    finally:
        for controller in started.values():
            if controller.process.poll() is None:
                controller.process.kill()
                controller.process.wait()
        shutil.rmtree(tmpdir)


@dataclass
class Controller:
    """A controller of controllers_started_together, and where its ranks wrote their pids."""

    process: subprocess.Popen[bytes]
    pid_dir: Path
    tmpdir: Path  # its TMPDIR

    def ranks_started(self) -> bool:
        return len([p for p in self.pid_dir.glob("*.pid") if p.read_text()]) == 2

    def rank_pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.pid_dir.glob("*.pid")]

"""The pytest plugin: the ``ddp`` marker, its options and fixtures, and the controller protocol.

In the controller (the main pytest process, or one xdist worker) a ddp item is
not run: its node id goes to a rank group, and the ranks' reports come back
merged, one per phase, through pytest's ordinary hooks.  Inside a rank the
same plugin only provides the fixtures; :mod:`pytest_ddp.rank.session` runs the items.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_ddp.common.protocol import RunItem
from pytest_ddp.config import settings as settings_module
from pytest_ddp.config.machine import GpuShortage, machine_rank_capacity, rank_gpus
from pytest_ddp.config.settings import (
    DEFAULT_BACKEND,
    DEFAULT_GRACE,
    DEFAULT_MAX_GROUPS,
    DEFAULT_TIMEOUT,
)
from pytest_ddp.config.spec import (
    LAUNCHER_CHOICES,
    RankSpec,
    SpecError,
    parse_mark,
    parse_timeout_mark,
    process_group_timeout,
)
from pytest_ddp.groups.group import SHARED_ROOT_ENV, GroupConfig, fork_context
from pytest_ddp.groups.mpi_group import mpi_unavailable
from pytest_ddp.groups.runner import GroupPool, StartFailure, StoppedGroupFailure, TestRun
from pytest_ddp.launched.host import GATHER_WAIT, HostSession
from pytest_ddp.launched.launch import Launch, LaunchError, detect
from pytest_ddp.launched.world import LaunchedGroup, LaunchedWorld
from pytest_ddp.rank import channel as rank_module
from pytest_ddp.record import compiled
from pytest_ddp.report import rank_warnings
from pytest_ddp.report.failure import sanitize, write_json
from pytest_ddp.report.merge import merged_reports, stopped_group_report

WORLD_SIZE_PARAM = "_ddp_world_size"
# A ddp item's spec, or why it cannot run (reported as its setup error).
spec_key = pytest.StashKey["RankSpec | SpecError"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddp", "distributed tests (pytest-ddp)")
    group.addoption(
        "--ddp-backend",
        default=None,
        help=f"backend of ddp tests whose mark names none: gloo, nccl or mpi (default {DEFAULT_BACKEND})",
    )
    group.addoption(
        "--ddp-mpi-launcher",
        default=None,
        metavar="COMMAND",
        help="the MPI launcher of backend='mpi' tests, before its '-n N', e.g. 'mpirun --oversubscribe' "
        "(default: MPICH's mpiexec.gforker, else mpiexec)",
    )
    group.addoption(
        "--ddp-timeout",
        default=None,
        help=f"seconds a ddp test may run before its ranks are stopped (default {DEFAULT_TIMEOUT:g})",
    )
    group.addoption(
        "--ddp-grace",
        default=None,
        help=f"seconds a failed rank's peers get before they are stopped (default {DEFAULT_GRACE:g})",
    )
    group.addoption(
        "--ddp-isolate", action="store_true", default=False, help="give every ddp test fresh rank processes"
    )
    group.addoption(
        "--ddp-max-groups", default=None, help=f"rank groups kept warm at once (default {DEFAULT_MAX_GROUPS})"
    )
    group.addoption(
        "--ddp-report-dir",
        default=None,
        metavar="DIR",
        help="write a JSON report of each failing ddp test into DIR",
    )
    group.addoption(
        "--ddp-max-world-size",
        default=None,
        metavar="N",
        help="largest world size accepted (default: what this machine's memory and process limit hold)",
    )
    parser.addini("ddp_backend", f"default backend of ddp tests (default {DEFAULT_BACKEND})")
    parser.addini("ddp_timeout", f"default timeout of ddp tests, in seconds (default {DEFAULT_TIMEOUT:g})")
    parser.addini("ddp_grace", f"seconds a failed rank's peers get before they are stopped (default {DEFAULT_GRACE:g})")
    parser.addini("ddp_max_groups", f"rank groups kept warm at once (default {DEFAULT_MAX_GROUPS})")
    parser.addini("ddp_mpi_launcher", "the MPI launcher of backend='mpi' tests (see --ddp-mpi-launcher)")
    group.addoption(
        "--ddp-launcher",
        default=None,
        choices=LAUNCHER_CHOICES,
        help="how this pytest was started: auto (default: torchrun, srun or mpiexec, from their environment), "
        "local (fork every test's ranks here, even under a launcher), or torchrun, slurm, mpi",
    )
    parser.addini("ddp_launcher", "how this pytest was started (see --ddp-launcher)")


@pytest.hookimpl(tryfirst=True)  # before junitxml's: a launched rank other than 0 writes none
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "ddp(world_size, backend=None, timeout=None, init=True, isolated=False, check_collectives=True, "
        "faults=()): "
        "run the test on world_size ranks in a torch.distributed process group",
    )
    if rank_module.current() is not None:
        return
    settings = settings_module.from_config(config)
    launch = _launch(config, settings.launcher)
    if launch is not None and not launch.controller:
        config.pluginmanager.register(HostSession(config, launch), "ddp_host")
    else:
        config.pluginmanager.register(Controller(config, settings, launch), "ddp_controller")


def _launch(config: pytest.Config, launcher: str) -> Launch | None:
    """The launch this pytest is part of (:mod:`pytest_ddp.launched.launch`), or None for an ordinary session."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller's launch, not its own
        return None
    try:
        launch = detect(os.environ, launcher)
    except LaunchError as exc:
        raise pytest.UsageError(f"pytest-ddp: {exc}") from None
    if launch is not None and config.getoption("numprocesses", None):
        raise pytest.UsageError(f"pytest-ddp: {launch.describe()}: pytest-xdist's -n does not combine with it")
    return launch


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A list of world sizes makes one test per size.

    It runs in the ranks too, so that they collect the very same items.  A bad
    mark leaves the test as it is: the controller reports it as that test's
    error, and the file's other tests still run.
    """
    marker = metafunc.definition.get_closest_marker("ddp")
    if marker is None:
        return
    try:
        mark = parse_mark(marker.args, marker.kwargs)
    except SpecError:
        return
    if mark.parametrized:
        # Parametrize on a name the test need not request.
        if WORLD_SIZE_PARAM not in metafunc.fixturenames:
            metafunc.fixturenames.append(WORLD_SIZE_PARAM)
        metafunc.parametrize(
            WORLD_SIZE_PARAM, mark.world_sizes, ids=[f"ws{n}" for n in mark.world_sizes]
        )


class Controller:
    """The controller side: resolves specs, runs ddp items on rank groups, reports."""

    def __init__(self, config: pytest.Config, settings: settings_module.Settings, launch: Launch | None) -> None:
        self.config = config
        self.settings = settings
        self.launch = launch
        self.world: LaunchedWorld | None = None
        self.session: pytest.Session | None = None
        if launch is None:
            self.pool = GroupPool(settings.max_groups)
        else:
            try:
                world = self.world = LaunchedWorld(launch, GATHER_WAIT)
            except LaunchError as exc:
                raise pytest.UsageError(f"pytest-ddp: {exc}") from None
            self.pool = GroupPool(settings.max_groups, lambda group_config: LaunchedGroup(group_config, world))
        self._rank_capacity: tuple[int, str] | None = None
        self.runs: list[TestRun | StartFailure] = []
        self.shared: dict[tuple[int, str, bool], list[pytest.Item]] = {}
        self.position: dict[str, int] = {}
        self._last_item: tuple[str, tuple[str, int | None, str]] = ("", ("", None, ""))  # logged last

    # -- collection -------------------------------------------------------------

    def pytest_report_header(self) -> str | None:
        return None if self.launch is None else f"ddp: {self.launch.describe()}"

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # The ddp items each warm group may serve, in session order, and where each stands.
        self.shared = {}
        self.position = {}
        specs = [(item, spec) for item in session.items if (spec := self.spec(item)) is not None]
        for item, spec in specs:
            if not spec.isolated:
                queue = self.shared.setdefault(spec.group_key, [])
                self.position[item.nodeid] = len(queue)
                queue.append(item)
        if specs:
            self._build_kernels()
        if any(spec.backend != "mpi" for _, spec in specs):  # an MPI launcher starts MPI ranks
            fork_context()  # the forkserver imports torch while pytest gets going
        if self.world is not None:
            difference = self.world.gather([item.nodeid for item in session.items], GATHER_WAIT)
            if difference is not None:
                pytest.exit(f"pytest-ddp: {difference}", returncode=pytest.ExitCode.USAGE_ERROR)

    def _build_kernels(self) -> None:
        """Build the recorder's compiled kernels before any rank starts, where they are not cached
        (seconds, once per torch); where they cannot be built, say why once, and spare the ranks
        from trying again: they record in Python."""
        why = compiled.build()
        if why is None or not compiled.wanted():
            return
        os.environ[compiled.ENV] = "0"
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"pytest-ddp: functional collectives recorded in Python (slower): {why}")

    def spec(self, item: pytest.Item) -> RankSpec | None:
        """The spec of a ddp item that can run; None for an ordinary item or a bad one."""
        resolved = self._resolve(item)
        return resolved if isinstance(resolved, RankSpec) else None

    def _resolve(self, item: pytest.Item) -> RankSpec | SpecError | None:
        """A ddp item's spec, or why it cannot run; None for an ordinary item."""
        if spec_key in item.stash:
            return item.stash[spec_key]
        marker = item.get_closest_marker("ddp")
        if marker is None or not isinstance(item, pytest.Function):
            return None
        try:
            resolved: RankSpec | SpecError = self._spec_of(item, marker)
        except SpecError as exc:
            resolved = SpecError(f"{item.nodeid}: {exc}")
        item.stash[spec_key] = resolved
        return resolved

    def _spec_of(self, item: pytest.Function, marker: pytest.Mark) -> RankSpec:
        try:
            mark = parse_mark(marker.args, marker.kwargs)
        except SpecError as exc:
            raise SpecError(f"@pytest.mark.ddp: {exc}") from None
        timeout_marker = item.get_closest_marker("timeout")
        try:
            timeout_mark = (
                None if timeout_marker is None else parse_timeout_mark(timeout_marker.args, timeout_marker.kwargs)
            )
        except SpecError as exc:
            # pytest-timeout reads the mark again around the test, and a value it
            # cannot read is an INTERNALERROR there: a closer mark without a timeout shields it.
            item.add_marker(pytest.mark.timeout(0), append=False)
            raise SpecError(f"@pytest.mark.timeout: {exc}") from None
        callspec = getattr(item, "callspec", None)
        if callspec is not None and WORLD_SIZE_PARAM in callspec.params:
            world_size = callspec.params[WORLD_SIZE_PARAM]
        else:
            world_size = mark.world_sizes[0]
        self._check_capacity(world_size)
        return self.settings.spec(mark, world_size, timeout_mark)

    def _check_capacity(self, world_size: int) -> None:
        """Refuse a world size this machine cannot hold, before anything is started
        (launched: a test needing more ranks than were launched is skipped, see _unavailable)."""
        if self.launch is not None:
            return
        if self.settings.max_world_size is not None:
            if world_size > self.settings.max_world_size:
                raise SpecError(f"world_size={world_size}: above --ddp-max-world-size={self.settings.max_world_size}")
            return
        if self._rank_capacity is None:
            self._rank_capacity = machine_rank_capacity()
        limit, why = self._rank_capacity
        if world_size > limit:
            raise SpecError(
                f"world_size={world_size}: this machine holds at most {limit} ranks ({why}); "
                f"--ddp-max-world-size=N overrides this check"
            )

    # -- running ----------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        spec = self._resolve(item)
        if spec is None:
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        run = None
        stopped: list[StoppedGroupFailure] = []  # other groups stopped to make room for this test
        if isinstance(spec, SpecError):
            reports = [_setup_error_report(item, str(spec))]
        elif (skip_reason := self._unavailable(spec)) is not None:
            reports = [_skip_report(item, skip_reason)]
        else:
            run = self._run(item, spec, nextitem)
            stopped = run.stopped_groups
            reports, rank_failures = merged_reports(item, run, self.config)
            if self.settings.report_dir and any(r.failed for r in reports):
                write_json(self.settings.report_dir, run, rank_failures)
        # Fixtures this controller set up for ordinary tests before this one.
        item.session._setupstate.teardown_exact(nextitem)
        for report in reports:
            ihook.pytest_runtest_logreport(report=report)
        if isinstance(run, TestRun):
            for warning, nodeid in rank_warnings.merged(run.states):
                kwargs = {"warning_message": warning, "when": "runtest", "nodeid": nodeid, "location": None}
                self.config.hook.pytest_warning_recorded.call_historic(kwargs=kwargs)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        self._report_stopped_groups(stopped)
        if isinstance(run, TestRun):
            _end_session_if_interrupted(run)
        return True

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self._last_item = (nodeid, location)

    def _report_stopped_groups(self, failures: list[StoppedGroupFailure]) -> None:
        """Errors at teardown of groups stopped after their last test was reported: extra
        teardown reports of the item reported last."""
        for failure in failures:
            report = stopped_group_report(failure, self._last_item, self.config)
            self.config.hook.pytest_runtest_logreport(report=report)

    def _run(self, item: pytest.Item, spec: RankSpec, nextitem: pytest.Item | None) -> TestRun | StartFailure:
        later = self._later_items(item, spec)
        # The next item this controller runs, if it runs on this group too.
        follow = self._command(later[0], spec) if later and later[0] is nextitem else None
        run = self.pool.run(
            spec,
            self._command(item, spec),
            make_config=lambda: self._group_config(item, spec, later),
            keep=bool(later),
            follow=follow,
        )
        self.runs.append(run)
        return run

    def _command(self, item: pytest.Item, spec: RankSpec) -> RunItem:
        """What a group's ranks are told to run: the item, and the item after it
        on the same group, whose fixtures they keep."""
        later = self._later_items(item, spec)
        return RunItem(item.nodeid, later[0].nodeid if later else None)

    def _later_items(self, item: pytest.Item, spec: RankSpec) -> list[pytest.Item]:
        """The items after this one that may run on the same warm group, in order."""
        if spec.isolated or item.nodeid not in self.position:
            return []
        return self.shared[spec.group_key][self.position[item.nodeid] + 1 :]

    def _group_config(self, item: pytest.Item, spec: RankSpec, later: list[pytest.Item]) -> GroupConfig:
        items = [item, *later]
        longest = max(self.spec(i).timeout for i in items)  # type: ignore[union-attr]
        return GroupConfig(
            world_size=spec.world_size,
            backend=spec.backend,
            init=spec.init,
            pg_timeout=process_group_timeout(longest),
            pytest_args=settings_module.rank_pytest_args(self.config, items),
            items=[i.nodeid for i in items],
            sys_path=list(sys.path),
            # pytest's own basetemp (tmp_path's root); it has no public accessor.
            workdir_parent=str(self.config._tmp_path_factory.getbasetemp()),  # type: ignore[attr-defined]
            # Launched: each rank's GPU is its LOCAL_RANK's, as the launcher set the node up.
            gpus=rank_gpus(spec.world_size) if spec.backend == "nccl" and self.launch is None else [],
            mpi_launcher=self.settings.mpi_launcher,
        )

    def _unavailable(self, spec: RankSpec) -> str | None:
        """Why this machine cannot run the test (it is skipped saying so): too few GPUs, no MPI,
        too few launched ranks."""
        if self.launch is not None:
            if spec.backend == "mpi":
                return "backend='mpi' tests do not run under a launcher: run them with plain pytest"
            if spec.world_size > self.launch.world_size:
                return f"needs world_size={spec.world_size}; {self.launch.describe()}"
            return None
        if spec.backend == "mpi":
            return mpi_unavailable(self.settings.mpi_launcher)
        return _gpu_shortage(spec)

    # pytest-timeout must not fire in the controller while the ranks run: the
    # ddp timeout includes its value, and the controller reports the hang.
    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        return True if self._resolve(item) is not None else None

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        return True if self._resolve(item) is not None else None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        result = yield
        # Stopped here, not at session finish: their teardown errors still count
        # for the exit status, and an xdist worker still sends them to the controller.
        self._report_stopped_groups(self.pool.close())
        return result

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Groups still warm when the test loop was cut short (-x, an interrupt).
        failures = self.pool.close()
        self._report_stopped_groups(failures)
        if failures and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_unconfigure(self) -> None:
        self.pool.close()
        if self.world is not None:
            # Every other rank's pytest exits with this session's status.
            status = self.session.exitstatus if self.session is not None else pytest.ExitCode.INTERRUPTED
            self.world.end(status)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.world is not None:
            terminalreporter.write_line("ddp: the other ranks' pytest output: " + "; ".join(self.world.logs()))
        if not self.runs:
            return
        costs = [
            run.elapsed + (run.cold_start or 0.0) if isinstance(run, TestRun) else run.elapsed for run in self.runs
        ]
        terminalreporter.write_line(
            f"ddp: {_count(len(self.runs), 'test')} on {_count(self.pool.groups_started, 'rank group')} started; "
            f"median {statistics.median(costs) * 1000:.0f} ms per test"
        )


def _end_session_if_interrupted(run: TestRun) -> None:
    """A rank's test called ``pytest.exit()`` or raised KeyboardInterrupt: end this session
    as plain pytest would, with its reason (the ranks are stopped as the session ends)."""
    for state in run.states:
        if state.interrupted is None:
            continue
        if state.interrupted["kind"] == "KeyboardInterrupt":
            raise KeyboardInterrupt
        pytest.exit(state.interrupted["reason"], returncode=state.interrupted["returncode"])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _gpu_shortage(spec: RankSpec) -> str | None:
    if spec.backend != "nccl":
        return None
    try:
        rank_gpus(spec.world_size)
    except GpuShortage as exc:
        return str(exc)
    return None


def _setup_error_report(item: pytest.Item, message: str) -> pytest.TestReport:
    """An error at the setup of ``item``, with ``message`` and no traceback."""
    call = pytest.CallInfo.from_call(lambda: pytest.fail(message, pytrace=False), "setup")
    return pytest.TestReport.from_item_and_call(item, call)


def _skip_report(item: pytest.Item, reason: str) -> pytest.TestReport:
    path, lineno, _ = item.location
    return pytest.TestReport(
        item.nodeid, item.location, {k: 1 for k in item.keywords}, "skipped",
        (str(path), (lineno or 0) + 1, f"Skipped: {reason}"), "setup",
    )


# -- fixtures (they work inside the ranks) -------------------------------------


def _context(name: str) -> rank_module.RankContext:
    context = rank_module.current()
    if context is None:
        raise pytest.UsageError(f"the {name!r} fixture is only available in tests marked @pytest.mark.ddp")
    return context


@pytest.fixture(scope="session")
def rank() -> int:
    """This rank's number, 0 .. world_size - 1."""
    return _context("rank").rank


@pytest.fixture(scope="session")
def world_size() -> int:
    """The number of ranks running this test."""
    return _context("world_size").world_size


@pytest.fixture(scope="session")
def device() -> Any:
    """``torch.device("cpu")`` on Gloo, ``cuda:<local rank>`` on NCCL."""
    import torch

    return torch.device(_context("device").device)


@pytest.fixture(scope="session")
def process_group() -> Any:
    """The default process group (``init=True`` tests)."""
    _context("process_group")
    import torch.distributed as dist

    if not dist.is_initialized():
        raise pytest.UsageError(
            "process_group: no process group here (init=False test that has not called init_process_group)"
        )
    return dist.group.WORLD


@pytest.fixture(scope="session")
def comm() -> Any:
    """``MPI.COMM_WORLD``, recorded (``backend="mpi"`` tests)."""
    if _context("comm").backend != "mpi":
        raise pytest.UsageError("comm: the MPI world of backend='mpi' tests; this test's backend is not mpi")
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def ddp_shared_path(request: pytest.FixtureRequest) -> Path:
    """A directory for this test, the same path on every rank (checkpoints, files one rank
    writes and another reads); under the controller's basetemp, which pytest rotates."""
    _context("ddp_shared_path")
    root = os.environ.get(SHARED_ROOT_ENV)
    if root is None:
        raise pytest.UsageError("ddp_shared_path: this rank group has no shared directory (a pytest_ddp.run() group)")
    nodeid = request.node.nodeid
    # Every rank derives the same name; the hash keeps node ids that sanitize alike apart.
    name = f"{sanitize(nodeid)[:60]}-{hashlib.sha1(nodeid.encode()).hexdigest()[:8]}"
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    return path

"""The pytest plugin: the ``ddp`` marker, its options and fixtures, and the controller protocol.

In the controller (the main pytest process, or one xdist worker) a ddp item is
not run: its node id goes to a rank group, and the ranks' reports come back
merged, one per phase, through pytest's ordinary hooks.  Inside a rank the
same plugin only provides the fixtures; :mod:`pytest_ddp.rank` runs the items.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

import pytest

from . import rank as rank_module
from .group import GroupConfig, fork_context
from .merge import merged_reports
from .protocol import RunItem
from .report import write_json
from .runner import GroupPool, StartFailure, TestRun
from .spec import (
    DEFAULT_GRACE,
    DEFAULT_TIMEOUT,
    RankSpec,
    SpecError,
    parse_backend,
    parse_mark,
    parse_timeout,
    resolve,
)

WORLD_SIZE_PARAM = "_ddp_world_size"
spec_key = pytest.StashKey[RankSpec]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddp", "distributed tests (pytest-ddp)")
    group.addoption("--ddp-backend", default=None, help="backend of ddp tests whose mark names none: gloo (default) or nccl")
    group.addoption("--ddp-timeout", default=None, help=f"seconds a ddp test may run before its ranks are stopped (default {DEFAULT_TIMEOUT:g})")
    group.addoption("--ddp-grace", default=None, help=f"seconds a failed rank's peers get before they are stopped (default {DEFAULT_GRACE:g})")
    group.addoption("--ddp-isolate", action="store_true", default=False, help="give every ddp test fresh rank processes")
    group.addoption("--ddp-max-groups", type=int, default=None, help="rank groups kept warm at once (default 2)")
    group.addoption("--ddp-report-dir", default=None, metavar="DIR", help="write a JSON report of each failing ddp test into DIR")
    parser.addini("ddp_backend", "default backend of ddp tests", default="gloo")
    parser.addini("ddp_timeout", "default timeout of ddp tests, in seconds", default=str(DEFAULT_TIMEOUT))
    parser.addini("ddp_grace", "seconds a failed rank's peers get before they are stopped", default=str(DEFAULT_GRACE))
    parser.addini("ddp_max_groups", "rank groups kept warm at once", default="2")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "ddp(world_size, backend=None, timeout=None, init=True, isolated=False, check_collectives=True): "
        "run the test on world_size ranks in a torch.distributed process group",
    )
    if rank_module.current() is None:
        controller = Controller(config)
        config.pluginmanager.register(controller, "ddp_controller")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Check the ddp mark; a list of world sizes makes one test per size.

    It runs in the ranks too, so that they collect the very same items.
    """
    marker = metafunc.definition.get_closest_marker("ddp")
    if marker is None:
        return
    try:
        mark = parse_mark(marker.args, marker.kwargs)
    except SpecError as exc:
        raise pytest.Collector.CollectError(
            f"{metafunc.definition.nodeid}: @pytest.mark.ddp: {exc}"
        ) from None
    if mark.parametrized:
        # Parametrize on a name the test need not request.
        if WORLD_SIZE_PARAM not in metafunc.fixturenames:
            metafunc.fixturenames.append(WORLD_SIZE_PARAM)
        metafunc.parametrize(
            WORLD_SIZE_PARAM, mark.world_sizes, ids=[f"ws{n}" for n in mark.world_sizes]
        )


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"--ddp-{name.replace('_', '-')}")
    return value if value is not None else config.getini(f"ddp_{name}")


class Controller:
    """The controller side: resolves specs, runs ddp items on rank groups, reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        try:
            self.backend = parse_backend(_option(config, "backend"), "--ddp-backend")
            self.timeout = parse_timeout(_option(config, "timeout"), "--ddp-timeout")
            self.grace = parse_timeout(_option(config, "grace"), "--ddp-grace")
            max_groups = int(_option(config, "max_groups"))
        except (SpecError, ValueError) as exc:
            raise pytest.UsageError(f"pytest-ddp: {exc}") from None
        self.isolate_all: bool = config.getoption("--ddp-isolate")
        self.report_dir: str | None = config.getoption("--ddp-report-dir")
        self.pool = GroupPool(max_groups)
        self.runs: list[TestRun | StartFailure] = []
        self.shared: dict[tuple[int, str, bool], list[pytest.Item]] = {}
        self.position: dict[str, int] = {}

    # -- collection -------------------------------------------------------------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # The ddp items each warm group may serve, in session order, and where each stands.
        self.shared: dict[tuple[int, str, bool], list[pytest.Item]] = {}
        self.position: dict[str, int] = {}
        for item in session.items:
            spec = self.spec(item)
            if spec is not None and not spec.isolated:
                queue = self.shared.setdefault(spec.group_key, [])
                self.position[item.nodeid] = len(queue)
                queue.append(item)
        if any(self.spec(item) is not None for item in session.items):
            fork_context()  # the forkserver imports torch while pytest gets going

    def spec(self, item: pytest.Item) -> RankSpec | None:
        """The resolved spec of a ddp item, or None for an ordinary one."""
        cached = item.stash.get(spec_key, None)
        if cached is not None:
            return cached
        marker = item.get_closest_marker("ddp")
        if marker is None or not isinstance(item, pytest.Function):
            return None
        mark = parse_mark(marker.args, marker.kwargs)  # checked at collection already
        callspec = getattr(item, "callspec", None)
        parametrized = callspec is not None and WORLD_SIZE_PARAM in callspec.params
        spec = resolve(
            mark,
            callspec.params[WORLD_SIZE_PARAM] if parametrized else mark.world_sizes[0],
            default_backend=self.backend,
            default_timeout=self._default_timeout(),
            timeout_mark=_timeout_mark(item),
            isolate_all=self.isolate_all,
            grace=self.grace,
        )
        item.stash[spec_key] = spec
        return spec

    def _default_timeout(self) -> float:
        """``--ddp-timeout``, lowered to pytest-timeout's global ``--timeout`` if that is smaller."""
        try:
            global_timeout = float(self.config.getoption("timeout", None) or self.config.getini("timeout") or 0)
        except (ValueError, KeyError):
            global_timeout = 0.0
        if global_timeout > 0:
            return min(self.timeout, global_timeout)
        return self.timeout

    # -- running ----------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        spec = self.spec(item)
        if spec is None:
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        skip_reason = _gpu_shortage(spec)
        if skip_reason is not None:
            reports = [_skip_report(item, skip_reason)]
        else:
            run = self._run(item, spec, nextitem)
            reports, rank_failures = merged_reports(item, run, self.config)
            if self.report_dir and any(r.failed for r in reports):
                write_json(self.report_dir, run, rank_failures)
        # Fixtures this controller set up for ordinary tests before this one.
        item.session._setupstate.teardown_exact(nextitem)
        for report in reports:
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

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
        items = [item] + later
        longest = max(self.spec(i).timeout for i in items)  # type: ignore[union-attr]
        return GroupConfig(
            world_size=spec.world_size,
            backend=spec.backend,
            init=spec.init,
            # Above every test's timeout, so that the plugin sees a hang before Gloo does.
            pg_timeout=max(2 * longest + 60, 600),
            pytest_args=rank_pytest_args(self.config, items),
            sys_path=list(sys.path),
            workdir_parent=str(self.config._tmp_path_factory.getbasetemp()),
            gpus=_my_gpus()[: spec.world_size] if spec.backend == "nccl" else [],
        )

    # pytest-timeout must not fire in the controller while the ranks run: the
    # ddp timeout includes its value, and the controller reports the hang.
    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        return True if self.spec(item) is not None else None

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        return True if self.spec(item) is not None else None

    def pytest_sessionfinish(self) -> None:
        self.pool.close()

    def pytest_unconfigure(self) -> None:
        self.pool.close()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.runs:
            return
        costs = [run.elapsed + (run.cold_start or 0.0) if isinstance(run, TestRun) else run.elapsed for run in self.runs]
        terminalreporter.write_line(
            f"ddp: {_count(len(self.runs), 'test')} on {_count(self.pool.groups_started, 'rank group')} started; "
            f"median {statistics.median(costs) * 1000:.0f} ms per test"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _timeout_mark(item: pytest.Item) -> float | None:
    """pytest-timeout's ``@pytest.mark.timeout(N)`` on the item, if any."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None
    value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    if value is None:
        return None
    try:
        return parse_timeout(value, "timeout mark")
    except SpecError:
        return None


def rank_pytest_args(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """The command line of a rank's pytest session: this session's set-up, these items only."""
    # No capture in the ranks: their fds 1 and 2 go to files the controller
    # reads, which keeps a rank's output even when it is killed or crashes.
    args = ["-q", "-p", "no:cacheprovider", "--capture=no", "-o", "addopts=", "--rootdir", str(config.rootpath)]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    for plugin in config.option.plugins or []:
        args += ["-p", plugin]
    for override in config.option.override_ini or []:
        args += ["-o", override]
    for warning in config.known_args_namespace.pythonwarnings or []:
        args += ["-W", warning]
    args += [f"--import-mode={config.option.importmode}", f"--tb={config.option.tbstyle}"]
    if config.option.strict_markers:
        args.append("--strict-markers")
    if config.option.confcutdir:
        args += ["--confcutdir", str(config.option.confcutdir)]
    if config.option.noconftest:
        args.append("--noconftest")
    if config.option.showlocals:
        args.append("--showlocals")
    root = config.rootpath
    for item in items:
        path, _, rest = item.nodeid.partition("::")
        args.append(f"{root / path}::{rest}" if rest else str(root / path))
    return args


def worker_gpus(visible: list[str], worker: str | None, workers: int) -> list[str]:
    """This controller's share of the visible GPUs: all of them, or under xdist a
    disjoint slice per worker (gw0 gets 0, N, 2N, ...), so workers never share a GPU."""
    if worker is None or workers <= 1:
        return visible
    index = int(worker.lstrip("gw") or 0)
    return visible[index::workers]


def _visible_gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g.strip() for g in listed.split(",") if g.strip()] if listed else []
    return ids[: torch.cuda.device_count()] if ids else [str(i) for i in range(torch.cuda.device_count())]


def _my_gpus() -> list[str]:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return worker_gpus(_visible_gpus(), os.environ.get("PYTEST_XDIST_WORKER"), workers)


def _gpu_shortage(spec: RankSpec) -> str | None:
    if spec.backend != "nccl":
        return None
    mine = _my_gpus()
    if len(mine) >= spec.world_size:
        return None
    visible = len(_visible_gpus())
    if len(mine) == visible:
        return f"nccl test needs {spec.world_size} GPUs, {visible} visible"
    return (
        f"nccl test needs {spec.world_size} GPUs, this xdist worker has {len(mine)} "
        f"({visible} visible, shared between {os.environ.get('PYTEST_XDIST_WORKER_COUNT')} workers)"
    )


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

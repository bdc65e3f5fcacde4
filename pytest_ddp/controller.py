"""The controller session: resolves each ddp item's spec, runs it on a rank group, reports.

A ddp item is not run here (the main pytest process, or an xdist worker): its node id goes to a
rank group (:mod:`pytest_ddp.groups`), and the ranks' reports come back merged, one per phase,
through pytest's ordinary hooks (:mod:`pytest_ddp.report`).  Registered by
:mod:`pytest_ddp.plugin`, as pytest-xdist's ``DSession`` is by its plugin.
"""

from __future__ import annotations

import statistics
import warnings
from typing import Any

import pytest

from pytest_ddp.adopt.collect import conflict_key
from pytest_ddp.common.protocol import RunItem
from pytest_ddp.config.settings import Settings, rank_pytest_args
from pytest_ddp.config.spec import WORLD_SIZE_PARAM, RankSpec, SpecError, parse_mark, parse_timeout_mark
from pytest_ddp.groups.admission import Admission, Launched
from pytest_ddp.groups.group import GroupConfig
from pytest_ddp.groups.runner import GroupPool, StartFailure, StoppedGroupFailure, TestRun
from pytest_ddp.groups.spawn import Refusals, fork_context, release_killing_signals
from pytest_ddp.launched.host import GATHER_WAIT
from pytest_ddp.launched.launch import Launch, LaunchError
from pytest_ddp.launched.world import LaunchedGroup, LaunchedWorld
from pytest_ddp.report import rank_warnings
from pytest_ddp.report.merge import merged_reports, stopped_group_report, write_files

# A ddp item's spec, or why it cannot run (reported as its setup error).
spec_key = pytest.StashKey["RankSpec | SpecError"]()


class ForkserverRefusedWarning(pytest.PytestWarning):
    """Another process connected to this session's forkserver, which refused it (forkserver_guard)."""


class Controller:
    """The controller side: resolves specs, runs ddp items on rank groups, reports."""

    def __init__(self, config: pytest.Config, settings: Settings, launch: Launch | None) -> None:
        self.config = config
        self.settings = settings
        self.launch = launch
        self.world: LaunchedWorld | None = None
        self.session: pytest.Session | None = None
        launched = None if launch is None else Launched(launch.world_size, launch.describe())
        self.admission = Admission(settings, launched)
        if launch is None:
            self.pool = GroupPool(settings.max_groups)
        else:
            try:
                world = self.world = LaunchedWorld(launch, GATHER_WAIT)
            except LaunchError as exc:
                raise pytest.UsageError(f"pytest-ddp: {exc}") from None
            self.pool = GroupPool(settings.max_groups, lambda config: LaunchedGroup(config, world))
        self.runs: list[TestRun | StartFailure] = []
        self.refusals: Refusals | None = None  # once the forkserver runs
        self.shared: dict[tuple[int, str, bool], list[pytest.Item]] = {}
        self.position: dict[str, int] = {}
        self._last_item: tuple[str, tuple[str, int | None, str]] = ("", ("", None, ""))  # logged last

    # -- collection -------------------------------------------------------------

    def pytest_report_header(self) -> str | None:
        return None if self.launch is None else f"ddp: {self.launch.describe()}"

    def collected(self, session: pytest.Session) -> None:
        """The session's items are known: plan the warm groups, get the forkserver ready, and under
        a launcher compare the collections."""
        self.session = session
        # The ddp items each warm group may serve, in session order, and where each stands.
        self.shared = {}
        self.position = {}
        specs = [(item, spec) for item in session.items if isinstance(spec := self._resolve(item), RankSpec)]
        for item, spec in specs:
            if not spec.isolated:
                queue = self.shared.setdefault(spec.group_key, [])
                self.position[item.nodeid] = len(queue)
                queue.append(item)
        runs = not session.config.option.collectonly
        if specs and runs:
            fork_context()  # the forkserver imports torch while pytest gets going
            self.refusals = Refusals()
        if self.world is not None:
            difference = self.world.gather([item.nodeid for item in session.items], GATHER_WAIT)
            if difference is not None:
                pytest.exit(f"pytest-ddp: {difference}", returncode=pytest.ExitCode.USAGE_ERROR)

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
            resolved = exc  # its test's id heads its report: the message need not say it
        item.stash[spec_key] = resolved
        return resolved

    def _spec_of(self, item: pytest.Function, marker: pytest.Mark) -> RankSpec:
        if conflict_key in item.stash:  # an adopted class's own mark that contradicts the class
            raise SpecError(item.stash[conflict_key])
        try:
            mark = parse_mark(marker.args, marker.kwargs)
        except SpecError as exc:
            raise SpecError(f"{exc} (in @pytest.mark.ddp)") from None
        timeout_marker = item.get_closest_marker("timeout")
        try:
            timeout_mark = None
            if timeout_marker is not None:
                timeout_mark = parse_timeout_mark(timeout_marker.args, timeout_marker.kwargs)
        except SpecError as exc:
            # pytest-timeout reads the mark again, and a value it cannot read is an INTERNALERROR:
            # a closer mark without a timeout shields it.
            item.add_marker(pytest.mark.timeout(0), append=False)
            raise SpecError(f"{exc} (in @pytest.mark.timeout)") from None
        callspec = getattr(item, "callspec", None)
        if callspec is not None and WORLD_SIZE_PARAM in callspec.params:
            world_size = callspec.params[WORLD_SIZE_PARAM]
        else:
            world_size = mark.world_sizes[0]
        return self.admission.spec(mark, world_size, timeout_mark)

    # -- running ----------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        # A kill sent by this test while the one before was still being reported (it was handed
        # to the warm ranks as that one's follow, the killing signals held): this process dies of
        # it now, within this test, as xdist must see it.
        release_killing_signals()
        spec = self._resolve(item)
        if spec is None:
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        run = None
        stopped: list[StoppedGroupFailure] = []  # other groups stopped to make room for this test
        if isinstance(spec, SpecError):
            reports = [_setup_error_report(item, str(spec))]
        elif (skip_reason := _marked_skip(item) or self.admission.unavailable(spec)) is not None:
            reports = [_skip_report(item, skip_reason)]
        else:
            run = self._run(item, spec, nextitem)
        if run is not None:
            stopped = run.stopped_groups
            reports, built = merged_reports(item, run, self.config)
            if self.settings.report_dir and any(r.failed for r in reports):
                write_files(self.settings.report_dir, run, built, reports)
        # Fixtures this controller set up for ordinary tests before this one.
        item.session._setupstate.teardown_exact(nextitem)
        for report in reports:
            ihook.pytest_runtest_logreport(report=report)
        if isinstance(run, TestRun):
            for warning, nodeid in rank_warnings.merged(run.states):
                self._record_warning(warning, nodeid)
        self._warn_of_refusals(item)
        if self.config.getoption("usepdb", False) and any(report.failed for report in reports):
            self._cannot_debug(reports)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        self._report_stopped_groups(stopped)
        if isinstance(run, TestRun):
            _end_session_if_interrupted(run)
        return True

    def _cannot_debug(self, reports: list[pytest.TestReport]) -> None:
        """--pdb: where pytest would enter the debugger, the failure at once, and why no debugger."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None:
            return
        tw = terminal._tw
        tw.line()
        tw.sep(">", "traceback")
        for report in reports:
            if report.failed:
                report.toterminal(tw)
        tw.sep(">", "pytest-ddp: --pdb cannot enter a rank: ranks run without a terminal")
        tw.line("Each rank's traceback is above; -l adds its locals.")

    def _warn_of_refusals(self, item: pytest.Item) -> None:
        """Connections the forkserver refused while ``item`` ran, as a warning of it."""
        refused = [] if self.refusals is None else self.refusals.new()
        if not refused:
            return
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        text = f"the forkserver refused a connection from {refused[0]}{more}: it forks for this session alone"
        path, lineno, _ = item.location
        message = ForkserverRefusedWarning(text)
        warning = warnings.WarningMessage(message, ForkserverRefusedWarning, path, (lineno or 0) + 1)
        self._record_warning(warning, item.nodeid)

    def _record_warning(self, warning: warnings.WarningMessage, nodeid: str) -> None:
        kwargs = {"warning_message": warning, "when": "runtest", "nodeid": nodeid, "location": None}
        self.config.hook.pytest_warning_recorded.call_historic(kwargs=kwargs)

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
        """What a group's ranks run: the item, and the next on the same group (its fixtures kept)."""
        later = self._later_items(item, spec)
        return RunItem(item.nodeid, later[0].nodeid if later else None)

    def _later_items(self, item: pytest.Item, spec: RankSpec) -> list[pytest.Item]:
        """The items after this one that may run on the same warm group, in order."""
        if spec.isolated or item.nodeid not in self.position:
            return []
        return self.shared[spec.group_key][self.position[item.nodeid] + 1 :]

    def _group_config(self, item: pytest.Item, spec: RankSpec, later: list[pytest.Item]) -> GroupConfig:
        items = [item, *later]
        return self.admission.group_config(
            spec,
            max(self._resolve(i).timeout for i in items),  # type: ignore[union-attr]
            pytest_args=rank_pytest_args(self.config, items),
            items=[i.nodeid for i in items],
            # pytest's own basetemp (tmp_path's root); it has no public accessor.
            workdir_parent=str(self.config._tmp_path_factory.getbasetemp()),  # type: ignore[attr-defined]
        )

    # pytest-timeout must not fire in the controller: the ddp timeout includes its value.
    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        return True if self._resolve(item) is not None else None

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        return True if self._resolve(item) is not None else None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        result = yield
        # Stopped here, not at session finish: their teardown errors still count for the exit
        # status, and an xdist worker still sends them.
        self._report_stopped_groups(self.pool.close())
        return result

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        release_killing_signals()  # held for a follow the session did not run
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
            logs = "; ".join(self.world.logs())
            terminalreporter.write_line(f"ddp: the other ranks' pytest output: {logs}")
        if not self.runs:
            return
        costs = []
        for run in self.runs:
            cold_start = run.cold_start if isinstance(run, TestRun) else None
            costs.append(run.elapsed + (cold_start or 0.0))
        tests, groups = _count(len(self.runs), "test"), _count(self.pool.groups_started, "rank group")
        median = statistics.median(costs) * 1000
        terminalreporter.write_line(f"ddp: {tests} on {groups} started; median {median:.0f} ms per test")


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


def _setup_error_report(item: pytest.Item, message: str) -> pytest.TestReport:
    """An error at the setup of ``item``: ``message``, no traceback (pytest's short summary shows its
    first line after the test's id, not led by pytest.fail's ``Failed:``)."""
    return pytest.TestReport(
        item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed", message, "setup"
    )


def _marked_skip(item: pytest.Item) -> str | None:
    """The reason of a skip the item's own marks make on every rank alike (``skip``, or ``skipif``
    with conditions that are already booleans): no rank group starts for a test that will not run.
    A ``skipif`` with a string condition is left to the ranks, which evaluate it as pytest does."""
    for mark in item.iter_markers(name="skip"):
        return str(mark.kwargs.get("reason", mark.args[0] if mark.args else "unconditional skip"))
    for mark in item.iter_markers(name="skipif"):
        conditions = mark.args if "condition" not in mark.kwargs else (mark.kwargs["condition"],)
        if conditions and all(isinstance(c, bool) for c in conditions) and any(conditions):
            return str(mark.kwargs.get("reason", ""))
    return None


def _skip_report(item: pytest.Item, reason: str) -> pytest.TestReport:
    path, lineno, _ = item.location
    return pytest.TestReport(
        item.nodeid, item.location, {k: 1 for k in item.keywords}, "skipped",
        (str(path), (lineno or 0) + 1, f"Skipped: {reason}"), "setup",
    )

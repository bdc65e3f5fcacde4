"""The pytest plugin of a rank's session: runs the items its controller names.

Like an xdist worker, it takes over the run loop of a session that collected the group's tests,
with ``nextitem`` the group's next item so module and session fixtures live across tests.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import _pytest.config
import pytest

from pytest_ddp import faults
from pytest_ddp.common.protocol import (
    PhaseStart,
    Ready,
    Report,
    RunItem,
    SessionEnd,
    WarningRecorded,
)
from pytest_ddp.rank import default_group, leftovers, restore, thread_errors
from pytest_ddp.rank.channel import Channel, fatal
from pytest_ddp.record import describe

if TYPE_CHECKING:
    from collections.abc import Generator

    from pytest_ddp.common.protocol import RankStart


class RankSession:
    def __init__(self, channel: Channel, restorer: restore.Restorer) -> None:
        self.channel = channel
        self.restorer = restorer  # every teardown goes through it: it ends what a fixture left
        self.collect_errors: list[str] = []
        self.ready = False  # the session reached its run loop and said so
        # Per test: the threads there before it, and those it left.
        self.threads_before: set[threading.Thread] = set()
        self.threads_left: list[dict[str, str]] = []
        self.interrupted: dict[str, Any] | None = None
        self.kept_teardown_error: BaseException | None = None  # see pytest_runtest_protocol

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: Any) -> None:
        self.config = config
        # The rank's stdout is the test's output: keep pytest's own progress out of it.
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            devnull = open(os.devnull, "w")  # noqa: SIM115 - the writer keeps it for the rank's life
            reporter._tw = _pytest.config.create_terminal_writer(config, devnull)

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            shorten_library_frames(item)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collect_errors.append(f"{report.nodeid}: {report.longreprtext}")

    def pytest_internalerror(self, excrepr: Any) -> None:
        # The terminal reporter writes it to /dev/null here (see pytest_configure).
        fatal(self.channel, f"INTERNALERROR\n{excrepr}\n")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: Any) -> bool:
        items = {item.nodeid: item for item in session.items}
        environment = dict(os.environ)  # as the rank was ready: put back before each test
        self.channel.event(Ready(list(items), self.collect_errors), wake=True)
        self.ready = True
        last = None
        for command in self.channel.commands(RunItem):
            if command.store_port is not None:  # the last test ended or made a default group
                default_group.renew(command.store_port)
                environment["MASTER_PORT"] = os.environ["MASTER_PORT"]
            self._run(items, environment, command.id, command.next)
            last = items[command.id]
        if last is not None:  # "stop": tear down what the last item left set up, and say how it went
            call = pytest.CallInfo.from_call(lambda: self.restorer.teardown_exact(last, None), "teardown")
            # pytest's own report, past other plugins' makereport hooks: some (pytest-benchmark)
            # read the torn-down item's funcargs, and raise.
            report = pytest.TestReport.from_item_and_call(last, call)
            hook = self.config.hook
            data = None
            if not report.passed:
                data = hook.pytest_report_to_serializable(config=self.config, report=report)
            self.channel.event(SessionEnd(report.outcome, report.duration, data), wake=True)
        return True

    def _run(
        self,
        items: dict[str, Any],
        environment: dict[str, str],
        nodeid: str,
        next_nodeid: str | None,
    ) -> None:
        restore.environment(environment)
        item = items[nodeid]
        marker = item.get_closest_marker("ddp")  # its faults were checked by the controller
        declared = faults.check_all(marker.kwargs.get("faults", ()), init=False) if marker is not None else ()
        self.channel.start_test(nodeid, declared)
        nextitem = None if next_nodeid is None else items.get(next_nodeid)
        item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        self.channel.test_done(self.threads_left, self.interrupted)

    @pytest.hookimpl(wrapper=True)  # inside the warnings plugin's: what the teardown warns of is the test's
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        # Fixtures kept for a next item this group did not get (xdist sent it elsewhere) go first,
        # outside pytest's runner: what that raises (a fixture's error, the leftover warning under
        # -W error) is this item's setup error, not the session's INTERNALERROR. A thread that raises
        # meanwhile is told, as in a phase: this item's test has begun for the controller.
        with thread_errors.told(self.channel.event):
            call = pytest.CallInfo.from_call(lambda: self.restorer.teardown_exact(item, item), "teardown")
        self.kept_teardown_error = call.excinfo.value if call.excinfo is not None else None
        self.threads_before = set(threading.enumerate())
        self.threads_left, self.interrupted = [], None
        default_group.test_starts()
        return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)  # see _interruptible
    def pytest_runtest_setup(self, item: Any) -> Any:
        self.channel.event(PhaseStart("setup"))
        return (yield from self._interruptible(self.kept_teardown_error))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        self.channel.event(PhaseStart("call"))
        return (yield from self._interruptible())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: Any) -> Any:
        self.channel.event(PhaseStart("teardown"))
        try:
            result = yield from self._interruptible()
        finally:  # the processes it left are ended after (rank/restore.py)
            self.threads_left = leftovers.threads_left(self.threads_before)
        if self.threads_left:
            text = leftovers.threads_left_text(self.threads_left)
            pytest.fail(text, pytrace=False)
        return result

    def _interruptible(self, raised: BaseException | None = None) -> Generator[None, Any, Any]:
        """A phase hook's yield (``raised``, raised in its place): ``pytest.exit()`` or KeyboardInterrupt
        fails the test, and the controller, told in the done event, ends the session as plain pytest
        would.  A thread that raises meanwhile is told.  Before pytest 8.4, pytest's own per-phase
        wrapper replaced ``threading.excepthook`` and passed nothing on, so the phase hooks run inside
        it: its call and teardown wrappers are tryfirst (the outermost), its setup one trylast, as is
        ours, registered after it and so called after it (pytest 8.3: a setup's thread went untold)."""
        try:
            with thread_errors.told(self.channel.event):
                if raised is not None:
                    raise raised
                return (yield)
        except pytest.exit.Exception as exc:
            self.interrupted = {"kind": "exit", "reason": exc.msg, "returncode": exc.returncode}
            pytest.fail(f"pytest.exit: {exc.msg}", pytrace=False)
        except KeyboardInterrupt:
            reason = "KeyboardInterrupt"
            self.interrupted = {"kind": reason, "reason": reason, "returncode": None}
            pytest.fail(reason, pytrace=False)

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str, location: Any) -> None:
        if when == "runtest":  # collection and configuration warnings: the controller has its own
            self.channel.event(WarningRecorded.of(warning_message, nodeid))

    def pytest_runtest_logreport(self, report: Any) -> None:
        data = None
        # A plain pass carries nothing beyond outcome and duration: not serialized (it is costly).
        plain_pass = report.passed and not report.sections and not report.user_properties
        plain_pass = plain_pass and not hasattr(report, "wasxfail")
        if not plain_pass:
            data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.channel.event(Report(report.when, report.outcome, report.duration, data), wake=report.failed)

    # pytest-timeout must never fire inside a rank: the controller owns the timeout.
    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_set_timer(self, item: Any, settings: Any) -> bool:
        return True

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: Any) -> bool:
        return True


def shorten_library_frames(item: Any) -> None:
    """Under ``--tb=auto``, ``item``'s failures show the frames not of the user's code (as a call's
    site tells them: :func:`pytest_ddp.record.describe.users_file`) in one line each, as ``--tb=short``
    does, after pytest's filter: ``auto`` shows the last frame of a failure in full, and inside torch
    a whole torch function, docstring and all, stands between the test's line and the error."""
    original = getattr(item, "_traceback_filter", None)
    if original is None or item.config.getoption("tbstyle", "auto") != "auto":
        return

    def filtered(excinfo: Any) -> Any:
        traceback = original(excinfo)
        if isinstance(excinfo.value, pytest.fail.Exception) and not excinfo.value.pytrace:
            return traceback  # shown as its message alone, which a frame's own style would override
        return type(traceback)(
            entry if describe.users_file(str(entry.path)) else entry.with_repr_style("short")
            for entry in traceback
        )

    item._traceback_filter = filtered


def run_pytest(start: RankStart, channel: Channel) -> int:
    restorer = restore.Restorer()
    session = RankSession(channel, restorer)
    args = [*start.pytest_args, "--basetemp", start.basetemp]
    code = int(pytest.main(args, plugins=[session, restorer]))
    if not session.ready:
        # Ended before running anything (an import failed, a bad option); its terminal output went nowhere.
        errors = "".join(f"\n\n{error}" for error in session.collect_errors)
        fatal(channel, f"its pytest session ended before running any test (exit code {code}){errors}\n")
    return code

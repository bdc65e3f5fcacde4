"""The per-test work of a warm rank made cheaper, with its guarantees kept (issue 28, part 5).

pytest's capture of log records in a rank (rank/log_capture.py): its two handlers stay attached
between phases, silenced, instead of being attached to every non-propagating logger and detached
again at each phase.  What a test sees of its records, and where a record logged between phases
goes, are pytest's own: compared with pytest's ``catching_logs`` on hand-made loggers, and shown
in real ranks with ``caplog`` on torch's loggers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import _pytest.logging
import pytest

from pytest_ddp.rank import log_capture

PYTEST_CATCHING_LOGS = _pytest.logging.catching_logs


class _Kept(logging.Handler):
    """logging's lastResort, recorded: what a record no handler took became."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _phases(catching_logs: Any, prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Four phases as pytest's logging plugin runs them (caplog's handler, then the report's at
    DEBUG), with loggers made, made non-propagating, stripped of their handlers and made to
    propagate again in and between them; what each handler caught per phase, what reached
    lastResort, the handler's level and the root logger's level after each phase."""
    last_resort = _Kept()
    monkeypatch.setattr(logging, "lastResort", last_resort)
    caplog_handler, report_handler = _pytest.logging.LogCaptureHandler(), _pytest.logging.LogCaptureHandler()
    if catching_logs is log_capture.SilencingCatchingLogs:
        monkeypatch.setattr(log_capture, "_silenced", log_capture._Silenced([caplog_handler, report_handler]))
    quiet = logging.getLogger(prefix + "quiet")
    quiet.propagate = False
    late = logging.getLogger(prefix + "late")
    kept = logging.getLogger(prefix + "kept")  # a handler of its own: never lastResort's
    kept.propagate = False
    kept.addHandler(logging.NullHandler())
    turned = logging.getLogger(prefix + "turned")  # the same, until it propagates
    turned.propagate = False
    turned.addHandler(logging.NullHandler())
    seen: dict[str, Any] = {"phases": [], "levels": [], "root": []}

    def phase(work: Any) -> None:
        with catching_logs(caplog_handler, level=None), catching_logs(report_handler, level=logging.DEBUG):
            caplog_handler.reset()
            report_handler.reset()
            work()
            seen["levels"].append(caplog_handler.level)
        seen["root"].append(logging.getLogger().level)
        # The phase's lists, as caplog.get_records() keeps them: a record a handler took after
        # the phase would show in them.
        seen["phases"].append([caplog_handler.records, report_handler.records])

    def setup() -> None:
        quiet.warning("quiet 1")
        kept.warning("kept 1")
        caplog_handler.setLevel(logging.INFO)  # as caplog.set_level does
        quiet.info("quiet info 1")
        quiet.debug("quiet debug 1")

    phase(setup)
    quiet.warning("between 1")  # no handler: lastResort's
    kept.warning("kept between 1")  # its own handler only
    late.propagate = False
    late.warning("late between 1")

    def call() -> None:
        late.warning("late 2")  # non-propagating since before this phase: caught
        quiet.info("quiet info 2")  # the level caplog set holds across phases
        quiet.propagate = turned.propagate = True
        quiet.warning("quiet twice 2")  # attached to it and to the root: caught twice, as by pytest
        made = logging.getLogger(prefix + "made")
        made.propagate = False
        made.warning("made 2")  # made non-propagating within the phase: missed, as by pytest

    phase(call)
    late.handlers.clear()

    def teardown() -> None:
        late.warning("late 3")  # its handlers cleared between phases: attached again
        quiet.warning("quiet 3")  # propagates again: caught once, through the root
        logging.getLogger(prefix + "made").warning("made 3")
        kept.warning("kept 3")
        turned.warning("turned 3")  # propagates now: caught once, through the root
        kept.handlers[:] = [logging.NullHandler()]  # a test configures logging again
        kept.warning("kept reconfigured 3")  # missed for the rest of the phase, as by pytest

    phase(teardown)
    phase(lambda: kept.warning("kept 4"))  # the only change since the last phase: caught again
    logging.getLogger(prefix + "made").warning("made between 3")
    seen["phases"] = [[[r.getMessage() for r in records] for records in phase] for phase in seen["phases"]]
    seen["last_resort"] = last_resort.messages
    seen["left_attached"] = [
        logger.name
        for logger in _all_loggers()
        if {caplog_handler, report_handler} & set(logger.handlers) and logger.name.startswith(prefix)
    ]
    for logger in _all_loggers():  # leave the process's loggers as they were
        for handler in (caplog_handler, report_handler):
            logger.removeHandler(handler)
        if logger.name.startswith(prefix):
            logger.handlers.clear()
            logger.propagate = True
    return seen


def _all_loggers() -> list[logging.Logger]:
    root = logging.getLogger()
    return [root, *(lg for lg in root.manager.loggerDict.values() if isinstance(lg, logging.Logger))]


def test_the_silenced_handlers_catch_what_pytests_own_catching_logs_catches(monkeypatch) -> None:
    pytests = _phases(PYTEST_CATCHING_LOGS, "warm28.pytest.", monkeypatch)
    ours = _phases(log_capture.SilencingCatchingLogs, "warm28.silenced.", monkeypatch)
    assert pytests["left_attached"] == []
    assert ours["left_attached"] == ["warm28.silenced.kept"]  # silenced: it has a handler of its own
    del pytests["left_attached"], ours["left_attached"]
    assert ours == pytests
    # What the comparison rests on: records of each kind were caught, missed and sent to lastResort.
    assert pytests["phases"][1][0] == ["late 2", "quiet info 2", "quiet twice 2", "quiet twice 2"]
    assert pytests["phases"][0][0] == ["quiet 1", "kept 1", "quiet info 1"]
    assert pytests["phases"][2][0] == ["late 3", "quiet 3", "made 3", "kept 3", "turned 3"]
    assert pytests["phases"][3][0] == ["kept 4"]
    assert pytests["last_resort"] == ["between 1", "late between 1", "made 2", "made between 3"]


def test_between_phases_a_handler_is_silenced_where_the_logger_has_one_of_its_own(monkeypatch) -> None:
    handler = _pytest.logging.LogCaptureHandler()
    monkeypatch.setattr(log_capture, "_silenced", log_capture._Silenced([handler]))
    own, bare = logging.getLogger("warm28.own"), logging.getLogger("warm28.bare")
    own.propagate = bare.propagate = False
    own.addHandler(logging.NullHandler())
    try:
        with log_capture.SilencingCatchingLogs(handler, level=None):
            own.warning("in the phase")
            assert handler in bare.handlers
        assert handler in own.handlers and handler.level == log_capture.SILENT  # the next phase finds it there
        assert handler not in bare.handlers  # as by pytest: a record there goes to lastResort
        own.critical("between phases")
        assert [r.getMessage() for r in handler.records] == ["in the phase"]
        handler.setLevel(logging.ERROR)  # set while silent: that level holds in the next phase
        with log_capture.SilencingCatchingLogs(handler, level=None):
            assert handler.level == logging.ERROR
    finally:
        for logger in (own, bare, logging.getLogger()):
            logger.removeHandler(handler)
        own.handlers.clear()
        own.propagate = bare.propagate = True


def _settled_phases(catching_logs: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list[bool]]:
    """Seven phases over loggers of their own (a logger dict of their own) that each have a handler
    of their own, so that nothing is left to attach or detach between phases (settled) until one
    thing changes between two phases, or in one: a logger made to propagate, a logger made, a
    logger's handlers replaced by as many others, a logger's own handler removed in a phase.  What
    each phase caught and what reached lastResort; after each phase, whether ours was settled."""
    monkeypatch.setattr(logging.root.manager, "loggerDict", {})
    last_resort = _Kept()
    monkeypatch.setattr(logging, "lastResort", last_resort)
    caplog_handler, report_handler = _pytest.logging.LogCaptureHandler(), _pytest.logging.LogCaptureHandler()
    silenced = log_capture._Silenced([caplog_handler, report_handler])
    monkeypatch.setattr(log_capture, "_silenced", silenced)
    a, b = logging.getLogger("a"), logging.getLogger("b")
    for logger in (a, b):
        logger.propagate = False
        logger.addHandler(logging.NullHandler())
    own_of_c = logging.NullHandler()
    phases: list[list[str]] = []
    settled: list[bool] = []

    def phase(work: Any) -> None:
        with catching_logs(caplog_handler, level=None), catching_logs(report_handler, level=logging.DEBUG):
            caplog_handler.reset()
            report_handler.reset()
            work()
        phases.append([r.getMessage() for r in caplog_handler.records])
        settled.append(silenced._settled)

    phase(lambda: a.warning("a 1"))
    b.propagate = True
    phase(lambda: b.warning("b 2"))  # through the root alone: detached from b
    c = logging.getLogger("c")
    c.propagate = False
    c.addHandler(own_of_c)
    phase(lambda: c.warning("c 3"))  # made between phases: attached
    a.handlers[:] = [logging.NullHandler() for _ in a.handlers]  # as many handlers, none of them ours
    phase(lambda: a.warning("a 4"))  # attached again
    phase(lambda: (c.removeHandler(own_of_c), c.warning("c 5")))
    c.warning("c between 5")  # no handler of its own left: lastResort's, as in pytest
    phase(lambda: c.warning("c 6"))
    c.addHandler(own_of_c)
    phase(lambda: (c.warning("c 7"), b.warning("b 7")))
    c.warning("c between 7")  # its own handler again: not lastResort's
    for logger in (logging.getLogger(), a, b, c):
        for handler in (caplog_handler, report_handler):
            logger.removeHandler(handler)
    return {"phases": phases, "last_resort": last_resort.messages}, settled


def test_where_nothing_changed_the_silenced_handlers_are_left_as_they_are_and_each_change_is_seen(
    monkeypatch,
) -> None:
    pytests, _ = _settled_phases(PYTEST_CATCHING_LOGS, monkeypatch)
    monkeypatch.undo()
    ours, settled = _settled_phases(log_capture.SilencingCatchingLogs, monkeypatch)
    assert ours == pytests
    assert pytests["phases"] == [["a 1"], ["b 2"], ["c 3"], ["a 4"], ["c 5"], ["c 6"], ["c 7", "b 7"]]
    assert pytests["last_resort"] == ["c between 5"]
    # Each change above came when nothing was left to do between phases (the look's quick path),
    # but the two after c lost its own handler, when its phase ends detach.
    assert settled == [True, True, True, True, False, False, True]


@pytest.fixture
def ranks_session(ddp_pytester) -> Iterator[pytest.RunResult]:
    ddp_pytester.pytester.makeconftest(
        """
        import logging
        from pytest_ddp.rank.context import current

        def pytest_runtest_makereport(item, call):
            if call.when == "call" and current() is not None:  # in a rank, between two phases
                logging.getLogger("torch.distributed.distributed_c10d").warning("between phases")
                if "made.here" in logging.root.manager.loggerDict:  # no handler of its own
                    logging.getLogger("made.here").warning("bare between phases")
        """
    )
    yield ddp_pytester.run(
        """
        import logging
        import _pytest.logging
        from pytest_ddp.rank import log_capture

        C10D = "torch.distributed.distributed_c10d"  # torch's, and it does not propagate

        class Kept(logging.Handler):
            def __init__(self):
                super().__init__(logging.WARNING)
                self.messages = []

            def emit(self, record):
                self.messages.append(record.getMessage())

        @pytest.fixture(scope="module", autouse=True)
        def last_resort():
            saved, logging.lastResort = logging.lastResort, Kept()
            yield logging.lastResort
            logging.lastResort = saved

        def names(records, name):
            return [r.getMessage() for r in records if r.name == name]

        @pytest.fixture
        def logs_in_setup_and_teardown():
            logging.getLogger(C10D).warning("in setup")
            yield
            logging.getLogger(C10D).warning("in teardown")

        @pytest.mark.ddp(world_size=2)
        def test_the_rank_silences_pytests_handlers():
            assert _pytest.logging.catching_logs is log_capture.SilencingCatchingLogs
            # torch's loggers have pytest's loop handlers: nothing to attach or detach between phases
            assert log_capture._silenced._settled

        @pytest.mark.ddp(world_size=2)
        def test_caplog_at_level_on_a_torch_logger(caplog, rank):
            assert not logging.getLogger(C10D).propagate
            with caplog.at_level(logging.INFO, logger=C10D):
                logging.getLogger(C10D).info("info %d", rank)
            logging.getLogger(C10D).info("after at_level")
            assert names(caplog.records, C10D) == [f"info {rank}"]

        @pytest.fixture
        def call_records_at_teardown(caplog):
            yield
            assert names(caplog.get_records("call"), C10D) == ["in call"]  # not the record between phases

        @pytest.mark.ddp(world_size=2)
        def test_each_phase_keeps_its_records(logs_in_setup_and_teardown, call_records_at_teardown, caplog):
            logging.getLogger(C10D).warning("in call")
            assert names(caplog.get_records("setup"), C10D) == ["in setup"]
            assert names(caplog.get_records("call"), C10D) == ["in call"]

        @pytest.mark.ddp(world_size=2)
        def test_a_logger_made_non_propagating_in_a_phase_is_missed_there(caplog):
            made = logging.getLogger("made.here")
            made.propagate = False
            made.warning("same phase")
            assert names(caplog.records, "made.here") == []

        @pytest.mark.ddp(world_size=2)
        def test_and_caught_from_the_next_phase_on(caplog):
            made = logging.getLogger("made.here")
            made.warning("next test")
            assert names(caplog.records, "made.here") == ["next test"]
            assert made.handlers.count(caplog.handler) == 1
            made.handlers.clear()

        @pytest.mark.ddp(world_size=2)
        def test_and_after_its_handlers_were_cleared(caplog, last_resort):
            made = logging.getLogger("made.here")
            made.warning("after clear")
            assert names(caplog.records, "made.here") == ["after clear"]
            # After each of the last two tests' calls: no handler there between phases, as in pytest.
            assert last_resort.messages.count("bare between phases") == 2
            made.propagate = True

        @pytest.mark.ddp(world_size=2)
        def test_and_once_when_it_propagates_again(caplog):
            logging.getLogger("made.here").warning("once")
            assert names(caplog.records, "made.here") == ["once"]

        @pytest.mark.ddp(world_size=2)
        def test_fails_with_a_torch_log(rank):
            logging.getLogger(C10D).warning("torch says %d", rank)
            assert False
        """
    )


def test_caplog_and_the_report_get_a_ranks_records_as_in_pytest(ranks_session) -> None:
    ranks_session.assert_outcomes(passed=7, failed=1)
    ranks_session.stdout.fnmatch_lines(["*Captured log call*", "*torch says 0*"])
    ranks_session.stdout.fnmatch_lines(["*torch says 1*"])
    ranks_session.stdout.fnmatch_lines(["*ddp: 8 tests on 1 rank group started*"])

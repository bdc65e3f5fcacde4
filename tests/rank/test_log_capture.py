"""pytest's capture of log records in a rank: its own logging plugin, as in plain pytest.

caplog and the report get a rank's records, torch's non-propagating loggers included; each phase
keeps its own; a logger made non-propagating in a phase is missed there and caught from the next
phase on; a record logged between phases where a logger has no handler goes to logging's
``lastResort``, as pytest 9.2 gives them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
    ranks_session.assert_outcomes(passed=6, failed=1)
    ranks_session.stdout.fnmatch_lines(["*Captured log call*", "*torch says 0*"])
    ranks_session.stdout.fnmatch_lines(["*torch says 1*"])
    ranks_session.stdout.fnmatch_lines(["*ddp: 7 tests on 1 rank group started*"])


INI_OPTIONS = """
[pytest]
log_level = INFO
log_cli = true
log_cli_level = INFO
filterwarnings =
    error
    ignore::DeprecationWarning
"""

# A user's logging config: a logger of its own that does not propagate, with a handler of its own.
USERS_LOGGING = """
import logging


class Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def pytest_configure(config):
    own = logging.getLogger("user.own")
    own.setLevel(logging.DEBUG)
    own.propagate = False
    own.addHandler(Kept())
"""


def test_the_ini_logging_and_warning_options_and_a_users_logging_config_hold_in_a_rank(ddp_pytester) -> None:
    ddp_pytester.pytester.makeini(INI_OPTIONS)
    ddp_pytester.pytester.makeconftest(USERS_LOGGING)
    result = ddp_pytester.run(
        """
        import logging
        import warnings

        def names(records, name):
            return [r.getMessage() for r in records if r.name == name]

        @pytest.mark.ddp(world_size=2)
        def test_log_level_reaches_caplog(caplog, rank):
            logging.getLogger("user").info("info %d", rank)  # INFO: below the root logger's own level
            assert names(caplog.records, "user") == [f"info {rank}"]

        @pytest.mark.ddp(world_size=2)
        def test_the_users_handler_gets_its_records(caplog, rank):
            own = logging.getLogger("user.own")
            own.debug("own %d", rank)
            assert own.handlers[0].messages == [f"own {rank}"]
            assert names(caplog.records, "user.own") == []  # DEBUG: below log_level

        @pytest.mark.ddp(world_size=2)
        def test_a_filter_makes_a_warning_an_error():
            warnings.warn("boom", UserWarning)

        @pytest.mark.ddp(world_size=2)
        def test_a_filter_ignores_a_warning():
            warnings.warn("old", DeprecationWarning)

        @pytest.mark.ddp(world_size=2)
        def test_fails_with_an_info_record(rank):
            logging.getLogger("user").info("shown %d", rank)
            assert False
        """
    )
    result.assert_outcomes(passed=3, failed=2, warnings=0)
    result.stdout.fnmatch_lines(["UserWarning: boom (ranks 0, 1). [[]ddp failed]"])
    result.stdout.fnmatch_lines(
        ["*Captured log call (rank 0)*", "INFO * shown 0", "*Captured log call (rank 1)*", "INFO * shown 1"]
    )

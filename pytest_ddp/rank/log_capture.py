"""pytest's capture of a test's log records in a rank, without its cost per phase.

Around each phase of a test (setup, call, teardown) pytest's logging plugin enters
``catching_logs`` for its two capture handlers, caplog's and the report's.  Since pytest 9.1
(pytest-dev/pytest#14375) that attaches each handler to the root logger and to every logger that
does not propagate (43 once torch.distributed is imported), and detaches it when the phase ends:
88 locked ``addHandler`` and ``removeHandler`` calls per handler and phase, the largest share of a
warm test's CPU in a rank after the test itself.

Here the two handlers stay attached between phases, silenced (a level no record reaches), on each
logger that has a handler of its own: in a rank, every logger there was when its run loop began,
which pytest's live-log and log-file handlers stay attached to for the loop.  They are detached
when the phase ends, as by pytest, from a logger that has no other handler: a record logged there
between phases must find no handler, so that logging's ``lastResort`` writes it to stderr
(``Logger.callHandlers`` counts every handler, whatever its level).  At each phase the loggers are
looked at again, as pytest does, and the handlers attached to or detached from the ones that
changed: a logger made or made non-propagating since, one that propagates again, one whose
handlers a test removed.  So each phase's records, the levels, and where a record logged between
phases goes are what pytest's own ``catching_logs`` gives; other handlers (live logging, the log
file, subtests') go through pytest's own.

That look is cheap where nothing changed, as in a warm rank between trivial tests: the manager's
loggers, which of them propagate, and the attached loggers' handlers are compared with what they were
when this module last left them, list against list in C (15 us a phase in one process with torch's
loggers, against 33 us for the walk that decided the same in Python); only a change walks them.
"""

from __future__ import annotations

import itertools
import logging
import operator
import sys
from types import TracebackType
from typing import Any

import _pytest.logging
import pytest

# The pytest whose catching_logs this one replicates, as read in its source (root and the
# non-propagating loggers, looked up at each phase); another keeps its own.
PYTEST_VERSION = (9, 2)
# A handler level no record reaches: the handler handles nothing (Logger.callHandlers still counts it).
SILENT = sys.maxsize


class _Silenced:
    """The handlers left attached between phases: the loggers they are attached to, and each
    one's own level while it is silent."""

    def __init__(self, handlers: list[logging.Handler]) -> None:
        self.handlers = handlers
        self.levels = {handler: handler.level for handler in handlers}
        self.loggers: list[logging.Logger] = []
        self.active: set[logging.Handler] = set()  # in a phase now
        # What the loggers were at the last look, to tell at the next whether anything changed: the
        # manager's loggers (and the Logger objects among them), which of those did not propagate,
        # and each attached logger's handlers after this module last changed them.
        self._values: list[object] = []
        self._all: list[logging.Logger] = []
        self._quiet: list[bool] = []
        self._seen: list[tuple[logging.Handler, ...]] = []
        # At that time both handlers were on every logger of self.loggers, each with one of its
        # own: a phase has nothing to attach, and its end nothing to detach, while nothing changed.
        self._settled = False

    def enter(self, handler: logging.Handler, root: logging.Logger) -> None:
        if not self.active:  # the phase's first handler; nothing runs between it and the second
            with logging._lock:  # type: ignore[attr-defined]  # getLogger's: no logger is made meanwhile
                self._attach(root)
        self.active.add(handler)
        if handler.level == SILENT:  # else its level was set while it was silent: that one holds
            handler.level = self.levels[handler]

    def _attach(self, root: logging.Logger) -> None:
        """Attached to the root logger and the non-propagating loggers there are now, to no
        other: pytest 9.2's choice when a phase starts."""
        values: list[object] = list(root.manager.loggerDict.values())
        made = not _same(values, self._values)  # a logger made, or the manager's dict changed
        if made:
            self._values = values
            self._all = [logger for logger in values if isinstance(logger, logging.Logger) and logger is not root]
        quiet = list(map(operator.not_, map(_PROPAGATE, self._all)))
        if not made and self._settled and quiet == self._quiet and self.loggers[0] is root and self._unchanged():
            return  # the common case, found in C: the same loggers, propagating as before, same handlers
        self._quiet = quiet
        loggers = [root, *itertools.compress(self._all, quiet)]
        handlers = self.handlers
        for logger in self.loggers:
            if logger not in loggers:  # it propagates again
                for handler in handlers:
                    logger.removeHandler(handler)
        for logger in loggers:
            for handler in handlers:
                if handler not in logger.handlers:
                    logger.addHandler(handler)
        self.loggers = loggers
        self._remember()

    def exit(self, handler: logging.Handler) -> None:
        self.active.discard(handler)
        if handler.level != SILENT:
            self.levels[handler] = handler.level
            handler.level = SILENT
        if self.active:
            return
        handlers = self.handlers
        with logging._lock:  # type: ignore[attr-defined]
            if self._settled and self._unchanged():
                return  # every logger still has a handler of its own: nothing to detach
            for logger in self.loggers:
                if all(h in handlers for h in logger.handlers):  # none of its own: lastResort's between phases
                    for h in handlers:
                        logger.removeHandler(h)
            self._remember()

    def _remember(self) -> None:
        """The attached loggers' handlers now, as this module leaves them; whether that is settled."""
        self._seen = list(map(tuple, map(_HANDLERS, self.loggers)))
        handlers = self.handlers
        self._settled = all(
            all(h in attached for h in handlers) and any(h not in handlers for h in attached) for attached in self._seen
        )

    def _unchanged(self) -> bool:
        """Whether the attached loggers hold the handlers :meth:`_remember` saw, in order (compared
        as logging's ``addHandler`` compares them, identity first)."""
        return list(map(tuple, map(_HANDLERS, self.loggers))) == self._seen


_PROPAGATE = operator.attrgetter("propagate")
_HANDLERS = operator.attrgetter("handlers")


def _same(now: list[Any], before: list[Any]) -> bool:
    """The same objects in the same order (identity, not ``==``), compared in C."""
    return len(now) == len(before) and all(map(operator.is_, now, before))


_silenced: _Silenced | None = None


class SilencingCatchingLogs(_pytest.logging.catching_logs):
    """pytest's ``catching_logs``, which leaves the handlers :func:`install` names attached and
    silenced when it exits; any other handler as pytest does."""

    __slots__ = ()

    def __enter__(self) -> Any:
        silenced = _silenced
        if silenced is None or self.handler not in silenced.levels:
            return super().__enter__()
        root = logging.getLogger()
        silenced.enter(self.handler, root)
        if self.level is not None:
            self.handler.setLevel(self.level)
            self.orig_level = root.level
            root.setLevel(min(self.orig_level, self.level))
        return self.handler

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        silenced = _silenced
        if silenced is None or self.handler not in silenced.levels:
            return super().__exit__(exc_type, exc_val, exc_tb)
        if self.level is not None:
            logging.getLogger().setLevel(self.orig_level)
        silenced.exit(self.handler)
        return None


def install(config: pytest.Config) -> bool:
    """In a rank's session: pytest's logging plugin captures each phase's records through
    :class:`SilencingCatchingLogs`.  False where it keeps its own (no logging plugin, another pytest)."""
    plugin = config.pluginmanager.get_plugin("logging-plugin")
    if plugin is None or tuple(pytest.version_tuple[:2]) != PYTEST_VERSION:
        return False
    global _silenced
    _silenced = _Silenced([plugin.caplog_handler, plugin.report_handler])
    # The plugin's phases look catching_logs up in their module when they run.
    _pytest.logging.catching_logs = SilencingCatchingLogs  # type: ignore[misc]
    return True

"""The loggers as a process torch's harness spawns has them, while a rank runs what that process runs.

pytest's logging plugin (9.1 on) also puts its handlers on every logger that does not propagate:
torch's ``test_get_or_create_logger`` asserts ``c10d``'s holds only its own.  The root logger keeps
them, so the test's log still reaches the rank's report.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def as_in_a_spawned_process() -> Iterator[None]:
    """Each non-propagating logger without the root logger's handlers, until the block ends."""
    root = logging.getLogger()
    shared = list(root.handlers)
    taken: list[tuple[logging.Logger, list[logging.Handler]]] = []
    for logger in list(root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and not logger.propagate:
            handlers = [handler for handler in logger.handlers if handler in shared]
            for handler in handlers:
                logger.removeHandler(handler)
            if handlers:
                taken.append((logger, handlers))
    try:
        yield
    finally:
        for logger, handlers in taken:
            for handler in handlers:
                logger.addHandler(handler)

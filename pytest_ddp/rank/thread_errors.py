"""A thread that raises out of its function during a test, told to the controller as it happens.

A loader's worker thread that dies leaves the test waiting for a batch that never comes
(infinibatch#17): by the timeout, its traceback has long gone to the rank's stderr, and pytest's
own hook (``threadexception``, a warning at the end of the phase) never runs in a test that never
ends.  Runs in the rank, around each test phase; the hook it wraps still runs.
"""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from pytest_ddp.common.protocol import ThreadRaised
from pytest_ddp.record import describe


@contextmanager
def told(tell: Callable[[ThreadRaised], None]) -> Iterator[None]:
    """While it is entered, each thread that raises (but SystemExit, which threading ignores) is
    told with the user's innermost line in its traceback, as a call's site names it."""
    wrapped = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            name = args.thread.name if args.thread is not None else "?"
            error = traceback.format_exception_only(args.exc_type, args.exc_value)[-1].strip()
            tell(ThreadRaised(name, error, _user_line(args.exc_traceback)))
        wrapped(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        if threading.excepthook is hook:  # else the test set its own: left as it is
            threading.excepthook = wrapped


def _user_line(tb: TracebackType | None) -> str | None:
    """``tests/test_x.py:12``: the innermost frame of ``tb`` in the user's code
    (:func:`pytest_ddp.record.describe.users_file`)."""
    found = None
    for frame, line in traceback.walk_tb(tb):
        shown = describe.users_file(frame.f_code.co_filename)
        if shown is not None:
            file = json.loads('"' + shown + '"')  # shown JSON-escaped, as a site is written
            found = f"{file}:{line}"
    return found

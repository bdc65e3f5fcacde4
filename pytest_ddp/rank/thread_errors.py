"""A thread that raises out of its function during a test, told to the controller as it happens.

A loader's worker thread that dies leaves the test waiting for a batch that never comes
(infinibatch#17): by the timeout, its traceback has long gone to the rank's stderr, and pytest's
own hook (``threadexception``, a warning at the end of the phase) never runs in a test that never
ends.  Runs in the rank, around each test; the hook it wraps still runs.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from pytest_ddp.common.protocol import ThreadRaised

_PLUGIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@contextmanager
def told(tell: Callable[[ThreadRaised], None], is_library: Callable[[str], bool]) -> Iterator[None]:
    """While it is entered, each thread that raises (but SystemExit, which threading ignores) is
    told with the user's innermost line in its traceback (outside libraries, ``is_library``)."""
    wrapped = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            name = args.thread.name if args.thread is not None else "?"
            error = traceback.format_exception_only(args.exc_type, args.exc_value)[-1].strip()
            tell(ThreadRaised(name, error, _user_line(args.exc_traceback, is_library)))
        wrapped(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        if threading.excepthook is hook:  # else the test set its own: left as it is
            threading.excepthook = wrapped


def _user_line(tb: TracebackType | None, is_library: Callable[[str], bool]) -> str | None:
    """``tests/test_x.py:12``: the innermost frame of ``tb`` outside libraries and this plugin."""
    found = None
    for frame in traceback.extract_tb(tb):
        if not is_library(frame.filename) and not frame.filename.startswith(_PLUGIN):
            found = f"{_shown(frame.filename)}:{frame.lineno}"
    return found


def _shown(filename: str) -> str:
    """A file as call sites show it: relative to the working folder where it is under it."""
    relative = os.path.relpath(filename) if os.path.isabs(filename) else filename
    return filename if relative.startswith("..") else relative

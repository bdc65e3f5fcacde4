"""A rank's failure shows library frames in one line each, as ``--tb=short`` does.

pytest's default ``--tb=auto`` shows the last frame of a failure in full: when it is inside torch,
a whole torch function, docstring and all, stands between the test's line and the error.
"""

from __future__ import annotations

import sysconfig
from typing import Any

# Where installed packages and the standard library live (the venv's and the base Python's).
_LIBRARY_KEYS = ("purelib", "platlib", "stdlib", "platstdlib")
LIBRARY_ROOTS = tuple(sorted({path for key in _LIBRARY_KEYS if (path := sysconfig.get_paths().get(key))}))


def shorten_library_frames(item: Any) -> None:
    """Under ``--tb=auto``, ``item``'s failures show library frames short, after pytest's filter."""
    original = getattr(item, "_traceback_filter", None)
    if original is None or item.config.getoption("tbstyle", "auto") != "auto":
        return

    def filtered(excinfo: Any) -> Any:
        traceback = original(excinfo)
        return type(traceback)(
            entry.with_repr_style("short") if is_library(str(entry.path)) else entry for entry in traceback
        )

    item._traceback_filter = filtered


def is_library(path: str) -> bool:
    return path.startswith(LIBRARY_ROOTS)

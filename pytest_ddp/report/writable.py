"""What a report may write: text that UTF-8 can encode, and one file name per test.

A rank's text may hold lone surrogates (Python's ``surrogateescape`` decoding of non-UTF-8 names
and bytes), which UTF-8 cannot encode: writing them to a file or pytest-xdist's channel raises.
:func:`printable` writes each as its escape, as Python's own stderr does.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

NAME_PREFIX = 80  # characters of the readable part of a file name
NAME_HASH = 12  # hex digits of the node id's hash: node ids that read alike stay apart


def printable(text: str) -> str:
    """``text`` with each character UTF-8 cannot encode (a lone surrogate) written as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def printable_data(value: Any) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with every string in it, keys included,
    :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_data(key): printable_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_data(item) for item in value]
    return value


def file_name(nodeid: str) -> str:
    """A file name for a node id: its characters outside ``[A-Za-z0-9_.-]`` as ``_``, cut at
    ``NAME_PREFIX``, then a hash of the whole node id (stable across processes and runs)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_.-")[:NAME_PREFIX].rstrip("_.-")
    digest = hashlib.sha1(nodeid.encode("utf-8", "surrogatepass")).hexdigest()[:NAME_HASH]
    return f"{readable}-{digest}" if readable else digest

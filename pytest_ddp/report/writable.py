"""What a report may write: text that UTF-8 can encode, one file name per test, and how a file is
written: never through a link.

A rank's text may hold lone surrogates (Python's ``surrogateescape`` decoding of non-UTF-8 names
and bytes), which UTF-8 cannot encode: writing them to a file or pytest-xdist's channel raises.
:func:`printable` writes each as its escape, as Python's own stderr does.

A report's names are predictable, so a link planted under one (where another user can write)
would have a session write over the file it points to, or into another folder: a file is written
to a new file of its own (``O_EXCL``, ``O_NOFOLLOW``) and renamed in place of what had its name,
and a folder is opened without following a link, and only if it is this user's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NAME_PREFIX = 80  # characters of the readable part of a file name
NAME_HASH = 12  # hex digits of the node id's hash: node ids that read alike stay apart
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # a file that was not there


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


@contextlib.contextmanager
def folder(path: str | Path, parent: int | None = None) -> Iterator[int]:
    """A descriptor of the folder ``path`` (its parents made if need be), or of ``parent``'s
    sub-folder ``path`` (made if need be, never a link); either one this user's, else OSError."""
    if parent is None:
        os.makedirs(path, exist_ok=True)  # the folder the user named, a link to one included
    else:
        try:
            os.mkdir(path, dir_fd=parent)  # mkdir makes no folder where a link points
        except FileExistsError:
            pass
    follow = 0 if parent is None else os.O_NOFOLLOW
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | follow, dir_fd=parent)
    except OSError as exc:  # O_NOFOLLOW's ELOOP, or ENOTDIR where O_DIRECTORY is checked first
        if parent is not None and stat.S_ISLNK(os.stat(path, dir_fd=parent, follow_symlinks=False).st_mode):
            raise OSError(exc.errno, f"{path} is a link: a report is never written through one") from None
        raise
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise PermissionError(errno.EPERM, f"{path} is user {owner}'s folder, not this user's")
        yield fd
    finally:
        os.close(fd)


def write_file(parent: int, name: str, data: bytes) -> None:
    """``data`` as the file ``name`` in the folder ``parent`` (a descriptor), in place of what had
    that name (a link replaced, never followed): no reader sees half of it."""
    partial = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(partial, NEW_FILE, 0o666, dir_fd=parent)  # the umask applies, as to any file written
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(partial, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        try:
            os.unlink(partial, dir_fd=parent)
        except FileNotFoundError:
            pass
        raise

"""A secret in a file, private to this user, for the handshakes of :mod:`pytest_ddp.common.handshake`.

- Its folder is made mode 0700, or, when there already, must be a folder (not a link to one) of
  this user's that no other user may enter.
- It is written whole: into a new file (``O_EXCL``, ``O_NOFOLLOW``: never one that was there, nor
  a link), mode 0600, then renamed to its name, so a reader never sees half of it.
- It is read through a descriptor opened without following a link, and only if what that
  descriptor holds is a regular file of this user's that no other user may read or write.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

SECRET_BYTES = 32  # random bytes of a secret, written as hex
MAX_SECRET = 1024  # bytes read of a secret file: ours are 64


class NotPrivate(Exception):
    """A folder or a secret's file that another user could have made, or could read."""


def _check_private(path: Path, info: os.stat_result, kind: Callable[[int], bool]) -> None:
    if not kind(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        modes = "mode 0700 for a folder, 0600 for a file"
        raise NotPrivate(f"{path} is not private to this user (uid {os.geteuid()}, {modes})")


def private_folder(folder: Path) -> None:
    """Make ``folder`` (mode 0700), or check that the one there is private (else NotPrivate)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(folder, os.lstat(folder), stat.S_ISDIR)


def is_private_folder(folder: Path) -> bool:
    """Whether ``folder`` is there, a folder (not a link to one) of this user's that no other may enter."""
    try:
        _check_private(folder, os.lstat(folder), stat.S_ISDIR)
    except (OSError, NotPrivate):
        return False
    return True


def write_private(path: Path, data: bytes) -> None:
    """``data`` written whole to ``path`` (mode 0600), in its private folder, in place of any file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(partial, path)


def write_secret(path: Path) -> bytes:
    """A new random secret, written whole to ``path`` (:func:`write_private`)."""
    secret = secrets.token_hex(SECRET_BYTES).encode()
    write_private(path, secret)
    return secret


def read_secret(path: Path) -> bytes:
    """The secret in ``path``; OSError if it cannot be opened, NotPrivate if it is not private."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        _check_private(path, os.fstat(fd), stat.S_ISREG)
        return os.read(fd, MAX_SECRET)
    finally:
        os.close(fd)

"""The launched session's secret: held by every launched pytest process of one job, and by no other process.

Every connection between them proves, both ways, that its end holds it
(:mod:`pytest_ddp.launched.link`).  No launcher gives its processes anything an
outsider cannot know (docs/design.md, "Under a launcher"), so it comes from:

- ``PYTEST_DDP_SECRET``, when the user sets it in the job's environment (the
  launcher carries it to every process, as it carries the rest of it);
- otherwise a random one that global rank 0's pytest writes, before it listens,
  into a file (mode 0600) in a folder private to the user (0700), named after
  the job; the others read it once they have reached rank 0's pytest.  On one
  node that folder is in the machine's temporary directory, where rank 0's
  Unix socket is too; across nodes it is ``$XDG_CACHE_HOME/pytest-ddp/launched``
  (``~/.cache``), which every node sees where the home directory is shared.

Rank 0's pytest removes its files once every rank has joined (or its wait is over).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_ddp.groups.spawn import SECRET_ENV
from pytest_ddp.launched.launch import Launch, LaunchError

SECRET_BYTES = 32
# Where it is, and what to do if it is not, in the words of a LaunchError.
HOW_TO_SET = (
    f"set {SECRET_ENV} to the same random value for every launched process, e.g. "
    f'`export {SECRET_ENV}=$(python -c "import secrets; print(secrets.token_hex(32))")` '
    "in the job script (docs/launchers.md)"
)


@dataclass(frozen=True)
class SessionFiles:
    """Rank 0's files of one launch, in a folder private to the user."""

    folder: Path
    key: Path  # the secret, where the environment gives none
    socket: Path  # the controller's Unix socket (one node)


def session_files(launch: Launch, env: Mapping[str, str]) -> SessionFiles:
    """Where this launch's files are: the same paths in every process of the launch."""
    if launch.one_node:
        folder = Path(tempfile.gettempdir()) / f"pytest-ddp-{os.getuid()}"
        name = launch.job
    else:  # the address rank 0 listens at: every node agrees on it, and it is one live job's
        folder = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-ddp" / "launched"
        name = f"{launch.launcher}@{launch.master_addr}:{launch.master_port}"
    stem = hashlib.sha256(name.encode()).hexdigest()[:16]  # short: a Unix socket's path has 107 bytes at most
    return SessionFiles(folder, folder / f"{stem}.key", folder / f"{stem}.sock")


def given_secret(env: Mapping[str, str]) -> bytes | None:
    """The user's secret, if the environment holds one (an empty value is none)."""
    value = env.get(SECRET_ENV, "")
    return value.encode() if value else None


def private_folder(files: SessionFiles) -> None:
    """Make the files' folder (mode 0700), or check that the one there is this user's and private."""
    files.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(files.folder, os.lstat(files.folder), stat.S_ISDIR)


def _check_private(path: Path, info: os.stat_result, kind: Callable[[int], bool]) -> None:
    if not kind(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise LaunchError(
            f"{path} is not private to this user (uid {os.getuid()}, mode 0700 for a folder, 0600 for a "
            f"file): another user may have made it; remove it, or {HOW_TO_SET}"
        )


def create_secret(files: SessionFiles) -> bytes:
    """A new random secret, written to ``files.key`` (mode 0600) whole: a reader never sees it half written."""
    secret = secrets.token_hex(SECRET_BYTES).encode()
    partial = files.folder / f".{files.key.name}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret)
    finally:
        os.close(fd)
    os.replace(partial, files.key)
    return secret


def read_secret(files: SessionFiles) -> bytes:
    """The secret rank 0's pytest wrote (it did, before it listened); LaunchError if it cannot be read."""
    try:
        fd = os.open(files.key, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise LaunchError(
            f"cannot read the session's secret that rank 0's pytest wrote to {files.key} ({exc.strerror}): "
            f"across nodes that folder must be shared (the home directory), or {HOW_TO_SET}"
        ) from None
    try:
        _check_private(files.key, os.fstat(fd), stat.S_ISREG)
        return os.read(fd, 4 * SECRET_BYTES)
    finally:
        os.close(fd)


def remove_files(files: SessionFiles) -> None:
    """Rank 0's key and socket, and the folder if that leaves it empty (another launch may still use it)."""
    for path in (files.key, files.socket):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(OSError):
        files.folder.rmdir()

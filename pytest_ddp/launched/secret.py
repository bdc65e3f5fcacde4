"""The launched session's secret: held by every launched pytest process of one job, and by no other one.

No launcher gives its processes anything an outsider cannot know, so it comes from
``PYTEST_DDP_SECRET`` in the job's environment, or else a random one that rank 0's pytest writes
before it listens to a 0600 file in a folder private to the user (:mod:`pytest_ddp.common.secret`).
Rank 0 removes its files once every rank has joined.

The processes of a launch must find that folder (and, on one node, the socket beside it) without
talking first, and another user must not be able to take its place:

- one node: ``$TMPDIR/pytest-ddp-<uid>``, or, if another user made that first (in a sticky /tmp it
  cannot be removed), ``$XDG_CACHE_HOME/pytest-ddp/launched``; with ``PYTEST_DDP_SECRET`` set, first
  a folder in the temporary directory named after the secret, which no one without it can name;
- across nodes: ``$XDG_CACHE_HOME/pytest-ddp/launched``, seen by all where the home directory is shared.

Rank 0 takes the first folder it can make, or finds private; every other rank looks in each
folder that is private, in the same order.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_ddp.common import secret
from pytest_ddp.groups.spawn import SECRET_ENV
from pytest_ddp.launched.launch import Launch, LaunchError

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


def meeting_places(launch: Launch, env: Mapping[str, str]) -> list[SessionFiles]:
    """Where this launch's files may be, in the order rank 0 tries them: the same in every process
    of the launch (see the module's docstring)."""
    shared = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-ddp" / "launched"
    # Across nodes, the address rank 0 listens at: every node agrees on it, and it is one live job's.
    if not launch.one_node:
        return [_files(shared, f"{launch.launcher}@{launch.master_addr}:{launch.master_port}")]
    folders = [Path(tempfile.gettempdir()) / f"pytest-ddp-{os.getuid()}", shared]
    given = given_secret(env)
    if given is not None:
        named = hmac.new(given, b"pytest-ddp launched folder", hashlib.sha256).hexdigest()[:16]
        folders.insert(0, Path(tempfile.gettempdir()) / f"pytest-ddp-{os.getuid()}-{named}")
    return [_files(folder, launch.job) for folder in folders]


def _files(folder: Path, name: str) -> SessionFiles:
    stem = hashlib.sha256(name.encode()).hexdigest()[:16]  # short: a Unix socket's path has 107 bytes at most
    return SessionFiles(folder, folder / f"{stem}.key", folder / f"{stem}.sock")


def given_secret(env: Mapping[str, str]) -> bytes | None:
    """The user's secret, if the environment holds one (an empty value is none)."""
    value = env.get(SECRET_ENV, "")
    return value.encode() if value else None


def own_place(places: list[SessionFiles], env: Mapping[str, str]) -> SessionFiles:
    """Rank 0's: the first of ``places`` whose folder it can make (mode 0700) or finds private; a
    LaunchError that says why not each, and what to do, if none."""
    problems = []
    for files in places:
        try:
            secret.private_folder(files.folder)
            return files
        except secret.NotPrivate as exc:
            problems.append(f"{exc}: another user may have made it")
        except OSError as exc:
            problems.append(f"{files.folder} cannot be made ({exc.strerror or exc})")
    advice = "set TMPDIR to a folder of yours" if given_secret(env) else HOW_TO_SET
    reasons = "; ".join(problems)
    raise LaunchError(f"no folder private to this user for the launch's files: {reasons}; {advice}")


def found_places(places: list[SessionFiles]) -> list[SessionFiles]:
    """The other ranks': those of ``places`` whose folder is there and private (where rank 0 may be)."""
    return [files for files in places if secret.is_private_folder(files.folder)]


def read_secret(files: SessionFiles) -> bytes:
    """The secret rank 0's pytest wrote (it did, before it listened); LaunchError if it cannot be read."""
    try:
        return secret.read_secret(files.key)
    except secret.NotPrivate as exc:
        raise LaunchError(f"{exc}: another user may have made it; {HOW_TO_SET}") from None
    except OSError as exc:
        raise LaunchError(
            f"cannot read the session's secret that rank 0's pytest wrote to {files.key} ({exc.strerror}): "
            f"across nodes that folder must be shared (the home directory), or {HOW_TO_SET}"
        ) from None


def remove_files(files: SessionFiles) -> None:
    """Rank 0's key and socket, and the folder if that leaves it empty (another launch may still use it)."""
    for path in (files.key, files.socket):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    try:
        files.folder.rmdir()
    except OSError:
        pass

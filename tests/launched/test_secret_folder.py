"""Where a launch's processes meet on one node when another user took the folder first
(launched/link.py's meeting places): rank 0 passes over a folder that is not private to this user,
the other ranks find it where it went, and ``PYTEST_DDP_SECRET`` names a folder no one else can.

On the real gather (``LaunchedWorld``) and the real ``connect`` of a rank's pytest, in this process,
in a temporary directory and a cache folder of the test's own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import NOBODY, as_nobody
from pytest_ddp.groups.spawn import SECRET_ENV
from pytest_ddp.launched import protocol as hp
from pytest_ddp.launched.launch import Launch, LaunchError
from pytest_ddp.launched.link import connect, meeting_places
from pytest_ddp.launched.world import LaunchedWorld

WAIT = 60.0  # seconds a gather, or a peer, waits for what comes at once (its end is a failure)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to give a folder to another user")

pytestmark = pytest.mark.usefixtures("own_process")


@pytest.fixture
def tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temporary directory, sticky and open to all as /tmp is; the cache folder, the test's own;
    both in a folder of a short path (a Unix socket's has 107 bytes at most)."""
    base = Path(tempfile.mkdtemp(prefix="ddp-meet-"))
    folder = base / "tmp"
    folder.mkdir()
    folder.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    yield folder
    shutil.rmtree(base)


def _launch() -> Launch:
    return Launch("torchrun", 0, 2, 0, 0, 1, f"meeting.{uuid.uuid4()}", None, None)


def _gathered(launch: Launch) -> LaunchedWorld:
    """Rank 0's world once rank 1 (a real ``connect``, in a thread) has joined it."""
    world = LaunchedWorld(launch, WAIT, print)
    failures: list[BaseException] = []

    def rank_1() -> None:
        try:
            hello = hp.encode(hp.Hello(1, 1, 0, "node", ["t::a"], [], "/log"))
            connect(dataclasses.replace(launch, rank=1), WAIT).send_bytes(hello)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=rank_1, daemon=True)
    thread.start()
    assert world.gather(["t::a"], WAIT) is None
    thread.join()
    assert failures == [] and list(world.hosts) == [1]
    return world


@as_root
def test_a_folder_another_user_planted_is_passed_over(tmp: Path) -> None:
    """Another user's folder (mode 0777) where rank 0's would be, a socket of theirs listening in
    it under the launch's name: rank 0 listens in the next place, rank 1 finds it there and never
    connects to theirs, and their folder is left as it was (a user cannot remove it from /tmp)."""
    launch = _launch()
    planted = meeting_places(launch, os.environ)[0]
    planted.folder.mkdir()
    planted.folder.chmod(0o777)
    os.chown(planted.folder, NOBODY, NOBODY)
    theirs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.bind(str(planted.socket))  # the kernel's credentials are listen()'s: the child's
    child = as_nobody(lambda: theirs.listen(1))
    theirs.close()
    try:
        _gathered(launch)
        assert os.listdir(planted.folder) == [planted.socket.name]
        assert os.stat(planted.folder).st_uid == NOBODY
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_with_no_private_folder_the_error_says_what_works_and_it_does(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary directory's folder is not private (here this user's, mode 0755) and the cache
    folder cannot be made: the error names both and says to set PYTEST_DDP_SECRET; with it set, the
    launch meets in a folder named after the secret, and leaves nothing behind."""
    launch = _launch()
    usual = meeting_places(launch, os.environ)[0].folder
    usual.mkdir(mode=0o755)
    usual.chmod(0o755)  # whatever the umask
    cache = tmp.parent / "cache"
    cache.write_text("")  # a file: no folder can be made in it
    with pytest.raises(LaunchError) as refused:
        LaunchedWorld(launch, WAIT, print)
    message = str(refused.value)
    assert f"{usual} is not private to this user" in message
    assert f"{cache}/pytest-ddp/launched cannot be made" in message
    assert f"set {SECRET_ENV} to the same random value for every launched process" in message
    monkeypatch.setenv(SECRET_ENV, "the session's")
    _gathered(launch)
    assert os.listdir(tmp) == [usual.name] and os.listdir(usual) == []  # the secret's folder went with its files


def test_the_secret_s_folder_is_named_after_the_secret_and_says_nothing_of_it() -> None:
    launch = dataclasses.replace(_launch(), rank=1)
    folders = {
        value: meeting_places(launch, {SECRET_ENV: value})[0].folder.name for value in ("one secret", "another")
    }
    plain = meeting_places(launch, {})
    assert plain[0].folder.name == f"pytest-ddp-{os.getuid()}"
    assert len(set(folders.values())) == 2
    for value, name in folders.items():
        assert name.startswith(f"pytest-ddp-{os.getuid()}-") and value not in name
        assert meeting_places(launch, {SECRET_ENV: value})[1:] == plain  # where a rank without it looks too

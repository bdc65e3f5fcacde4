"""The controller's link under attack (launched/link.py, launched/world.py): hellos without the secret or
with another, a controller that cannot prove it, malformed and partial frames, the link's files.

Function-level, on the real gather (``LaunchedWorld``) and the real ``connect`` of a rank's pytest, in
this process: every "peer" is a real socket.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import threading
import uuid
from collections.abc import Callable, Mapping

import pytest

from pytest_ddp.groups.spawn import SECRET_ENV
from pytest_ddp.launched import protocol as hp
from pytest_ddp.launched.launch import Launch, LaunchError
from pytest_ddp.launched.link import HEADER, NONCE, Link, connect, meeting_places, remove_files
from pytest_ddp.launched.world import LaunchedWorld

GATHER = 3.0  # seconds the gather waits for a rank that never says hello
WAIT = 60.0  # seconds a gather, or a peer, waits for what comes at once (its end is a failure)
HOLD = 60.0  # seconds a stalling peer holds its partial frame at most (then it sends the rest)

pytestmark = pytest.mark.usefixtures("own_process")


def _launch(world_size: int) -> Launch:
    return Launch("torchrun", 0, world_size, 0, 0, 1, f"hostile.{uuid.uuid4()}", None, None)


def _hello(rank: int, node: str = "node") -> bytes:
    return hp.encode(hp.Hello(rank, rank, 0, node, ["t::a"], [], "/log"))


def _proven(launch: Launch, env: Mapping[str, str] = os.environ) -> Link:
    """A link to rank 0's pytest, proven (as a rank's pytest proves itself)."""
    return connect(dataclasses.replace(launch, rank=1), WAIT, env)


def _raw(launch: Launch) -> socket.socket:
    """A connection to rank 0's pytest from a process that holds no secret."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(meeting_places(launch, os.environ)[0].socket))
    return sock


class Peers:
    """Peers of a gather, one after the other in a thread of their own (the gather runs in this
    one): each step done before the next starts; what failed, kept for the test to see."""

    def __init__(self, *steps: Callable[[], object]) -> None:
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(steps,), daemon=True)
        self.thread.start()

    def _run(self, steps: tuple[Callable[[], object], ...]) -> None:
        for step in steps:
            try:
                step()
            except BaseException as exc:
                self.failures.append(exc)

    def join(self) -> list[BaseException]:
        self.thread.join()
        return self.failures


def test_a_hello_from_a_process_without_the_secret_is_refused() -> None:
    """Rank 1's hello, well framed, from a process that never proves it holds the secret, then
    the real rank 1's: the gather takes the real one, and logs the other, dropped."""
    launch = _launch(2)
    log: list[str] = []
    world = LaunchedWorld(launch, WAIT, log.append)
    forged = _raw(launch)
    forged.sendall(HEADER.pack(len(_hello(1, "forged"))) + _hello(1, "forged"))
    peers = Peers(lambda: _proven(launch).send_bytes(_hello(1, "real")))
    assert world.gather(["t::a"], WAIT) is None
    assert peers.join() == []
    assert {rank: link.hello.node for rank, link in world.hosts.items()} == {1: "real"}
    # Longer than the handshake's answer: refused before it is read.
    assert log == ["pytest-ddp: dropped a connection to rank 0's pytest: a frame of 125 bytes, over the 64 "
                   "allowed before it proved itself"], log
    forged.close()


def test_a_hello_with_another_secret_is_refused_and_so_is_the_rank() -> None:
    launch = _launch(2)
    log: list[str] = []
    world = LaunchedWorld(launch, WAIT, log.append)
    peers = Peers(
        lambda: _proven(launch, {**os.environ, SECRET_ENV: "another"}).send_bytes(_hello(1, "other secret")),
        lambda: _proven(launch).send_bytes(_hello(1, "real")),
    )
    assert world.gather(["t::a"], WAIT) is None
    refused = peers.join()
    assert {rank: link.hello.node for rank, link in world.hosts.items()} == {1: "real"}
    assert log == [f"pytest-ddp: dropped a connection to rank 0's pytest: it did not prove that it holds the "
                   f"session's secret (every launched process must hold the same secret ({SECRET_ENV} the "
                   f"same on all, or unset on all))"], log
    assert len(refused) == 1 and "refused this rank's proof of the session's secret" in str(refused[0]), refused


def test_a_rank_refuses_a_controller_that_does_not_prove_the_secret() -> None:
    """What listens where rank 0's pytest should challenges as it does, but holds another secret:
    the rank says no hello, and says why."""
    launch = _launch(2)
    files = meeting_places(launch, os.environ)[0]
    files.folder.mkdir(mode=0o700, exist_ok=True)
    fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fake.bind(str(files.socket))
    fake.listen(1)
    received: list[bytes] = []

    def impostor() -> None:
        peer, _ = fake.accept()
        peer.sendall(HEADER.pack(NONCE) + os.urandom(NONCE))
        answer = peer.recv(HEADER.size + 2 * NONCE, socket.MSG_WAITALL)
        peer.sendall(HEADER.pack(NONCE) + os.urandom(NONCE))  # a proof, of some other secret
        peer.settimeout(HOLD)
        received.append(answer + peer.recv(1 << 16))  # b"" once the rank closed the connection
        peer.close()

    peers = Peers(impostor)
    try:
        with pytest.raises(LaunchError, match="did not prove that it holds the session's secret"):
            connect(dataclasses.replace(launch, rank=1), WAIT, {**os.environ, SECRET_ENV: "the session's"})
        assert peers.join() == []
    finally:
        fake.close()
        remove_files(files)
    assert len(received) == 1 and len(received[0]) == HEADER.size + 2 * NONCE  # its answer, and no hello


def test_malformed_frames_are_logged_and_dropped() -> None:
    """From proven peers: not JSON, not a hello, a hello of the wrong types, of a rank the
    launch does not have; from an unproven one, a frame longer than a handshake's.  Each is
    dropped and logged, and the gather goes on: the real rank 1 comes last, and joins."""
    launch = _launch(2)
    log: list[str] = []
    world = LaunchedWorld(launch, WAIT, log.append)
    bad_frames = [
        b"\xff not json",
        hp.encode(hp.End(0, "")),
        b'{"k": "hello", "rank": "1", "local_rank": 0, "node_rank": 0, "node": "n", "items": [], '
        b'"errors": [], "log": "/l"}',
        _hello(7),
    ]
    unproven = _raw(launch)
    unproven.sendall(HEADER.pack(1 << 30))
    peers = Peers(
        *[lambda frame=frame: _proven(launch).send_bytes(frame) for frame in bad_frames],
        lambda: _proven(launch).send_bytes(_hello(1, "real")),
    )
    assert world.gather(["t::a"], WAIT) is None
    assert peers.join() == []  # each proved itself: what it sent next was read
    assert {rank: link.hello.node for rank, link in world.hosts.items()} == {1: "real"}
    said = [line.removeprefix("pytest-ddp: dropped a connection to rank 0's pytest: ") for line in log]
    wanted = [
        "a frame of 1073741824 bytes, over the 64 allowed before it proved itself",
        "not a host message: b'\\xff not json'",
        "'end' where its hello was due",
        "a malformed hello message: b'{\"k\": \"hello\", \"rank\": \"1\"",
        "a hello from rank 7, not a rank of this launch of 2",
    ]
    assert len(said) == len(wanted) and all(any(line.startswith(w) for line in said) for w in wanted), log
    unproven.close()


def test_a_partial_frame_held_by_its_sender_does_not_stall_the_gather() -> None:
    """Rank 1 (proven) sends 10 bytes of its 100-odd-byte hello and holds them; an unproven peer
    does the same with its answer; then the real rank 2 joins.  The gather ends at its deadline
    with rank 1 named as not reporting; only then (or after HOLD seconds) do the two send the rest."""
    launch = _launch(3)
    log: list[str] = []
    world = LaunchedWorld(launch, WAIT, log.append)
    gathered = threading.Event()
    hello = _hello(1, "stalled")
    unproven = _raw(launch)
    unproven.sendall(HEADER.pack(2 * NONCE) + b"0123456789")
    stalled: list[Link] = []
    peers = Peers(
        lambda: stalled.append(_proven(launch)),
        lambda: stalled[0].sock.sendall(HEADER.pack(len(hello)) + hello[:10]),
        lambda: connect(dataclasses.replace(launch, rank=2), WAIT, os.environ).send_bytes(_hello(2, "real")),
        lambda: gathered.wait(HOLD),
        lambda: stalled[0].sock.sendall(hello[10:]),
        lambda: unproven.sendall(bytes(2 * NONCE - 10)),
    )
    problem = world.gather(["t::a"], GATHER)
    gathered.set()
    failures = peers.join()
    assert {rank: link.hello.node for rank, link in world.hosts.items()} == {2: "real"}
    assert problem == f"ranks [1] of the launch did not report what they collected within {GATHER:g} s"
    assert log == [f"pytest-ddp: dropped a connection to rank 0's pytest: no hello within {GATHER:g} s"] * 2, log
    assert all(isinstance(exc, OSError) for exc in failures), failures  # the rest went to closed connections
    stalled[0].close()
    unproven.close()


def test_the_link_files_are_private_and_gone_once_every_rank_joined() -> None:
    launch = _launch(2)
    world = LaunchedWorld(launch, WAIT, print)
    files = meeting_places(launch, os.environ)[0]
    modes = {path.name: stat.S_IMODE(os.lstat(path).st_mode) for path in (files.folder, files.key, files.socket)}
    assert modes == {files.folder.name: 0o700, files.key.name: 0o600, files.socket.name: 0o600}
    assert stat.S_ISSOCK(os.lstat(files.socket).st_mode)
    peers = Peers(lambda: _proven(launch).send_bytes(_hello(1)))
    assert world.gather(["t::a"], WAIT) is None
    assert peers.join() == []
    assert not files.key.exists() and not files.socket.exists()

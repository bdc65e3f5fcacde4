"""pytest_ddp.common.handshake and .secret: the proofs, the secret's file, and both handshakes that use
them (a launched session's link, an MPI world's hello) on real sockets."""

from __future__ import annotations

import os
import select
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import NOBODY, as_nobody
from pytest_ddp.common import mpi_world, secret
from pytest_ddp.common.handshake import (
    CONNECTOR,
    LISTENER,
    NONCE,
    Challenge,
    HandshakeError,
    check,
    own_user,
    prove,
)
from pytest_ddp.groups.spawn import SECRET_ENV
from pytest_ddp.launched.launch import Launch, LaunchError
from pytest_ddp.launched.link import (
    HEADER,
    Incoming,
    Link,
    LinkError,
    answer_challenge,
    connect,
    meeting_places,
    remove_files,
)

KEY = b"k" * 64


# -- the proofs --------------------------------------------------------------------------------


def test_a_proof_answers_its_challenge_role_and_fields_only() -> None:
    challenge = os.urandom(NONCE)
    proof = prove(KEY, CONNECTOR, challenge, 1, 42)
    check(proof, KEY, CONNECTOR, challenge, 1, 42)
    refused = {
        "another secret": (b"x" * 64, CONNECTOR, challenge, (1, 42)),
        "the other role": (KEY, LISTENER, challenge, (1, 42)),
        "another challenge": (KEY, CONNECTOR, os.urandom(NONCE), (1, 42)),
        "other fields": (KEY, CONNECTOR, challenge, (2, 42)),
        "fields run together": (KEY, CONNECTOR, challenge, (14, 2)),
    }
    for why, (key, role, nonce, fields) in refused.items():
        with pytest.raises(HandshakeError):
            check(proof, key, role, nonce, *fields)
            pytest.fail(why)


def test_a_challenge_not_of_the_handshake_s_length_is_refused() -> None:
    with pytest.raises(HandshakeError, match="a challenge of 3 bytes"):
        prove(KEY, CONNECTOR, b"abc")


def test_a_challenge_takes_one_answer() -> None:
    challenge = Challenge()
    proof = prove(KEY, CONNECTOR, challenge.nonce)
    challenge.check(proof, KEY, CONNECTOR)
    with pytest.raises(HandshakeError, match="a second answer"):
        challenge.check(proof, KEY, CONNECTOR)  # the same, replayed
    wrong = Challenge()
    with pytest.raises(HandshakeError):
        wrong.check(b"\0" * NONCE, KEY, CONNECTOR)
    with pytest.raises(HandshakeError, match="a second answer"):
        wrong.check(prove(KEY, CONNECTOR, wrong.nonce), KEY, CONNECTOR)  # no second try either


def test_two_challenges_differ() -> None:
    assert len({Challenge().nonce for _ in range(100)}) == 100


# -- the secret's file -------------------------------------------------------------------------


def test_a_secret_is_written_private_and_read_back(tmp_path: Path) -> None:
    folder = tmp_path / "private" / "deeper"
    secret.private_folder(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    written = secret.write_secret(folder / "key")
    assert len(written) == 2 * secret.SECRET_BYTES and stat.S_IMODE((folder / "key").stat().st_mode) == 0o600
    assert secret.read_secret(folder / "key") == written
    assert secret.write_secret(folder / "key") != written  # a new one, in place of the old
    assert sorted(os.listdir(folder)) == ["key"]  # nothing half written left


def test_a_secret_another_could_read_or_a_link_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "private"
    secret.private_folder(folder)
    key = folder / "key"
    secret.write_secret(key)
    key.chmod(0o644)
    with pytest.raises(secret.NotPrivate, match="is not private to this user"):
        secret.read_secret(key)
    key.chmod(0o600)
    (folder / "link").symlink_to(key)
    with pytest.raises(OSError):
        secret.read_secret(folder / "link")  # O_NOFOLLOW
    folder.chmod(0o755)
    with pytest.raises(secret.NotPrivate):
        secret.private_folder(folder)
    (tmp_path / "to-private").symlink_to(folder)
    folder.chmod(0o700)
    with pytest.raises(secret.NotPrivate):
        secret.private_folder(tmp_path / "to-private")  # a link to a private folder is not one


def test_an_mpi_world_s_key_is_private(tmp_path: Path) -> None:
    folder = tmp_path / "world"
    folder.mkdir(mode=0o700)
    key = mpi_world.write_key(folder)
    assert mpi_world.read_key(str(folder)) == key
    (folder / mpi_world.KEY_FILE).chmod(0o640)
    with pytest.raises(secret.NotPrivate):
        mpi_world.read_key(str(folder))


# -- a launched session's link, on a socketpair ------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[Link, Link]]:
    """The controller's end and a host's, connected."""
    left, right = socket.socketpair()
    controller, host = Link(left), Link(right)
    yield controller, host
    controller.close()
    host.close()


def _first_frame(incoming: Incoming) -> bytes:
    """What the controller's side reads, as world.gather does: each time its socket is readable."""
    while (frame := incoming.first_frame()) is None:
        assert select.select([incoming.link], [], [], 30)[0], "nothing came in 30 s"
    return frame


def test_both_ends_of_a_link_prove_the_same_secret(pair: tuple[Link, Link]) -> None:
    controller, host = pair
    incoming = Incoming(controller, KEY)
    errors: list[BaseException] = []

    def run_host() -> None:
        try:
            answer_challenge(host, KEY, time.monotonic() + 30)
            host.send_bytes(b"hello")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_host)
    thread.start()
    assert _first_frame(incoming) == b"hello"
    thread.join()
    assert not errors and incoming.proven and controller.limit is None and host.limit is None


def test_a_host_with_another_secret_is_refused(pair: tuple[Link, Link]) -> None:
    controller, host = pair
    incoming = Incoming(controller, KEY)
    challenge = host.recv_frame(time.monotonic() + 30)
    host.send_bytes(prove(b"another", CONNECTOR, challenge) + os.urandom(NONCE))
    with pytest.raises(LinkError, match="did not prove that it holds the session's secret"):
        _first_frame(incoming)
    assert host.next_frame() is None  # it was not answered


def test_a_controller_with_another_secret_is_refused(pair: tuple[Link, Link]) -> None:
    controller, host = pair
    controller.send_bytes(os.urandom(NONCE))
    controller.send_bytes(prove(b"another", LISTENER, os.urandom(NONCE)))  # not the proof of KEY
    with pytest.raises(HandshakeError, match="did not prove that it holds the session's secret"):
        answer_challenge(host, KEY, time.monotonic() + 30)
    assert host.limit == 2 * NONCE  # it stays unproven


def test_a_replayed_answer_is_refused(pair: tuple[Link, Link]) -> None:
    """A host's answer, recorded on one connection, answers no other connection's challenge."""
    controller, host = pair
    first = Incoming(controller, KEY)
    recorded = prove(KEY, CONNECTOR, host.recv_frame(time.monotonic() + 30)) + os.urandom(NONCE)
    host.send_bytes(recorded)
    assert first.first_frame() is None and first.proven  # the genuine answer, on its own connection
    left, right = socket.socketpair()
    second, attacker = Incoming(Link(left), KEY), Link(right)
    try:
        attacker.recv_frame(time.monotonic() + 30)  # a new challenge, ignored
        attacker.send_bytes(recorded)
        with pytest.raises(LinkError, match="did not prove"):
            _first_frame(second)
    finally:
        second.link.close()
        attacker.close()


def test_a_frame_over_the_answer_s_length_is_refused_before_the_proof(pair: tuple[Link, Link]) -> None:
    controller, host = pair
    incoming = Incoming(controller, KEY)
    host.sock.sendall(HEADER.pack(2 * NONCE + 1))  # the header alone is enough to refuse it
    with pytest.raises(LinkError, match=f"a frame of {2 * NONCE + 1} bytes, over the {2 * NONCE} allowed"):
        _first_frame(incoming)


def test_a_host_refuses_a_challenge_not_of_the_handshake(pair: tuple[Link, Link]) -> None:
    controller, host = pair
    controller.send_bytes(b"short")
    with pytest.raises(HandshakeError, match="does not speak its protocol"):
        answer_challenge(host, KEY, time.monotonic() + 30)


# -- another user, on a Unix socket (as root: a child that becomes nobody) ---------------------

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a child as another user")


@as_root
def test_a_peer_of_another_user_is_refused() -> None:
    path = f"\0pytest-ddp-test-{os.getpid()}"  # abstract: no folder's mode stands in the way
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(2)
        listener.settimeout(30)
        child = as_nobody(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(path))
        try:
            sock, _ = listener.accept()
            with sock:
                with pytest.raises(HandshakeError, match=f"process {child} runs as user {NOBODY}"):
                    own_user(sock)
                incoming = Incoming(Link(sock), KEY)
                with pytest.raises(LinkError, match=f"runs as user {NOBODY}"):
                    incoming.first_frame()  # refused before any challenge was sent
        finally:  # a failed check must not leave the child waiting on its socket
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


@as_root
def test_a_host_refuses_a_listener_of_another_user() -> None:
    """What listens where rank 0's pytest should, on one node, runs as another user: the host says so
    before it reads or sends anything of the secret."""
    launch = Launch("torchrun", 1, 2, 1, 0, 1, f"test-handshake-{os.getpid()}", None, None)
    env = {SECRET_ENV: "the session's"}
    files = meeting_places(launch, env)[0]
    secret.private_folder(files.folder)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(files.socket))  # bound by this user; the kernel's credentials are listen()'s
    child = as_nobody(lambda: listener.listen(1))
    listener.close()
    try:
        with pytest.raises(LaunchError, match=f"is not this user's: process {child} runs as user {NOBODY}"):
            connect(launch, 30, env)  # tried until the child listens
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        remove_files(files)


def test_a_peer_of_this_user_is_its_process() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert own_user(left) == os.getpid()


# -- an MPI world's hello ----------------------------------------------------------------------


def test_an_mpi_hello_answers_its_challenge_under_its_secret_only() -> None:
    challenge = os.urandom(NONCE)
    hello = mpi_world.hello(KEY, challenge, 1, 4242)
    assert mpi_world.parse_hello(hello, KEY, challenge) == mpi_world.Hello(1, 4242)
    for key, nonce in ((b"another", challenge), (KEY, os.urandom(NONCE)), (KEY, b"short")):
        with pytest.raises(ValueError, match="its hello is not signed with the world's secret"):
            mpi_world.parse_hello(hello, key, nonce)
    forged = hello.replace(b'"rank": 1', b'"rank": 0')
    with pytest.raises(ValueError, match="not signed"):
        mpi_world.parse_hello(forged, KEY, challenge)
    with pytest.raises(ValueError, match="not signed"):
        mpi_world.parse_hello(hello.replace(b'"mac": "', b'"mac": "zz'), KEY, challenge)


def test_an_mpi_hello_is_bounded() -> None:
    """The controller reads a hello of at most MAX_MESSAGE bytes, the handshake's bound."""
    from pytest_ddp.common.handshake import MAX_UNPROVEN

    assert mpi_world.MAX_MESSAGE == MAX_UNPROVEN
    assert len(mpi_world.hello(KEY, os.urandom(NONCE), 2**31 - 1, 2**31 - 1)) < MAX_UNPROVEN

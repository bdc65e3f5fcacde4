"""The link between the launched pytest processes: the controller listens, every other rank's pytest connects.

On one node a Unix socket (mode 0600) in the launch's private folder; on several a TCP address
(:func:`pytest_ddp.launched.launch.channel_address`).  A frame is an 8-byte big-endian length and
that many bytes; a :class:`Link` never blocks on a read, so a peer that sends half a frame and
holds it stalls no one.

Before anything else each end proves it holds the session's secret
(:mod:`pytest_ddp.common.handshake`): the controller too, since it tells the others what to fork.
Until a peer has proven itself no frame it sends may be longer than that answer; on one node each
end also refuses a peer of another user (``SO_PEERCRED``).

No launcher gives its processes anything an outsider cannot know, so the secret comes from
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

import errno
import hashlib
import hmac
import os
import select
import socket
import struct
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from pytest_ddp.common import secret as secret_files
from pytest_ddp.common.handshake import CONNECTOR, LISTENER, NONCE, Challenge, HandshakeError, own_user, prove
from pytest_ddp.groups.spawn import SECRET_ENV
from pytest_ddp.launched.launch import Launch, LaunchError, channel_address, store_key

RETRY = 0.05  # seconds between attempts to reach a controller not listening yet
HEADER = struct.Struct("!Q")
CHUNK = 1 << 18  # bytes asked of the socket per read
SAME_SECRET = (
    f"every launched process must hold the same secret ({SECRET_ENV} the same on all, or unset on all)"
)
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
            secret_files.private_folder(files.folder)
            return files
        except secret_files.NotPrivate as exc:
            problems.append(f"{exc}: another user may have made it")
        except OSError as exc:
            problems.append(f"{files.folder} cannot be made ({exc.strerror or exc})")
    advice = "set TMPDIR to a folder of yours" if given_secret(env) else HOW_TO_SET
    reasons = "; ".join(problems)
    raise LaunchError(f"no folder private to this user for the launch's files: {reasons}; {advice}")


def found_places(places: list[SessionFiles]) -> list[SessionFiles]:
    """The other ranks': those of ``places`` whose folder is there and private (where rank 0 may be)."""
    return [files for files in places if secret_files.is_private_folder(files.folder)]


def read_secret(files: SessionFiles) -> bytes:
    """The secret rank 0's pytest wrote (it did, before it listened); LaunchError if it cannot be read."""
    try:
        return secret_files.read_secret(files.key)
    except secret_files.NotPrivate as exc:
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


class LinkError(Exception):
    """What a peer sent is not what the link allows: its connection is dropped, and why is logged."""


class Link:
    """One end of a connection between two launched pytest processes: frames out, whole frames in."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)  # sends wait for room; reads never wait (MSG_DONTWAIT)
        self.sock = sock
        # The longest frame taken: the handshake's answer, until the peer has proven itself.
        self.limit: int | None = 2 * NONCE
        self.closed = False  # the peer closed its end, or the connection broke
        self._buffer = bytearray()
        self._frames: deque[bytes] = deque()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send_bytes(self, frame: bytes) -> None:
        header = HEADER.pack(len(frame))
        if len(frame) < CHUNK:
            self.sock.sendall(header + frame)
        else:  # no copy of a large frame
            self.sock.sendall(header)
            self.sock.sendall(frame)

    def receive(self) -> list[bytes]:
        """The whole frames that have come, without waiting (``closed`` then says if the peer's end
        is); LinkError for a frame longer than ``limit``."""
        self._read()
        frames = list(self._frames)
        self._frames.clear()
        return frames

    def next_frame(self) -> bytes | None:
        """The next whole frame if one has come, else None, without waiting."""
        if not self._frames:
            self._read()
        return self._frames.popleft() if self._frames else None

    def recv_frame(self, deadline: float) -> bytes:
        """The next whole frame, waited for until ``deadline`` (``time.monotonic()``) at most:
        TimeoutError if it is not whole by then, EOFError if the peer closes first."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while (frame := self.next_frame()) is None:
            if self.closed:
                raise EOFError
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            poller.poll(left * 1000)
        return frame

    def close(self) -> None:
        self.sock.close()

    def _read(self) -> None:
        while not self.closed:
            try:
                chunk = self.sock.recv(CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            self.closed = not chunk
            self._buffer += chunk
            if len(chunk) < CHUNK:
                break  # what was there is read: a peer that keeps sending does not keep this here
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if self.limit is not None and size > self.limit:
                raise LinkError(
                    f"a frame of {size} bytes, over the {self.limit} allowed before it proved itself"
                )
            end = HEADER.size + size
            if len(self._buffer) < end:
                break
            self._frames.append(bytes(self._buffer[HEADER.size : end]))
            del self._buffer[:end]


class Incoming:
    """A connection to the controller, from its accept until the peer has proven that it holds
    the session's secret and sent its first frame (its hello)."""

    def __init__(self, link: Link, secret: bytes) -> None:
        self.link, self.secret = link, secret
        self.challenge = Challenge()
        self.proven = False
        self.refused: str | None = None  # why the peer may not even try
        if link.sock.family == socket.AF_UNIX:
            try:
                own_user(link.sock)
            except HandshakeError as exc:
                self.refused = str(exc)
                link.sock.shutdown(socket.SHUT_RDWR)  # readable at once: first_frame says why
                return
        link.send_bytes(self.challenge.nonce)

    def first_frame(self) -> bytes | None:
        """The peer's first frame after its proof, once whole; None until then (never waits).
        LinkError if the peer fails to prove itself, or goes away first."""
        if self.refused is not None:
            raise LinkError(self.refused)
        while (frame := self.link.next_frame()) is not None:
            if self.proven:
                return frame
            try:
                if len(frame) != 2 * NONCE:
                    raise HandshakeError(f"an answer of {len(frame)} bytes")
                self.challenge.check(frame[:NONCE], self.secret, CONNECTOR)
            except HandshakeError:
                raise LinkError(
                    f"it did not prove that it holds the session's secret ({SAME_SECRET})"
                ) from None
            self.proven = True
            self.link.limit = None
            self.link.send_bytes(prove(self.secret, LISTENER, frame[NONCE:]))
        if self.link.closed:
            before = "its hello" if self.proven else "proving itself"
            raise LinkError(f"it closed the connection before {before}")
        return None


def answer_challenge(link: Link, secret: bytes, deadline: float) -> None:
    """The connecting end's handshake by ``deadline``: answer the controller's challenge and have
    it prove itself (HandshakeError if not; TimeoutError, EOFError, OSError or LinkError)."""
    challenge = link.recv_frame(deadline)
    if len(challenge) != NONCE:
        raise HandshakeError(f"does not speak its protocol (a challenge of {len(challenge)} bytes)")
    mine = Challenge()
    link.send_bytes(prove(secret, CONNECTOR, challenge) + mine.nonce)
    try:
        mine.check(link.recv_frame(deadline), secret, LISTENER)
    except HandshakeError:
        raise HandshakeError(f"did not prove that it holds the session's secret; {SAME_SECRET}") from None
    link.limit = None


@dataclass
class Listener:
    """The controller's listening socket (non-blocking), and the files it made for the launch."""

    sock: socket.socket
    secret: bytes
    files: SessionFiles

    def accept(self) -> Incoming | None:
        """A new connection, challenged; None if there was none after all, or it broke at once."""
        try:
            sock, _ = self.sock.accept()
        except OSError:  # none after all, or it broke, or no file descriptor is left (a flood of them)
            return None
        try:
            return Incoming(Link(sock), self.secret)
        except OSError:
            sock.close()
            return None

    def close(self) -> None:
        """Stop listening; remove the socket's and the secret's files (every rank has them by now, or
        never will)."""
        self.sock.close()
        remove_files(self.files)


_T = TypeVar("_T")


def _in_private_folder(files: SessionFiles, env: Mapping[str, str], make: Callable[[], _T]) -> _T:
    """``make()`` in the launch's private folder, checked private (or made again, if another launch,
    leaving it empty, removed it) right before: another user may have made one of its name since."""
    for _ in range(3):
        own_place([files], env)
        try:
            return make()
        except FileNotFoundError:
            continue
    raise LaunchError(f"{files.folder} keeps disappearing: another process removes it")


def listen(launch: Launch, timeout: float, env: Mapping[str, str] = os.environ) -> Listener:
    """The controller's listening socket, published where the others look, after the secret is where
    they read it."""
    places, address, given = meeting_places(launch, env), channel_address(launch), given_secret(env)
    files = places[0] if address is not None and given else own_place(places, env)  # none made if not needed
    if address is None:
        sock = _in_private_folder(files, env, lambda: _bind_unix(launch, files))
    else:
        sock = socket.create_server(address)
    try:
        secret = given or _in_private_folder(files, env, lambda: secret_files.write_secret(files.key))
        sock.listen(launch.world_size)
        sock.setblocking(False)
        if address is not None and address[1] == 0:
            host, port = sock.getsockname()[:2]
            _torchrun_store(launch, timeout).set(store_key(launch), f"{host}:{port}")
    except BaseException:
        sock.close()
        remove_files(files)
        raise
    return Listener(sock, secret, files)


def _bind_unix(launch: Launch, files: SessionFiles) -> socket.socket:
    """A Unix socket bound at ``files.socket``, taking the place of one whose pytest was killed."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(files.socket)
    try:
        try:
            sock.bind(path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if _answers(path):
                raise LaunchError(
                    f"{launch.describe()}: another pytest of this launch listens already"
                ) from None
            os.unlink(path)
            sock.bind(path)
        os.chmod(path, 0o600)
        return sock
    except BaseException as exc:
        sock.close()
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):  # that one: made again
            raise LaunchError(
                f"{launch.describe()}: cannot listen at {path} ({exc}); a shorter TMPDIR may help"
            ) from None
        raise


def _answers(path: str) -> bool:
    """Whether some process listens at the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def connect(launch: Launch, timeout: float, env: Mapping[str, str] = os.environ) -> Link:
    """This rank's link to the controller, which may not listen yet (tried until ``timeout``),
    once each end has proven to the other that it holds the session's secret."""
    deadline = time.monotonic() + timeout
    sock, files = _reach(launch, timeout, deadline, meeting_places(launch, env))
    link = Link(sock)
    try:
        if sock.family == socket.AF_UNIX:
            try:
                own_user(sock)
            except HandshakeError as exc:
                raise HandshakeError(f"is not this user's: {exc}") from None
        answer_challenge(link, given_secret(env) or read_secret(files), deadline)
        return link
    except HandshakeError as exc:
        why = f"what listens for rank 0's pytest {exc}"
    except TimeoutError:  # before OSError, its base
        why = f"rank 0's pytest did not take this rank within {timeout:g} s"
    except (EOFError, OSError, LinkError):
        why = (
            f"rank 0's pytest refused this rank's proof of the session's secret (or went away); {SAME_SECRET}"
        )
    except BaseException:
        link.close()
        raise
    link.close()
    raise LaunchError(f"rank {launch.rank}: {why}")


def _reach(
    launch: Launch, timeout: float, deadline: float, places: list[SessionFiles]
) -> tuple[socket.socket, SessionFiles]:
    """A connected socket to where the controller listens, tried until ``deadline``, and the files
    beside it (on one node, in each private folder of ``places``: rank 0 took one of them)."""
    address = channel_address(launch)
    if address is not None and address[1] == 0:
        host, _, port = _torchrun_store(launch, timeout).get(store_key(launch)).decode().rpartition(":")
        address = (host, int(port))
    while True:
        tried = [(address, places[0])] if address else [(str(f.socket), f) for f in found_places(places)]
        for target, files in tried:
            family = socket.AF_UNIX if isinstance(target, str) else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.connect(target)
                return sock, files
            except (ConnectionRefusedError, FileNotFoundError):
                sock.close()
        if time.monotonic() > deadline:
            raise LaunchError(
                f"rank {launch.rank} ({launch.describe()}) could not reach rank 0's pytest "
                f"within {timeout:g} s"
            )
        time.sleep(RETRY)  # rank 0's pytest is still starting: nothing to wait on but time


def _torchrun_store(launch: Launch, timeout: float) -> Any:
    """torchrun's agent store, as a client (as TORCHELASTIC_USE_AGENT_STORE says every worker is)."""
    import torch.distributed as dist

    assert launch.master_addr is not None and launch.master_port is not None
    return dist.TCPStore(
        launch.master_addr, launch.master_port, is_master=False, timeout=timedelta(seconds=timeout)
    )

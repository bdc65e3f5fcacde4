"""What an MPI group's controller (:mod:`pytest_ddp.groups.mpi_group`) and the stand-ins its launcher
starts (:mod:`pytest_ddp.rank.mpi_standin`) share, and how each knows the other is its own.

The controller's Unix socket is a file in the world's folder (the folder 0700, the socket 0600):
only the user's processes can connect.  They are not all the world's, so the controller also
writes a random secret for each world into that folder (0600), where a stand-in reads it.  A
connection:

- the controller takes it only from a process of its own user that its launcher started (the
  kernel's ``SO_PEERCRED``, and ``/proc``'s parents); the stand-in only from its own ancestor;
- the controller sends a challenge (random bytes); the stand-in answers with its hello (its rank and
  its process), signed with an HMAC of the challenge and those fields under the secret, and hands over
  with it the descriptors its launcher gave it for ``MPI_Init`` (:data:`FD_VARIABLES`);
- every message is multiprocessing's frame (a length, then the bytes), read with a deadline and a
  bound on its length.

The world's files in /dev/shm (MPICH's shared memory, which only ``MPI_Finalize`` removes) are
listed in the folder too: whoever ends the world removes them, the controller or, when the
controller died without doing so, each stand-in once its launcher is gone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = "mpi.key"
SOCKET_FILE = "mpi.sock"
SHARED_MEMORY_FILE = "mpi.shm"
SHARED_MEMORY = "/dev/shm"
SECRET_BYTES = 32
HELLO_WAIT = 10.0  # seconds a connection gets to send its hello, and a stand-in to get its challenge
MAX_MESSAGE = 4096  # bytes: a challenge or a hello is far shorter, and so is what a stand-in is sent
HEADER = struct.Struct("!i")  # multiprocessing.connection's frame: the length, then the bytes
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
_FIELDS = ("rank", "stand_in")
# The variables in which a launcher names a descriptor it gave each process it started, for
# ``MPI_Init`` to talk to it through (MPICH's PMI: gforker, hydra; Slurm's PMI-2).  The stand-in hands
# them over to the rank the controller forks, which finds them at other numbers.
FD_VARIABLES = ("PMI_FD",)


@dataclass(frozen=True)
class Hello:
    """What a stand-in says of itself, signed."""

    rank: int
    stand_in: int  # the stand-in's process, the one that connected


def _write_private(path: Path, data: bytes) -> None:
    """A new file only the user can read (O_EXCL: never one that was there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_key(folder: Path) -> bytes:
    """A new secret for the world whose folder this is."""
    secret = secrets.token_bytes(SECRET_BYTES)
    _write_private(folder / KEY_FILE, secret)
    return secret


def read_key(folder: str) -> bytes:
    return (Path(folder) / KEY_FILE).read_bytes()


def at_socket(folder: str | Path, use: Callable[[str], None]) -> None:
    """``use`` (bind, connect) the path of the world's socket in ``folder``, by way of a descriptor of
    the folder: a socket's path is at most 108 bytes, and pytest's basetemp makes longer ones."""
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        use(f"/proc/self/fd/{fd}/{SOCKET_FILE}")
    finally:
        os.close(fd)


def frame(payload: bytes) -> bytes:
    """``payload`` as ``Connection.send_bytes`` sends it."""
    return HEADER.pack(len(payload)) + payload


def _mac(secret: bytes, challenge: bytes, numbers: tuple[int, ...]) -> bytes:
    return hmac.new(secret, challenge + " ".join(map(str, numbers)).encode(), hashlib.sha256).hexdigest().encode()


def hello(secret: bytes, challenge: bytes, rank: int, stand_in: int) -> bytes:
    """The hello that answers ``challenge``."""
    fields = {"rank": rank, "stand_in": stand_in}
    return json.dumps({**fields, "mac": _mac(secret, challenge, (rank, stand_in)).decode()}).encode()


def parse_hello(message: bytes, secret: bytes, challenge: bytes) -> Hello:
    """The hello in ``message`` if it answers ``challenge`` under ``secret``; ValueError saying why not."""
    try:
        fields = json.loads(message)
    except ValueError as exc:  # UnicodeDecodeError too
        raise ValueError(f"its hello is not JSON ({exc})") from None
    if not isinstance(fields, dict) or sorted(fields) != sorted((*_FIELDS, "mac")):
        raise ValueError("its hello does not have a hello's fields")
    rank, stand_in = (fields[name] for name in _FIELDS)
    if not all(type(n) is int for n in (rank, stand_in)) or not isinstance(fields["mac"], str):
        raise ValueError("its hello's fields are not of a hello's types")
    if not hmac.compare_digest(fields["mac"].encode(errors="replace"), _mac(secret, challenge, (rank, stand_in))):
        raise ValueError("its hello is not signed with the world's secret")
    return Hello(rank, stand_in)


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket, as the kernel saw it at connect
    (for the connecting end: the process that listened)."""
    pid, uid, _ = _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
    return pid, uid


def parent_of(pid: int) -> int | None:
    """``pid``'s parent, from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is ``pid``'s parent, or its parent's, and so on."""
    seen = 0
    while (parent := parent_of(pid)) is not None and parent > 1 and seen < 64:
        if parent == ancestor:
            return True
        pid, seen = parent, seen + 1
    return False


def write_shared_memory(folder: Path, files: dict[str, tuple[int, int]]) -> None:
    """List the world's files in /dev/shm, each with its (device, inode): a file of that name made
    since is not the world's."""
    _write_private(folder / SHARED_MEMORY_FILE, json.dumps(files).encode())


def read_shared_memory(folder: str) -> dict[str, tuple[int, int]]:
    """The world's files in /dev/shm, as listed; none if the list is gone or is not one."""
    try:
        listed = json.loads((Path(folder) / SHARED_MEMORY_FILE).read_bytes())
        return {str(path): (int(device), int(inode)) for path, (device, inode) in listed.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def remove_shared_memory(files: dict[str, tuple[int, int]]) -> None:
    """Remove those of the files that are still the same files, directly in /dev/shm."""
    for path, identity in files.items():
        try:
            found = os.stat(path, follow_symlinks=False)
            if os.path.dirname(path) == SHARED_MEMORY and (found.st_dev, found.st_ino) == identity:
                os.unlink(path)
        except OSError:
            continue


def environment_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (its launcher's), from /proc; OSError once it is gone."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    pairs = (entry.decode(errors="surrogateescape").partition("=") for entry in entries if b"=" in entry)
    return {name: value for name, _, value in pairs}

"""What an MPI group's controller (:mod:`pytest_ddp.groups.mpi_group`) and the stand-ins its launcher
starts (:mod:`pytest_ddp.rank.mpi_standin`) share, and how each knows the other is its own.

The controller's Unix socket is in the world's private folder; not all the user's processes are
the world's, so each world also has a secret there.  The controller takes a connection only from a
process of its own user that its launcher started, and the stand-in's hello only proven by
:mod:`pytest_ddp.common.handshake`.  Every message is multiprocessing's frame, read with a deadline
and a bound.  The world's files in /dev/shm (MPICH's, which only ``MPI_Finalize`` removes) are
listed in the folder too, for whoever ends the world.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_ddp.common import secret
from pytest_ddp.common.handshake import CONNECTOR, MAX_UNPROVEN, HandshakeError, check, prove

KEY_FILE = "mpi.key"
SOCKET_FILE = "mpi.sock"
SHARED_MEMORY_FILE = "mpi.shm"
SHARED_MEMORY = "/dev/shm"
HELLO_WAIT = 10.0  # seconds a connection gets to send its hello, and a stand-in to get its challenge
MAX_MESSAGE = MAX_UNPROVEN  # bytes: a hello is far shorter, and so is what a stand-in is sent
HEADER = struct.Struct("!i")  # multiprocessing.connection's frame: the length, then the bytes
_FIELDS = ("rank", "stand_in")
# The variables in which a launcher names a descriptor it gave each process for ``MPI_Init`` (MPICH's
# PMI, Slurm's PMI-2); the forked rank finds them at other numbers.
FD_VARIABLES = ("PMI_FD",)


@dataclass(frozen=True)
class Hello:
    """What a stand-in says of itself, signed."""

    rank: int
    stand_in: int  # the stand-in's process, the one that connected


def write_key(folder: Path) -> bytes:
    """A new secret for the world whose folder this is (it must be private to this user)."""
    secret.private_folder(folder)
    return secret.write_secret(folder / KEY_FILE)


def read_key(folder: str) -> bytes:
    """The world's secret; OSError if it cannot be read, NotPrivate if its file is not private."""
    return secret.read_secret(Path(folder) / KEY_FILE)


def at_socket(folder: str | Path, use: Callable[[str], None]) -> None:
    """``use`` (bind, connect) the world's socket through a descriptor of ``folder``: a socket's path
    is at most 108 bytes, and pytest's basetemp makes longer ones."""
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        use(f"/proc/self/fd/{fd}/{SOCKET_FILE}")
    finally:
        os.close(fd)


def frame(payload: bytes) -> bytes:
    """``payload`` as ``Connection.send_bytes`` sends it."""
    return HEADER.pack(len(payload)) + payload


def hello(key: bytes, challenge: bytes, rank: int, stand_in: int) -> bytes:
    """The hello that answers ``challenge``, proven under the world's secret ``key``."""
    mac = prove(key, CONNECTOR, challenge, rank, stand_in).hex()
    return json.dumps({"rank": rank, "stand_in": stand_in, "mac": mac}).encode()


def parse_hello(message: bytes, key: bytes, challenge: bytes) -> Hello:
    """The hello in ``message`` if it answers ``challenge`` under ``key``; ValueError saying why not."""
    try:
        fields = json.loads(message)
    except ValueError as exc:  # UnicodeDecodeError too
        raise ValueError(f"its hello is not JSON ({exc})") from None
    if not isinstance(fields, dict) or sorted(fields) != sorted((*_FIELDS, "mac")):
        raise ValueError("its hello does not have a hello's fields")
    rank, stand_in = (fields[name] for name in _FIELDS)
    if not all(type(n) is int for n in (rank, stand_in)) or not isinstance(fields["mac"], str):
        raise ValueError("its hello's fields are not of a hello's types")
    try:
        check(bytes.fromhex(fields["mac"]), key, CONNECTOR, challenge, rank, stand_in)
    except (ValueError, HandshakeError):  # not hex, or not the proof
        raise ValueError("its hello is not signed with the world's secret") from None
    return Hello(rank, stand_in)


def write_shared_memory(folder: Path, files: dict[str, tuple[int, int]]) -> None:
    """List the world's files in /dev/shm with their (device, inode), so a later namesake is spared."""
    secret.write_private(folder / SHARED_MEMORY_FILE, json.dumps(files).encode())


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

"""What an MPI launcher starts for each rank: ``python -m pytest_ddp.rank.mpi_standin <folder>``.

The launcher (see :mod:`pytest_ddp.groups.mpi_group`) starts this small process, the rank's
*stand-in*, with its environment (``PMI_RANK``, ``PMI_FD``, ...).  It connects to the socket of its
ancestor the controller, answers the challenge with a hello signed with the world's secret
(:mod:`pytest_ddp.common.mpi_world`) and hands over the descriptors ``MPI_Init`` talks through.
The controller forks the rank from its forkserver with them, so ``MPI_Init`` works as if the
launcher had started it, and torch's import is paid once a session, not once a rank.  Then:

- told the rank's process, it lingers until the controller ends the world, so that MPICH's
  launcher does not kill the other ranks when one dies (the watchdog sees who was stranded); a
  stand-in killed by ``MPI_Abort`` ends its connection, and the controller kills its rank;
- when the launcher dies (SIGTERM, by PR_SET_PDEATHSIG) or the controller's connection ends
  without its word, it kills the rank and removes the world's /dev/shm files, which only
  ``MPI_Finalize`` would; the world's folder too, once the controller ended without a word.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from pytest_ddp.common import mpi_world, prctl
from pytest_ddp.common.mpi_world import (
    FD_VARIABLES,
    HEADER,
    HELLO_WAIT,
    MAX_MESSAGE,
    at_socket,
    frame,
    read_key,
    read_shared_memory,
    remove_shared_memory,
)
from pytest_ddp.common.procfs import descends_from, peer_credentials

# Where launchers put a process's rank in the world they start (MPICH's PMI, Open MPI, PMIx).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launched_rank() -> int:
    """This process's rank in the world, as its launcher says."""
    for name in RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    raise RuntimeError(f"started by no MPI launcher this knows: none of {', '.join(RANK_VARIABLES)} is set")


class _Unattended:
    """Ends the world where its controller may not (see the module's docstring)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.rank: int | None = None  # a pidfd of the rank, once forked
        self.controller: int | None = None  # a pidfd of the controller, once connected
        self.link: Connection | None = None  # the connection to it, once the hello is sent
        self.ending = False

    def launcher_gone(self, number: int, stack: Any) -> None:
        if not self.ending:  # else this process is ending already
            self.end()

    def end(self) -> NoReturn:
        """Kill the rank and remove the world's files in /dev/shm; then its folder too, unless the
        controller says it ends the world: once the controller has ended, nobody else can."""
        self.ending = True
        try:
            if self.rank is not None:  # ended first: the world's files are in use till then
                try:
                    signal.pidfd_send_signal(self.rank, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                select.select([self.rank], [], [])
            remove_shared_memory(read_shared_memory(self.folder))
            if (
                self.link is not None
                and self.controller is not None
                and not _ended_by(self.link, self.controller)
            ):
                shutil.rmtree(self.folder, ignore_errors=True)
        finally:
            os._exit(1)


def _ended_by(link: Connection, controller: int) -> bool:
    """Whether the controller says it ends the world; if not, it has ended (waited for: it ends the
    connection, by its word or by its death, once it hears that the rank died)."""
    if link.fileno() in select.select([link.fileno(), controller], [], [])[0]:
        try:
            link.recv_bytes(MAX_MESSAGE)
            return True
        except (EOFError, OSError):
            pass
    select.select([controller], [], [])
    return False


def _become_stand_in(rank: int, parent: int, unattended: _Unattended) -> None:
    """Name this process ``ddp-standin<N>`` (ps, pgrep) and end with the launcher."""
    prctl.name(f"ddp-standin{rank}")
    signal.signal(signal.SIGTERM, unattended.launcher_gone)
    if not prctl.die_with_parent(parent, signal.SIGTERM):
        os._exit(1)


def _connect(folder: str) -> tuple[socket.socket, int]:
    """A connection to the controller's socket and its pidfd; RuntimeError unless it is our ancestor,
    of our user."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HELLO_WAIT)
    at_socket(folder, sock.connect)
    pid, uid = peer_credentials(sock)
    controller = os.pidfd_open(pid)
    if uid != os.geteuid() or not descends_from(os.getpid(), pid):
        raise RuntimeError(
            f"the process listening in {folder} ({pid}, user {uid}) is not this world's controller"
        )
    return sock, controller


def _receive(sock: socket.socket, count: int) -> bytes:
    received = b""
    while len(received) < count:
        chunk = sock.recv(count - len(received))
        if not chunk:
            raise EOFError("the controller closed the connection")
        received += chunk
    return received


def _challenge(sock: socket.socket) -> bytes:
    """The controller's challenge, in its frame (the socket's timeout is the deadline)."""
    (length,) = HEADER.unpack(_receive(sock, HEADER.size))
    if not 0 < length <= MAX_MESSAGE:
        raise RuntimeError(f"the controller's challenge is {length} bytes long")
    return _receive(sock, length)


def main(folder: str) -> None:
    launcher = os.getppid()
    rank = launched_rank()
    unattended = _Unattended(folder)
    _become_stand_in(rank, launcher, unattended)
    secret = read_key(folder)
    sock, unattended.controller = _connect(folder)
    challenge = _challenge(sock)
    hello = mpi_world.hello(secret, challenge, rank, os.getpid())
    # The descriptors the launcher named, handed over as copies and kept open here: to the launcher,
    # its process ends when the stand-in does.
    descriptors = [int(os.environ[name]) for name in FD_VARIABLES if name in os.environ]
    socket.send_fds(sock, [frame(hello)], descriptors)
    sock.settimeout(None)
    connection = unattended.link = Connection(sock.detach())
    try:
        unattended.rank = os.pidfd_open(int(connection.recv_bytes(MAX_MESSAGE)))
        connection.recv_bytes(MAX_MESSAGE)  # the controller's word that it ends the world
    except (EOFError, OSError, ValueError):
        unattended.end()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])

"""What an MPI launcher starts for each rank of an MPI group:
``python -m pytest_ddp.rank.mpi_standin <folder>``, the group's folder.

The launcher (MPICH's ``mpiexec.gforker`` by default, see :mod:`pytest_ddp.groups.mpi_group`)
starts this small process, the rank's *stand-in*, with the launcher's environment
(``PMI_RANK``, ``PMI_FD``, ...).  The stand-in connects to the controller's socket in that folder
(its own ancestor's, as the kernel says), takes the controller's challenge, and forks the rank, which
answers it with its hello signed with the world's secret (:mod:`pytest_ddp.common.mpi_world`).
The rank inherits both the connection and the launcher's descriptors, so ``MPI_Init`` in the
rank works as if the launcher had started it.  Then the stand-in waits:

- when the rank ends, it sends the controller the rank's exit status and the time
  of its death (a launcher does not say which of its processes died first), and
  lingers until the controller closes the connection.  Lingering keeps the
  launcher from killing the other ranks when one dies, as MPICH's launchers do:
  the watchdog sees the death and the ranks it strands, not a cascade of kills;
- when the launcher dies, the kernel sends the stand-in SIGTERM (PR_SET_PDEATHSIG): it
  kills the rank and removes the world's files in /dev/shm, which only ``MPI_Finalize``
  would have; if the controller is gone too (SIGKILL, SIGTERM), the world's folder as well.
- when its rank is killed by SIGBUS, it says in the rank's stderr how full /dev/shm is: MPI's
  shared memory, and a test's, is there, and a full one is the usual cause.

Before the fork the stand-in imports only this package's ``__init__`` (pytest, not
torch): about 0.25 s, which the rank then need not import again.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pytest_ddp.common import mpi_world, prctl
from pytest_ddp.common.mpi_world import (
    HEADER,
    HELLO_WAIT,
    MAX_MESSAGE,
    SHARED_MEMORY,
    at_socket,
    descends_from,
    peer_credentials,
    read_key,
    read_shared_memory,
    remove_shared_memory,
)
from pytest_ddp.common.protocol import exit_message

# Where launchers put a process's rank in the world they start (MPICH's PMI, Open MPI, PMIx).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launched_rank() -> int:
    """This process's rank in the world, as its launcher says."""
    for name in RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    raise RuntimeError(f"started by no MPI launcher this knows: none of {', '.join(RANK_VARIABLES)} is set")


class _LauncherGone:
    """The SIGTERM handler that the kernel's parent-death signal calls once the launcher has died."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.rank: int | None = None  # a pidfd of the rank, once forked
        self.controller: int | None = None  # a pidfd of the controller, once connected

    def __call__(self, number: int, frame: Any) -> None:
        try:
            if self.rank is not None:  # ended first: the world's files are in use till then
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self.rank, signal.SIGKILL)
                select.select([self.rank], [], [])
            remove_shared_memory(read_shared_memory(self.folder))
            if self.controller is not None and select.select([self.controller], [], [], 0)[0]:
                shutil.rmtree(self.folder, ignore_errors=True)  # nobody is left to read or remove it
        finally:
            os._exit(1)


def _become_stand_in(rank: int, parent: int, on_launcher_gone: _LauncherGone) -> None:
    """Name this process ``ddp-standin<N>`` (ps, pgrep) and end with the launcher."""
    prctl.name(f"ddp-standin{rank}")
    signal.signal(signal.SIGTERM, on_launcher_gone)
    if not prctl.die_with_parent(parent, signal.SIGTERM):
        os._exit(1)


def _connect(folder: str) -> tuple[socket.socket, int]:
    """A connection to the controller's socket, and a pidfd of the controller; RuntimeError if the
    process listening there is not this process's ancestor, of the same user."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HELLO_WAIT)
    at_socket(folder, sock.connect)
    pid, uid = peer_credentials(sock)
    controller = os.pidfd_open(pid)
    if uid != os.geteuid() or not descends_from(os.getpid(), pid):
        raise RuntimeError(f"the process listening in {folder} ({pid}, user {uid}) is not this world's controller")
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
    on_launcher_gone = _LauncherGone(folder)
    _become_stand_in(rank, launcher, on_launcher_gone)
    secret = read_key(folder)
    sock, on_launcher_gone.controller = _connect(folder)
    challenge = _challenge(sock)
    sock.settimeout(None)
    connection = Connection(sock.detach())
    stand_in = os.getpid()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the stand-in's, not the rank's
        os.close(on_launcher_gone.controller)
        hello = mpi_world.hello(secret, challenge, rank, os.getpid(), stand_in)
        _rank(folder, rank, connection, stand_in, hello)
    on_launcher_gone.rank = os.pidfd_open(pid)  # before the wait: the process cannot have been reaped
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == -signal.SIGBUS:
        _say_how_full_shared_memory_is(folder, rank)
    try:
        connection.send_bytes(exit_message(code, time.time()))
        while True:  # until the controller closes the connection (EOFError)
            connection.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(0)


def _say_how_full_shared_memory_is(folder: str, rank: int) -> None:
    """A line in the rank's stderr: how much of /dev/shm is free."""
    try:
        spec = json.loads((Path(folder) / f"rank{rank}.json").read_text())
        room = os.statvfs(SHARED_MEMORY)
        free, size = room.f_bavail * room.f_frsize, room.f_blocks * room.f_frsize
        with open(spec["stderr"], "a") as stderr:
            stderr.write(
                f"pytest-ddp: rank {rank} was killed by SIGBUS; {SHARED_MEMORY}, where MPI keeps the shared memory "
                f"of one machine's ranks, has {free / 2**20:.1f} MiB free of {size / 2**20:.1f} MiB\n"
            )
    except (OSError, ValueError, KeyError):
        pass


def _rank(folder: str, rank: int, connection: Connection, stand_in: int, hello: bytes) -> None:
    """The rank process: says who it is, then lives the life of every rank."""
    try:
        spec = json.loads((Path(folder) / f"rank{rank}.json").read_text())
        connection.send_bytes(hello)
        os.setsid()  # as a forked rank: its keeper ends its session, no other rank's
        from pytest_ddp.rank.channel import Channel
        from pytest_ddp.rank.entry import redirect_output, serve

        redirect_output(spec)
        serve(spec, Channel(spec["events"], connection, connection), stand_in)
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(3)


if __name__ == "__main__":
    main(sys.argv[1])

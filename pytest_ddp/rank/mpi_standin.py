"""What an MPI launcher starts for each rank of an MPI group:
``python -m pytest_ddp.rank.mpi_standin <folder> <socket>``.

The launcher (MPICH's ``mpiexec.gforker`` by default, see :mod:`pytest_ddp.groups.mpi_group`)
starts this small process, the rank's *stand-in*, with the launcher's environment
(``PMI_RANK``, ``PMI_FD``, ...).  The stand-in connects to the controller's socket
and forks the rank itself, which inherits both the
connection and the launcher's descriptors, so ``MPI_Init`` in the rank works as if
the launcher had started it.  Then the stand-in waits:

- when the rank ends, it sends the controller the rank's exit status and the time
  of its death (a launcher does not say which of its processes died first), and
  lingers until the controller closes the connection.  Lingering keeps the
  launcher from killing the other ranks when one dies, as MPICH's launchers do:
  the watchdog sees the death and the ranks it strands, not a cascade of kills;
- when the launcher dies, the kernel kills the stand-in (PR_SET_PDEATHSIG), and
  the rank with it.

Before the fork the stand-in imports only this package's ``__init__`` (pytest, not
torch): about 0.25 s, which the rank then need not import again.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from pytest_ddp.common import prctl
from pytest_ddp.common.protocol import exit_message

# Where launchers put a process's rank in the world they start (MPICH's PMI, Open MPI, PMIx).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launched_rank() -> int:
    """This process's rank in the world, as its launcher says."""
    for name in RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    raise RuntimeError(f"started by no MPI launcher this knows: none of {', '.join(RANK_VARIABLES)} is set")


def _become_stand_in(rank: int, parent: int) -> None:
    """Name this process ``ddp-standin<N>`` (ps, pgrep) and die with the launcher."""
    prctl.name(f"ddp-standin{rank}")
    if not prctl.die_with_parent(parent):
        os._exit(1)


def main(folder: str, socket_name: str) -> None:
    launcher = os.getppid()
    rank = launched_rank()
    _become_stand_in(rank, launcher)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(b"\0" + socket_name.encode())  # Linux's abstract namespace: no file
    connection = Connection(sock.detach())
    stand_in = os.getpid()
    pid = os.fork()
    if pid == 0:
        _rank(folder, rank, connection, stand_in)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        connection.send_bytes(exit_message(code, time.time()))
        while True:  # until the controller closes the connection (EOFError)
            connection.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(0)


def _rank(folder: str, rank: int, connection: Connection, stand_in: int) -> None:
    """The rank process: says who it is, then lives the life of every rank."""
    try:
        spec = json.loads((Path(folder) / f"rank{rank}.json").read_text())
        connection.send_bytes(json.dumps({"rank": rank, "pid": os.getpid(), "stand_in": stand_in}).encode())
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
    main(sys.argv[1], sys.argv[2])

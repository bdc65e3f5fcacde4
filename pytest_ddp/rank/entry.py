"""A rank process: joins its group, then runs what its controller hands it.

Forked from a forkserver that already imported torch and pytest.  In "pytest" mode the rank is a
pytest session of its own, like an xdist worker (:mod:`pytest_ddp.rank.session`); in "function"
mode it calls functions for :func:`pytest_ddp.run`.  Between tests a rank lingers, its process
group intact: a peer still waiting for it hangs rather than fails, and the watchdog says why.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import io
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from pytest_ddp.common import prctl
from pytest_ddp.common.protocol import PRELOAD_ENV, RankRole, RankStart
from pytest_ddp.rank import default_group, leftovers
from pytest_ddp.rank.channel import Channel, fatal
from pytest_ddp.rank.context import RankContext, set_current
from pytest_ddp.rank.functions import serve_functions
from pytest_ddp.rank.session import run_pytest


def _release_forkserver() -> None:
    """Close the forkserver's liveness pipe that multiprocessing hands every child: a rank
    holding it would keep the forkserver alive after the controller died, and the forkserver's
    exit is what kills the ranks (PR_SET_PDEATHSIG)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        os.close(alive_fd)
        # multiprocessing's private attribute, untyped: nothing public closes it.
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]


def _redirect_output(start: RankStart) -> None:
    """fds 1 and 2 to the files the controller reads; unbuffered, so nothing is lost on a kill."""
    for fd, path in ((1, start.stdout), (2, start.stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    # UTF-8, as the controller reads them; a lone surrogate (a non-UTF-8 file name) is escaped,
    # as Python's stderr does, not an error that fails the test.
    sys.stdout = _text_stream(1)
    sys.stderr = _text_stream(2)


def _text_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, "utf-8", "backslashreplace", write_through=True)


def _join_mpi_world(role: RankRole) -> ModuleType:
    """An MPI rank: MPI_Init (importing mpi4py's MPI does it), in the world the launcher made."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if (world.Get_rank(), world.Get_size()) != (role.rank, role.world_size):
        raise RuntimeError(
            f"the MPI launcher made this process rank {world.Get_rank()} of {world.Get_size()}, "
            f"not rank {role.rank} of {role.world_size}"
        )
    from pytest_ddp.record import mpi_recorder  # imports mpi4py: only in an MPI rank

    return mpi_recorder


def forked_main(
    start_path: str, commands: Connection, notify: Connection, descriptors: dict[str, int]
) -> None:
    """A rank's life, from the fork to its exit; ``descriptors``: an MPI launcher's, by variable."""
    parent = os.getppid()
    _release_forkserver()
    os.setsid()  # Ctrl-C in the terminal is for the controller, which then stops us
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the forkserver's SIG_IGN is not the test's
    try:
        start = RankStart.from_json(Path(start_path).read_text())
        for fd in descriptors.values():
            os.set_inheritable(fd, True)  # as the launcher gave it
        numbers = {name: str(fd) for name, fd in descriptors.items()}
        start = dataclasses.replace(start, env={**start.env, **numbers})
        _redirect_output(start)
    except FileNotFoundError:
        # The controller gave the group up (Ctrl-C while it started) and removed its folder
        # while this rank was being forked; stderr is still the user's terminal here.
        os._exit(1)
    serve(start, Channel(start.events, commands, notify), parent)


def serve(start: RankStart, channel: Channel, parent: int) -> NoReturn:
    """The rest of a rank's life: join the group, run what the controller hands over, exit."""
    role = start.role
    prctl.name(f"ddp-rank{role.rank}")
    if not prctl.die_with_parent(parent):  # the kernel SIGKILLs the rank when its parent dies
        os._exit(1)  # it died before we asked
    prctl.become_subreaper()
    keeper = leftovers.start_keeper(role.rank)
    preloaded = os.environ.get(PRELOAD_ENV, "").split(",")
    os.environ.clear()
    os.environ.update(start.env)
    os.chdir(start.cwd)
    dump = open(start.dump, "w")  # noqa: SIM115 - must stay open for the signal handler
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    if start.sys_path:
        sys.path[:] = start.sys_path
    try:
        mpi = _join_mpi_world(role) if role.backend == "mpi" else None
        if mpi is None:
            default_group.start(role)
        from pytest_ddp.record import recorder, schedules  # imports torch: only in a rank

        recorders = [recorder] if mpi is None else [recorder, mpi]
        for each in recorders:
            each.install(channel.log)
        recorder.rebind(preloaded)
        schedules.install(channel.log)
        context = RankContext(
            role.rank, role.world_size, role.backend, role.init, role.local_rank,
            group_dir=os.path.dirname(start.events),
        )
        set_current(context)
        channel.recorders = recorders
        run = run_pytest if role.mode == "pytest" else serve_functions
        code = run(start, channel)
    except BaseException:
        fatal(channel, traceback.format_exc())
        code = 3
    leftovers.end_processes([pid for pid in leftovers.descendants() if pid != keeper])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: torch's atexit work can block on a broken group.
    os._exit(code)

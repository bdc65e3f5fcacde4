"""A rank process: joins its group, then runs what its controller hands it.

Forked by :class:`pytest_ddp.groups.group.RankGroup` from a forkserver that already
imported torch and pytest (:func:`forked_main`), or by the stand-in an MPI
launcher started (:mod:`pytest_ddp.rank.mpi_standin`); either way its life goes on in
:func:`serve`.  In "pytest" mode the rank is a pytest session of its own that
collected the group's tests (like an xdist worker) and runs each one, with its
own fixtures, when the controller says so (:mod:`pytest_ddp.rank.session`).  In
"function" mode it calls module-level functions for :func:`pytest_ddp.run`.

Everything the rank has to say goes into its event log; a byte on the notify
pipe wakes the controller.  Between tests a rank lingers, its process group
intact, as a pytest session does: a peer still waiting for it therefore hangs
rather than fails, and the controller's watchdog says why.
"""

from __future__ import annotations

import base64
import faulthandler
import importlib
import io
import json
import os
import pickle
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from pytest_ddp.common import prctl
from pytest_ddp.common.protocol import (
    CallFunction,
    Done,
    Event,
    EventLog,
    Fatal,
    PhaseStart,
    ProtocolError,
    Ready,
    Report,
    RunItem,
    Stop,
    TestStart,
    decode_command,
)
from pytest_ddp.rank import leftovers
from pytest_ddp.record import injector

if TYPE_CHECKING:
    pass  # what pytest.exit() raises (pytest.exit.Exception)

# Seconds a test's unfinished asynchronous work (an isend, irecv or async_op
# collective nobody waited for) gets to complete once the test is over.
IN_FLIGHT_WAIT = 1.0
# Seconds in all that threads a test started get to end once the test is over.
THREAD_JOIN_WAIT = 1.0


@dataclass(frozen=True)
class RankContext:
    """Who this process is: what the ``rank``, ``world_size`` and ``device`` fixtures return."""

    rank: int
    world_size: int
    backend: str
    init: bool
    local_rank: int  # the GPU it uses with NCCL: its rank on one machine, LOCAL_RANK when launched

    @property
    def device(self) -> str:
        return f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu"


_context: RankContext | None = None
# The recorders whose per-test bookkeeping this rank drives: torch's, and mpi4py's in an MPI group.
_recorders: list[Any] = []
WorkCommand = TypeVar("WorkCommand", RunItem, CallFunction)


def current() -> RankContext | None:
    """The context of this rank process, or None in the controller."""
    return _context


def rank_context() -> RankContext:
    assert _context is not None  # set before the rank's session starts
    return _context


class Channel:
    """The rank's end of its link to the controller."""

    def __init__(self, events_path: str, commands: Connection, notify: Connection) -> None:
        self.log = EventLog(events_path)
        self._commands = commands
        self._notify = notify

    def event(self, event: Event, wake: bool = False) -> None:
        self.log.write(event)
        if wake:
            try:
                self._notify.send_bytes(b"!")
            except OSError:
                pass  # the controller is gone; the next command read ends this rank

    def commands(self, accepted: type[WorkCommand]) -> Iterator[WorkCommand]:
        """The controller's commands for this rank's mode (``RunItem`` in a pytest session,
        ``CallFunction`` in function mode), until "stop" or until it closes the pipe (it is gone).

        Any other command is the controller's bug: :class:`ProtocolError`.
        """
        while True:
            try:
                message = self._commands.recv_bytes()
            except (EOFError, OSError):
                return
            command = decode_command(message)
            if isinstance(command, Stop):
                return
            if not isinstance(command, accepted):
                raise ProtocolError(f"a rank that runs {accepted.KIND!r} commands was sent {command.KIND!r}")
            yield command


def _become_rank(rank: int, parent_pid: int) -> None:
    """Name this process ``ddp-rank<N>`` (ps, pgrep) and have the kernel SIGKILL it
    when its parent dies, however it dies."""
    prctl.name(f"ddp-rank{rank}")
    if not prctl.die_with_parent(parent_pid):
        os._exit(1)


def _release_forkserver() -> None:
    """Close the forkserver's liveness pipe that multiprocessing hands every child.

    The forkserver exits when every copy of that pipe is closed; a rank holding
    one would keep it alive after the controller died, and the forkserver's
    exit is what kills the ranks (PR_SET_PDEATHSIG).
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        os.close(alive_fd)
        # multiprocessing's private attribute, untyped: nothing public closes it.
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]


def redirect_output(spec: dict[str, Any]) -> None:
    """fds 1 and 2 to the files the controller reads; unbuffered, so nothing is lost on a kill."""
    for fd, path in ((1, spec["stdout"]), (2, spec["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)


def _init_group(spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=spec["pg_timeout"])
    store = dist.TCPStore(
        spec["store_host"], spec["store_port"], spec["world_size"], is_master=False, timeout=timeout
    )
    kwargs: dict[str, Any] = {}
    if spec["backend"] == "nccl":
        torch.cuda.set_device(spec["local_rank"])
        kwargs["device_id"] = torch.device("cuda", spec["local_rank"])
    dist.init_process_group(
        spec["backend"],
        store=store,
        rank=spec["rank"],
        world_size=spec["world_size"],
        timeout=timeout,
        **kwargs,
    )


def _join_mpi_world(spec: dict[str, Any]) -> None:
    """An MPI rank: MPI_Init (importing mpi4py's MPI does it), in the world the launcher made."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if (world.Get_rank(), world.Get_size()) != (spec["rank"], spec["world_size"]):
        raise RuntimeError(
            f"the MPI launcher made this process rank {world.Get_rank()} of {world.Get_size()}, "
            f"not rank {spec['rank']} of {spec['world_size']}"
        )
    from pytest_ddp.record import mpi_recorder

    _recorders.append(mpi_recorder)


def start_test() -> None:
    for recorder in _recorders:
        recorder.start_test()


def _unfinished_work() -> list[dict[str, Any]]:
    """Asynchronous work of the test (torch's and, in an MPI group, mpi4py's) still not done
    IN_FLIGHT_WAIT seconds after the test ended."""
    return [work for recorder in _recorders for work in recorder.unfinished_work(IN_FLIGHT_WAIT)]


def _group_intact() -> bool:
    """Whether the default process group this rank was started with is still there."""
    context = current()
    if context is None:
        return True
    if context.backend == "mpi":  # the world the launcher made, until MPI_Finalize
        from mpi4py import MPI

        return not MPI.Is_finalized()
    if not context.init:
        return True
    import torch.distributed as dist

    return dist.is_initialized()


def done_event(threads_left: list[dict[str, str]], interrupted: dict[str, Any] | None = None) -> Done:
    """The test is over on this rank: the state it leaves the rank in.  With the
    other ranks' events, this is the after-test check of the group."""
    in_flight = _unfinished_work()
    peak_cuda = None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        peak_cuda = int(torch.cuda.max_memory_allocated())
    # ru_maxrss is in KiB on Linux.
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return Done(
        group_intact=_group_intact(),
        in_flight=in_flight,
        threads_left=threads_left,
        interrupted=interrupted,
        peak_rss=peak_rss,
        peak_cuda=peak_cuda,
    )


def fatal(channel: Channel, error: str) -> None:
    """The rank cannot go on: tell the controller, and say why on stderr, which the
    controller shows for a rank that died."""
    channel.event(Fatal(error), wake=True)
    sys.stderr.write(error)


def _serve_functions(spec: dict[str, Any], channel: Channel) -> int:
    """Function mode: call ``module.qualname(rank, *args, **kwargs)`` per command."""
    channel.event(Ready(), wake=True)
    for command in channel.commands(CallFunction):
        start_test()
        armed = pickle.loads(base64.b64decode(command.faults)) if command.faults else ()
        injector.arm(armed, spec["rank"], channel.log)
        threads_before = set(threading.enumerate())
        channel.event(TestStart(command.id))
        channel.event(PhaseStart("call"))
        data: dict[str, Any]
        try:
            fn: Any = importlib.import_module(command.module)
            for part in command.qualname.split("."):
                fn = getattr(fn, part)
            args, kwargs = pickle.loads(base64.b64decode(command.args))
            value = fn(spec["rank"], *args, **kwargs)
            outcome, data = "passed", {"value": _encode(value)}
        except BaseException as exc:  # the function's failure is the result, whatever it is
            outcome = "failed"
            data = {
                "exception": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        threads_left = leftovers.threads_left(threads_before, THREAD_JOIN_WAIT)
        if threads_left and outcome == "passed":
            from pytest_ddp.diagnose.wording import threads_left_text

            outcome, data = "failed", {"exception": threads_left_text(threads_left, THREAD_JOIN_WAIT)}
        channel.event(Report("call", outcome, data=data), wake=True)
        channel.event(done_event(threads_left), wake=True)
    return 0


def _encode(value: Any) -> str | None:
    try:
        return base64.b64encode(pickle.dumps(value)).decode()
    except Exception:
        return None


def forked_main(spec_path: str, commands: Connection, notify: Connection) -> None:
    """A rank's life, from the forkserver's fork to its exit."""
    parent = os.getppid()
    _release_forkserver()
    os.setsid()  # Ctrl-C in the terminal is for the controller, which then stops us
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the forkserver's SIG_IGN is not the test's
    try:
        spec = json.loads(Path(spec_path).read_text())
        redirect_output(spec)
    except FileNotFoundError:
        # The controller gave the group up (Ctrl-C while it started) and removed its folder
        # while this rank was being forked; stderr is still the user's terminal here.
        os._exit(1)
    serve(spec, Channel(spec["events"], commands, notify), parent)


def serve(spec: dict[str, Any], channel: Channel, parent: int) -> NoReturn:
    """The rest of a rank's life, however it was started (forked, or by an MPI launcher):
    join the group, run what the controller hands over, exit."""
    global _context
    _become_rank(spec["rank"], parent)
    prctl.become_subreaper()
    keeper = leftovers.start_keeper(spec["rank"])
    if spec["env"] is not None:  # None: keep the launcher's environment
        os.environ.clear()
        os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    dump = open(spec["dump"], "w")  # noqa: SIM115 - must stay open for the signal handler
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    if spec["sys_path"]:
        sys.path[:] = spec["sys_path"]
    try:
        if spec["backend"] == "mpi":
            _join_mpi_world(spec)
        elif spec["init"]:
            _init_group(spec)
        from pytest_ddp.record import recorder

        _recorders.insert(0, recorder)
        for each in _recorders:
            each.install(channel.log)
        _context = RankContext(spec["rank"], spec["world_size"], spec["backend"], spec["init"], spec["local_rank"])
        from pytest_ddp.rank.session import run_pytest

        run = run_pytest if spec["mode"] == "pytest" else _serve_functions
        code = run(spec, channel)
    except BaseException:
        fatal(channel, traceback.format_exc())
        code = 3
    leftovers.end_processes([pid for pid in leftovers.descendants() if pid != keeper])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: torch's atexit work can block on a broken group.
    os._exit(code)

"""A rank process: joins its group, then runs what its controller hands it.

Forked by :class:`pytest_ddp.group.RankGroup` from a forkserver that already
imported torch and pytest; :func:`forked_main` is where a rank begins.  In
"pytest" mode the rank is a pytest session of its own that collected the
group's tests (like an xdist worker) and runs each one, with its own fixtures,
when the controller says so.  In "function" mode it calls
module-level functions for :func:`pytest_ddp.run`.

Everything the rank has to say goes into its event log; a byte on the notify
pipe wakes the controller.  Between tests a rank lingers, its process group
intact, as a pytest session does: a peer still waiting for it therefore hangs
rather than fails, and the controller's watchdog says why.
"""

from __future__ import annotations

import base64
import ctypes
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
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import _pytest.config
import pytest

from . import faults, injector, leftovers, rank_warnings
from .protocol import (
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
    SessionEnd,
    Stop,
    TestStart,
    WarningRecorded,
    decode_command,
)

if TYPE_CHECKING:
    from _pytest.outcomes import Exit  # what pytest.exit() raises (pytest.exit.Exception)

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
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

    @property
    def device(self) -> str:
        return f"cuda:{self.rank}" if self.backend == "nccl" else "cpu"


_context: RankContext | None = None
# The recorders whose per-test bookkeeping this rank drives: torch's, and mpi4py's in an MPI group.
_recorders: list[Any] = []
WorkCommand = TypeVar("WorkCommand", RunItem, CallFunction)


def current() -> RankContext | None:
    """The context of this rank process, or None in the controller."""
    return _context


def _rank_context() -> RankContext:
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
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, f"ddp-rank{rank}".encode())
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before we asked
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
        "127.0.0.1", spec["store_port"], spec["world_size"], is_master=False, timeout=timeout
    )
    kwargs: dict[str, Any] = {}
    if spec["backend"] == "nccl":
        torch.cuda.set_device(spec["rank"])
        kwargs["device_id"] = torch.device("cuda", spec["rank"])
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
    from . import mpi_recorder

    _recorders.append(mpi_recorder)


def _start_test() -> None:
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


class LeftoverProcessWarning(pytest.PytestWarning):
    """A test left processes running in its rank; the rank ended them."""


def _done_event(threads_left: list[dict[str, str]], interrupted: dict[str, Any] | None = None) -> Done:
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


def _restore_environment(saved: dict[str, str]) -> None:
    """os.environ as it was when the rank was ready: what a test added is removed."""
    for key in [key for key in os.environ if key not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _fatal(channel: Channel, error: str) -> None:
    """The rank cannot go on: tell the controller, and say why on stderr, which the
    controller shows for a rank that died."""
    channel.event(Fatal(error), wake=True)
    sys.stderr.write(error)


class RankSession:
    """The pytest plugin of a rank's session: runs the items its controller names."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.collect_errors: list[str] = []
        self.ready = False  # the session reached its run loop and said so
        self.environment: dict[str, str] = {}  # os.environ when the rank was ready
        self.processes = leftovers.ProcessLedger()
        # Per test: what was there before it, and what it left.
        self.threads_before: set[threading.Thread] = set()
        self.processes_before: set[int] = set()
        self.finalizers_before: dict[Any, int] = {}
        self.threads_left: list[dict[str, str]] = []
        self.interrupted: dict[str, Any] | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: Any) -> None:
        self.config = config
        # The rank's stdout is the test's output: keep pytest's own progress out of it.
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            devnull = open(os.devnull, "w")  # noqa: SIM115 - the writer keeps it for the rank's life
            reporter._tw = _pytest.config.create_terminal_writer(config, devnull)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collect_errors.append(f"{report.nodeid}: {report.longreprtext}")

    def pytest_internalerror(self, excrepr: Any) -> None:
        # The terminal reporter writes it to /dev/null here (see pytest_configure).
        _fatal(self.channel, f"INTERNALERROR\n{excrepr}\n")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: Any) -> bool:
        items = {item.nodeid: item for item in session.items}
        self.environment = dict(os.environ)
        self.processes.start()
        self.channel.event(Ready(list(items), self.collect_errors), wake=True)
        self.ready = True
        last = None
        for command in self.channel.commands(RunItem):
            self._run(items, command.id, command.next)
            last = items[command.id]
        if last is not None:  # "stop": tear down what the last item left set up, and say how it went
            call = pytest.CallInfo.from_call(lambda: session._setupstate.teardown_exact(None), "teardown")
            report = last.ihook.pytest_runtest_makereport(item=last, call=call)
            hook = self.config.hook
            data = None if report.passed else hook.pytest_report_to_serializable(config=self.config, report=report)
            self.channel.event(SessionEnd(report.outcome, report.duration, data), wake=True)
        return True

    def _run(self, items: dict[str, Any], nodeid: str, next_nodeid: str | None) -> None:
        _start_test()
        _restore_environment(self.environment)
        self.channel.event(TestStart(nodeid))
        item = items[nodeid]
        marker = item.get_closest_marker("ddp")  # its faults were checked by the controller
        declared = faults.check_all(marker.kwargs.get("faults", ()), init=False) if marker is not None else ()
        injector.arm(declared, _rank_context().rank, self.channel.log)
        # Fixtures kept for a next item that this group did not get after all
        # (xdist scheduled it elsewhere) are torn down before this item sets up.
        item.session._setupstate.teardown_exact(item)
        self.threads_before = set(threading.enumerate())
        self.processes_before = set(leftovers.descendants())
        self.threads_left, self.interrupted = [], None
        nextitem = None if next_nodeid is None else items.get(next_nodeid)
        item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        self.channel.event(_done_event(self.threads_left, self.interrupted), wake=True)

    def _phase(self, when: str) -> None:
        self.channel.event(PhaseStart(when))

    def _finalizers(self, item: Any) -> dict[Any, int]:
        """How many finalizers each node set up holds: a fixture set up adds one to its scope's node."""
        return {node: len(finalizers) for node, (finalizers, _) in item.session._setupstate.stack.items()}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: Any) -> Any:
        self._phase("setup")
        self.finalizers_before = self._finalizers(item)
        try:
            return (yield)
        except (pytest.exit.Exception, KeyboardInterrupt) as exc:
            self._interrupt(exc)
        finally:
            grown = frozenset(
                node for node, n in self._finalizers(item).items() if n > self.finalizers_before.get(node, -1)
            )
            self.processes.after_setup(self.processes_before, grown | {item})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        self._phase("call")
        try:
            return (yield)
        except (pytest.exit.Exception, KeyboardInterrupt) as exc:
            self._interrupt(exc)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: Any) -> Any:
        self._phase("teardown")
        try:
            result = yield
        except (pytest.exit.Exception, KeyboardInterrupt) as exc:
            self._end_leftovers(item)
            self._interrupt(exc)
        except BaseException:
            self._end_leftovers(item)
            raise
        self._end_leftovers(item)
        if self.threads_left:
            from .wording import threads_left_text

            pytest.fail(threads_left_text(self.threads_left, THREAD_JOIN_WAIT), pytrace=False)
        return result

    def _interrupt(self, exc: Exit | KeyboardInterrupt) -> None:
        """``pytest.exit()`` or KeyboardInterrupt in this rank: the test fails here, and the
        controller, told in the done event, ends the session as plain pytest would."""
        if isinstance(exc, KeyboardInterrupt):
            self.interrupted = {"kind": "KeyboardInterrupt", "reason": "KeyboardInterrupt", "returncode": None}
            pytest.fail("KeyboardInterrupt", pytrace=False)
        self.interrupted = {"kind": "exit", "reason": exc.msg, "returncode": exc.returncode}
        pytest.fail(f"pytest.exit: {exc.msg}", pytrace=False)

    def _end_leftovers(self, item: Any) -> None:
        """After the test's teardown: wait for its threads a little, and end the processes it left."""
        self.threads_left = leftovers.threads_left(self.threads_before, THREAD_JOIN_WAIT)
        ending = self.processes.to_end(set(item.session._setupstate.stack))
        if ending:
            described = ", ".join(leftovers.describe(pid) for pid in ending)
            leftovers.end_processes(ending)
            message = LeftoverProcessWarning(f"processes the test left running were ended: {described}")
            warnings.warn_explicit(message, LeftoverProcessWarning, str(item.path), item.location[1] + 1)

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str, location: Any) -> None:
        if when == "runtest":  # collection and configuration warnings: the controller has its own
            self.channel.event(WarningRecorded(rank_warnings.serialized(warning_message), nodeid))

    def pytest_runtest_logreport(self, report: Any) -> None:
        data = None
        # A plain pass carries nothing beyond outcome and duration: skip serializing
        # it (a large share of a warm test's cost in the rank).
        plain_pass = (
            report.passed and not report.sections and not report.user_properties and not hasattr(report, "wasxfail")
        )
        if not plain_pass:
            data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.channel.event(Report(report.when, report.outcome, report.duration, data), wake=report.failed)

    # pytest-timeout must never fire inside a rank: the controller owns the timeout.
    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_set_timer(self, item: Any, settings: Any) -> bool:
        return True

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: Any) -> bool:
        return True


def _run_pytest(spec: dict[str, Any], channel: Channel) -> int:
    session = RankSession(channel)
    args = [*spec["pytest_args"], "--basetemp", spec["basetemp"]]
    code = int(pytest.main(args, plugins=[session]))
    if not session.ready:
        # Ended before running anything: a named test's module failed to import
        # ("found no collectors"), a bad option, ...  Its terminal output went nowhere.
        errors = "".join(f"\n\n{error}" for error in session.collect_errors)
        _fatal(channel, f"its pytest session ended before running any test (exit code {code}){errors}\n")
    return code


def _serve_functions(spec: dict[str, Any], channel: Channel) -> int:
    """Function mode: call ``module.qualname(rank, *args, **kwargs)`` per command."""
    channel.event(Ready(), wake=True)
    for command in channel.commands(CallFunction):
        _start_test()
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
            from .wording import threads_left_text

            outcome, data = "failed", {"exception": threads_left_text(threads_left, THREAD_JOIN_WAIT)}
        channel.event(Report("call", outcome, data=data), wake=True)
        channel.event(_done_event(threads_left), wake=True)
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
    leftovers.become_subreaper()
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
        from . import recorder

        _recorders.insert(0, recorder)
        for each in _recorders:
            each.install(channel.log)
        _context = RankContext(spec["rank"], spec["world_size"], spec["backend"], spec["init"])
        run = _run_pytest if spec["mode"] == "pytest" else _serve_functions
        code = run(spec, channel)
    except BaseException:
        _fatal(channel, traceback.format_exc())
        code = 3
    leftovers.end_processes([pid for pid in leftovers.descendants() if pid != keeper])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: torch's atexit work can block on a broken group.
    os._exit(code)

"""A rank's link to its controller: its command pipe, its event log, its state after a test."""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from types import ModuleType
from typing import Any, TypeVar

from pytest_ddp.common.bounds import TEXT_LIMIT, cut
from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.protocol import (
    CallFunction,
    Done,
    Event,
    Fatal,
    ProtocolError,
    Ready,
    Report,
    RunItem,
    SessionEnd,
    Stop,
    TestStart,
    ThreadRaised,
    WarningRecorded,
    decode_command,
)
from pytest_ddp.faults import Fault
from pytest_ddp.rank import default_group
from pytest_ddp.rank.context import rank_context
from pytest_ddp.record import injector

# Seconds a test's asynchronous work nobody waited for gets to complete once the test is over.
IN_FLIGHT_WAIT = 1.0

WorkCommand = TypeVar("WorkCommand", RunItem, CallFunction)


class Channel:
    """The rank's end of its link to the controller."""

    def __init__(self, events_path: str, commands: Connection, notify: Connection) -> None:
        self.log = EventLog(events_path)
        self._commands = commands
        self._notify = notify
        self.recorders: list[ModuleType] = []  # torch's, and mpi4py's in an MPI group

    def event(self, event: Event, wake: bool = False) -> None:
        self.log.write(bounded(event))
        if wake:
            try:
                self._notify.send_bytes(b"!")
            except OSError:
                pass  # the controller is gone; the next command read ends this rank

    def commands(self, accepted: type[WorkCommand]) -> Iterator[WorkCommand]:
        """The controller's commands for this rank's mode, until "stop" or the pipe closes; any
        other command is the controller's bug (:class:`ProtocolError`)."""
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

    def start_test(self, test_id: str, faults: tuple[Fault, ...] | list[Fault]) -> None:
        """A test begins on this rank: the recorders count its calls from 0, its faults on this rank
        are armed, and the controller is told."""
        for recorder in self.recorders:
            recorder.start_test()
        injector.arm(faults, rank_context().rank, self.log)
        self.event(TestStart(test_id))

    def test_done(
        self, threads_left: list[dict[str, str]], interrupted: dict[str, Any] | None = None
    ) -> None:
        """The test is over on this rank: tell the controller the state it leaves the rank in."""
        # The test's asynchronous work still not done IN_FLIGHT_WAIT seconds after it ended.
        in_flight = [work for each in self.recorders for work in each.unfinished_work(IN_FLIGHT_WAIT)]
        peak_cuda = None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            peak_cuda = int(torch.cuda.max_memory_allocated())
        # ru_maxrss is in KiB on Linux.
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        intact, alive = _group_state()
        done = Done(
            group_intact=intact,
            group_alive=alive,
            in_flight=in_flight,
            threads_left=threads_left,
            interrupted=interrupted,
            peak_rss=peak_rss,
            peak_cuda=peak_cuda,
        )
        self.event(done, wake=True)


def _bounded_data(value: Any) -> Any:
    """A JSON value with each string :func:`cut`, and each list of strings (a traceback's lines)
    cut as the one text it shows."""
    if isinstance(value, str):
        return cut(value)
    if isinstance(value, dict):
        return {key: _bounded_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(item, str) for item in value) and sum(map(len, value)) > TEXT_LIMIT:
            return cut("\n".join(value)).split("\n")
        return [_bounded_data(item) for item in value]
    return value


def bounded(event: Event) -> Event:
    """``event`` with its texts cut (:func:`cut`) where it carries any: the channel, the terminal and
    every report file are bounded here, at the one place a rank's text leaves it. run()'s returned
    value (a pass in function mode, pickled) is data, and travels whole."""
    if isinstance(event, (Report, SessionEnd)) and event.data is not None:
        if event.outcome != "passed" or "$report_type" in event.data:
            event.data = _bounded_data(event.data)
    elif isinstance(event, (Fatal, ThreadRaised)):
        event.error = cut(event.error)
    elif isinstance(event, WarningRecorded):
        event.warning = _bounded_data(event.warning)
    elif isinstance(event, Ready):
        event.errors = [cut(error) for error in event.errors]
    return event


def _group_state() -> tuple[bool, bool]:
    """(intact, alive) of the rank's default process group, as :class:`Done` reports them."""
    if rank_context().backend == "mpi":  # the world the launcher made, until MPI_Finalize
        from mpi4py import MPI

        return not MPI.Is_finalized(), False
    return default_group.test_ended()


def fatal(channel: Channel, error: str) -> None:
    """The rank cannot go on: tell the controller, and say why on stderr (shown for a dead rank)."""
    error = cut(error)
    channel.event(Fatal(error), wake=True)
    sys.stderr.write(error)

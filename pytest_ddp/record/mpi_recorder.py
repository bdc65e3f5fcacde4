"""The MPI recorder: every call a rank makes on an mpi4py communicator, written before and after it runs.

mpi4py's types cannot be patched, but a subclass instance made from a communicator is the same
communicator: :func:`install` replaces ``MPI.COMM_WORLD`` with a :class:`RecordingComm`.  A
nonblocking call runs until its :class:`RecordingRequest` completes; ``MPI.Request`` becomes a
subclass every request is an instance of, so ``MPI.Request.Waitall`` is recorded too.  A receive
that left its source or tag open says in its ``ret`` which message it got, for
:mod:`pytest_ddp.diagnose.mpi_matching`.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, NoReturn

import mpi4py
from mpi4py import MPI

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.ops import MPI_ABORT, MPI_OPS, Op
from pytest_ddp.record import describe, numbering
from pytest_ddp.record.mpi_describe import Comm, collective, p2p, reductions

WORLD = "WORLD"

_log: EventLog | None = None
_originals: dict[str, Any] = {}  # "COMM_WORLD", "Request": what install replaced in the MPI module
_test = 0  # which test: a communicator made by an earlier test is named "before-..."
_comms_made = 0  # communicators made in the current test, for their names
_world_group: MPI.Group | None = None


class _Pending(NamedTuple):
    """A request whose call has no ret yet."""

    call: int  # its index
    ranks: list[int] | None  # a receive that left its source or tag open: its communicator's world ranks


# call index -> its RecordingRequest, until it completes: the current test's (one of an earlier test
# is not there, or another is there in its place).  The test's threads add and complete requests (one
# may wait for a request another made, or outlive the test), the rank's main thread tests and clears
# them after the test (unfinished_work).  Every change is made under numbering's lock, so that a
# call's ret is written once and a clear cannot fall between a check and its del; the reads outside
# it (_recorded, unfinished_work's loop) are single dict operations, atomic under the GIL, and only
# choose what to try: _finish checks again under the lock.
_pending: dict[int, Any] = {}


# -- what a communicator looks like ------------------------------------------------------


def _describe_comm(comm: MPI.Intracomm, name: str) -> Comm:
    size = comm.Get_size()
    if name == WORLD or _world_group is None:
        ranks = list(range(size))
    else:
        group = comm.Get_group()
        ranks = [int(r) for r in group.Translate_ranks(list(range(size)), _world_group)]
        group.Free()
    return Comm(name, ranks, comm.Get_rank(), describe.group_text(name, ranks), _test)


def _comm(comm: Any) -> Comm:
    """The description of a recording communicator (cached on it)."""
    described: Comm | None = getattr(comm, "_ddp", None)
    if described is None:  # made by a method that is not recorded (Idup, Create_group, ...)
        described = comm._ddp = _describe_comm(comm, "?")
    elif described.test != _test and described.name != WORLD:
        name = described.name if described.name.startswith("before-") else f"before-{described.name}"
        described = comm._ddp = _describe_comm(comm, name)
    return described


# -- rets and waits --------------------------------------------------------------------


def _write_ret(
    log: EventLog, index: int, error: BaseException | None, status: MPI.Status | None, ranks: list[int] | None
) -> None:
    """Call ``index`` returned (or raised ``error``); an open receive (``ranks``: its communicator's)
    with the message it got."""
    if error is not None or status is None or ranks is None:
        numbering.write_ret(log, index, error)
        return
    source = status.Get_source()
    world_source = ranks[source] if 0 <= source < len(ranks) else None
    numbering.write_ret(log, index, source=world_source, tag=status.Get_tag())


def _finish(
    request: Any, pending: _Pending, error: BaseException | None, status: MPI.Status | None = None
) -> None:
    """A request completed (or failed): its call's ret, unless its test is over."""
    log = _log
    with numbering.numbers.lock:
        if _pending.get(pending.call) is not request:
            return
        del _pending[pending.call]
        if log is not None:
            _write_ret(log, pending.call, error, status, pending.ranks)


def _recorded(request: Any) -> _Pending | None:
    """The request's pending call, if it is one of the current test's."""
    pending: _Pending | None = getattr(request, "_ddp", None)
    return pending if pending is not None and _pending.get(pending.call) is request else None


_Request: Any = MPI.Request  # mpi4py's own, whatever install makes of MPI.Request


def _tested(result: Any) -> bool:
    """Whether Test or test completed the request (test returns (flag, object))."""
    return bool(result[0] if isinstance(result, tuple) else result)


class _AnyRequest(type):
    """``isinstance(r, MPI.Request)`` stays true of every request once MPI.Request is ours."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _Request)

    def __subclasscheck__(cls, other: type) -> bool:
        return issubclass(other, _Request)


class RecordingRequest(MPI.Request, metaclass=_AnyRequest):
    """A request of a recorded call: its completion is the call's ret.  Once installed, it is
    ``MPI.Request`` too, so that its Waitall and waitall are recorded."""

    __slots__ = ("_ddp",)
    _ddp: _Pending | None

    def _complete(self, method: Callable[..., Any], status: MPI.Status | None, blocks: bool) -> Any:
        """mpi4py's ``method``, with a wait event before a blocking one and the ret once complete."""
        pending = _recorded(self)
        if pending is None:
            return method(self, status)
        log = _log
        if blocks and log is not None:
            numbering.write_wait(log, pending.call)
        if status is None and pending.ranks is not None:  # to learn which message a receive got
            status = MPI.Status()
        try:
            result = method(self, status)
        except BaseException as exc:
            _finish(self, pending, exc)
            raise
        if blocks or _tested(result):  # wait's result is the object received, maybe None
            _finish(self, pending, None, status)
        return result

    def Wait(self, status: MPI.Status | None = None) -> Literal[True]:
        return self._complete(_Request.Wait, status, blocks=True)

    def wait(self, status: MPI.Status | None = None) -> Any:
        return self._complete(_Request.wait, status, blocks=True)

    def Test(self, status: MPI.Status | None = None) -> bool:
        return bool(self._complete(_Request.Test, status, blocks=False))

    def test(self, status: MPI.Status | None = None) -> tuple[bool, Any]:
        return self._complete(_Request.test, status, blocks=False)

    # Waiting for each in turn completes when Waitall would (MPI progresses every request while
    # the caller waits for one), and the log says which request the rank still waits for.
    @classmethod
    def Waitall(
        cls, requests: Sequence[MPI.Request], statuses: list[MPI.Status] | None = None
    ) -> Literal[True]:
        for request, status in zip(requests, _statuses(len(requests), statuses)):
            RecordingRequest.Wait(request, status)  # type: ignore[arg-type]
        return True

    @classmethod
    def waitall(cls, requests: Sequence[MPI.Request], statuses: list[MPI.Status] | None = None) -> list[Any]:
        return [
            RecordingRequest.wait(request, status)  # type: ignore[arg-type]
            for request, status in zip(requests, _statuses(len(requests), statuses))
        ]


def _statuses(count: int, statuses: list[MPI.Status] | None) -> list[MPI.Status | None]:
    """The caller's statuses for Waitall, one per request, as mpi4py fills them in."""
    if statuses is None:
        return [None] * count
    statuses.extend(MPI.Status() for _ in range(count - len(statuses)))
    return list(statuses[:count])


# -- the communicator ----------------------------------------------------------------


def _made(result: Any, parent: Comm) -> Any:
    """A communicator a recorded call made, recording too: named by creation order, a Split's part
    also by its lowest world rank."""
    global _comms_made
    _comms_made += 1  # on every member, also those that get COMM_NULL: names agree
    if not isinstance(result, MPI.Intracomm) or result == MPI.COMM_NULL:
        return result
    comm = result if isinstance(result, RecordingComm) else RecordingComm(result)
    described = _describe_comm(comm, str(_comms_made))
    if len(described.ranks) < len(parent.ranks):
        name = f"{_comms_made}.{min(described.ranks)}"
        described = described._replace(name=name, text=describe.group_text(name, described.ranks))
    comm._ddp = described
    return comm


def _wrap(spec: Op) -> Callable[..., Any]:
    original = getattr(MPI.Intracomm, spec.method)
    parameters = list(inspect.signature(original).parameters.values())[1:]  # after self
    names = tuple(p.name for p in parameters)
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    describer = p2p if spec.pairs else collective
    prefix = f'"op":"{spec.name}",'
    takes_status = "status" in names
    returns_request = not spec.blocks and not spec.probe

    @functools.wraps(original)
    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        log = _log
        if log is None:
            return original(self, *args, **kwargs)
        try:
            bound = dict(defaults)
            bound.update(zip(names, args))
            if kwargs:
                bound.update(kwargs)
            comm = _comm(self)
            fields, key, open_ended = describer(spec, bound, comm)
            body = f'{prefix}{comm.text},{describe.site(sys._getframe(1))},"t":{time.time()!r}{fields}'
        except Exception:  # describing must never break the user's call
            return original(self, *args, **kwargs)
        status = None
        if open_ended and takes_status:
            status = bound.get("status")
            if status is None:
                status = kwargs["status"] = MPI.Status()
        index = numbering.numbers.write_call(log, body, key)
        result = numbering.run_call(log, index, lambda: original(self, *args, **kwargs))
        if returns_request:
            request = RecordingRequest(result)
            request._ddp = _Pending(index, comm.ranks if open_ended else None)
            with numbering.numbers.lock:
                _pending[index] = request
            return request
        if spec.makes_comm:
            result = _made(result, comm)
        _write_ret(log, index, None, status, comm.ranks)
        return result

    return recorded


def _abort(self: Any, errorcode: int = 0) -> NoReturn:
    """Written as the rank's last call, with its errorcode; then the rank ends, as MPI says:
    MPICH's Abort returns once it has asked its launcher to end the world, and the test went on."""
    log, index = _log, None
    if log is not None:
        try:
            where = f'{_comm(self).text},{describe.site(sys._getframe(1))},"t":{time.time()!r}'
            body = f'"op":"{MPI_ABORT}",{where},"extra":{{"errorcode":{int(errorcode)}}}'
            index = numbering.numbers.write_call(log, body, None)
        except Exception:  # describing must never break the user's call
            pass
    try:
        MPI.Intracomm.Abort(self, errorcode)
    except BaseException as exc:  # it did not abort (an errorcode that is no C int): the rank goes on
        if log is not None and index is not None:
            numbering.write_ret(log, index, exc)
        raise
    os._exit(errorcode & 0xFF)  # what MPI hands the environment; the event log says the rest


class RecordingComm(MPI.Intracomm):
    """An intracommunicator whose communication (:data:`pytest_ddp.common.ops.MPI_OPS`) is recorded."""

    __slots__ = ("_ddp",)
    _ddp: Comm


for _spec in MPI_OPS.values():
    if hasattr(MPI.Intracomm, _spec.method):
        setattr(RecordingComm, _spec.method, _abort if _spec.name == MPI_ABORT else _wrap(_spec))


# -- the rank's side of a test -----------------------------------------------------------


def install(log: EventLog) -> None:
    """Record the calls on ``MPI.COMM_WORLD`` and what is made from it into ``log`` (again: switch it)."""
    global _log, _world_group
    _log = log
    if _originals:
        return
    describe.add_internal(mpi4py)
    for name, op in vars(MPI).items():
        if isinstance(op, MPI.Op) and op != MPI.OP_NULL:
            reductions[op.handle] = name
    world = MPI.COMM_WORLD
    _originals.update(COMM_WORLD=world, Request=MPI.Request)
    _world_group = world.Get_group()
    recording = RecordingComm(world)
    recording._ddp = _describe_comm(recording, WORLD)
    setattr(MPI, "COMM_WORLD", recording)  # noqa: B010 - mpi4py's stubs call it final
    setattr(MPI, "Request", RecordingRequest)  # noqa: B010


def uninstall() -> None:
    """Put the MPI module back as it was (for tests)."""
    global _log, _world_group
    for name, original in _originals.items():
        setattr(MPI, name, original)
    _originals.clear()
    if _world_group is not None:
        _world_group.Free()
        _world_group = None
    _log = None


def start_test() -> None:
    """A new test begins: call numbers start again, the last test's requests are forgotten."""
    global _test, _comms_made
    numbering.numbers.reset()
    _test += 1
    _comms_made = 0
    with numbering.numbers.lock:
        _pending.clear()


def unfinished_work(wait: float) -> list[dict[str, Any]]:
    """The current test's requests (``Isend``, ``irecv``, ...) not complete ``wait`` seconds
    after it: ``[{"i": call index, "err": why}]``, as :func:`pytest_ddp.record.recorder.unfinished_work`.
    MPI has no wait with a timeout, so they are tested until all complete or the time is up."""
    deadline = time.monotonic() + wait
    while _pending:
        for request in list(_pending.values()):
            RecordingRequest.Test(request)
        if not _pending or time.monotonic() >= deadline:
            break
        time.sleep(0.001)  # polling MPI, not waiting for another process's event
    why = f"request not complete {wait:g} s after the test"
    with numbering.numbers.lock:
        left = sorted(_pending)
        _pending.clear()  # a later wait on one is not this test's
    return [{"i": index, "err": why} for index in left]

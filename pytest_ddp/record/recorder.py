"""The recorder: every torch.distributed call of a rank, written before and after it runs.

Installed in each rank before test modules are imported.  It replaces the
public collective and point-to-point functions in ``torch.distributed`` and
``torch.distributed.distributed_c10d`` (so ``from torch.distributed import
all_reduce`` after install gets the wrapper too) and writes a ``call`` event
on entry and a ``ret`` event on exit to the rank's event log (see
:mod:`pytest_ddp.common.protocol`).  The event is on disk before the call blocks, so
the controller sees where a rank is stuck while it is stuck, and after it died.

Only the outermost call is recorded: ``all_gather_object`` calls
``all_gather`` inside, through the module's globals, which are wrapped too; a
per-thread depth counter keeps the inner calls out.

Collectives that reach a process group's backend without passing through one
of those functions (DDP's reducer in C++, the functional collectives of DTensor
and compiled code) are recorded there (:mod:`pytest_ddp.record.backend_recorder`).
They and the functions' ``async_op=True`` collectives are asynchronous: a
``wait`` event is written when the caller waits for one (``work.wait()``,
``wait_tensor``), so a rank waiting for a gradient bucket shows as inside
``all_reduce #k``, and its ``ret`` when that wait returns, or else when the rank
next sees its work complete (see :class:`~.numbering.Pending`).

While a test has faults armed (:mod:`pytest_ddp.record.injector`), each recorded call
first asks the injector, which may kill, delay, raise or replace it before it is written.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.ops import DESTROY, OPS, Op
from pytest_ddp.record import backend_hook, backend_recorder, describe, injector, state
from pytest_ddp.record.injector import armed as _armed
from pytest_ddp.record.numbering import first_line, write_ret

_local = state.local
_numbers = state.numbering
_pending = state.pending
# id(work) -> (call index, work) of the current test's asynchronous calls: isend,
# irecv, batch_isend_irecv and async_op=True collectives.  Checked when the test ends;
# a wait() on one of them is recorded.
_works: dict[int, tuple[int, Any]] = {}


def start_test() -> None:
    """A new test begins: call numbers and sequence numbers start again."""
    _pending.clear()  # first: a ret swept now belongs to the test that ended
    _pending.start_looking()
    backend_hook.disarm()  # the test arms the hook again if it needs it
    _numbers.reset()
    describe.start_test()
    _works.clear()
    backend_recorder.start_test()


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """This thread's torch.distributed calls in the block are no test's: the rank's own set-up of
    its process group (:mod:`pytest_ddp.rank.default_group`)."""
    depth = _local.depth
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def harness_collective(op: str, world_size: int, run: Callable[[], Any], root: int | None = None) -> Any:
    """``run()``, a collective a test harness makes through the rank group's store rather than
    torch.distributed (:mod:`pytest_ddp.adopt.torch_classes`), recorded as ``op`` on a group named
    ``harness``: the watchdog then sees a rank waiting in it as waiting for its peers there."""
    log = state.log
    if log is None or _local.depth:
        return run()
    _local.depth = 1
    try:
        ranks = ",".join(map(str, range(world_size)))
        site = describe.site(sys._getframe(1))
        body = f'"op":"{op}","group":"harness","ranks":[{ranks}],{site},"t":{time.time()!r}'
        if root is not None:
            body += f',"root":{root}'
        index, _ = _numbers.write_call(log, body, ("harness",))
        result = backend_recorder.run_call(log, index, run)
        write_ret(log, index)
        return result
    finally:
        _local.depth = 0


def unfinished_work(wait: float) -> list[dict[str, Any]]:
    """The current test's asynchronous calls whose work has not completed: each
    gets up to ``wait`` seconds in all.  ``[{"i": call index, "err": why}]``.

    Work the test waited for is complete already and costs nothing here.
    Gloo marks send and receive work complete only inside ``wait()``, so the
    rest is waited for, with a timeout: never without one (a receive nobody
    sends to would block forever), and never twice (a second wait on a send
    waits for another send).  That includes work nobody waits for from Python
    (DDP's buckets, which its reducer waits for in C++), whose ret is then
    written, so that the log is whole before the rank says it is done.
    Last, the functional collectives the test never waited for
    (:func:`pytest_ddp.record.backend_recorder.wait_unwaited`).
    """
    deadline = time.monotonic() + wait
    unfinished = []
    wait_unrecorded = state.originals.get((dist.Work, "wait"), dist.Work.wait)
    works = {id(work): (index, work) for index, work in _works.values()}
    works.update((id(work), (index, work)) for index, (work, _) in _pending.works.items())
    for index, work in works.values():
        if not work.is_completed():  # c10d reads a zero timeout as "no timeout"
            try:
                wait_unrecorded(work, timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except Exception as exc:  # timed out, or the work failed
                unfinished.append({"i": index, "err": first_line(exc)})
                continue
        _pending.settle(index)  # an isend's or irecv's ret
    _works.clear()
    _pending.sweep()
    _pending.clear()  # what is left timed out, and is listed
    return unfinished + backend_recorder.wait_unwaited(deadline, wait)


# -- the Python functions ------------------------------------------------------


def _wrap(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    spec = OPS[op]
    describer = describe.DESCRIBERS[spec.kind]
    names = tuple(inspect.signature(original).parameters)
    prefix = f'"op":"{op}",'
    depth = 0 if spec.kind == "batch" else 1  # a batch's sends and receives are recorded too

    # The recorder's hot path: write the call, run it, write how it ended.
    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        log = state.log
        if log is None or _local.depth or backend_hook.tracing():
            return original(*args, **kwargs)
        _local.depth = depth
        try:
            if _pending.works:
                _pending.sweep()
            if _armed:
                fault = injector.on_call(op, sys._getframe(1), True)  # fires before the call
                if fault:
                    return injector.replaced(fault, recorded, _local, args, kwargs)  # skip, extra, change
            try:
                bound = dict(zip(names, args))
                bound.update(kwargs)
                group, fields, key = describer(op, spec, bound)
                site = describe.site(sys._getframe(1))
                body = f'{prefix}{group.text},{site},"t":{time.time()!r}{fields}'
            except Exception:  # describing must never break the user's call
                return original(*args, **kwargs)
            index, _ = _numbers.write_call(log, body, key)
            handed = None
            if spec.is_collective:
                handed = backend_hook.collectives_handed(bound.get("group"))
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                write_ret(log, index, exc, backend_hook.raised_before_backend(bound.get("group"), handed))
                raise
            asynchronous = spec.kind in ("p2p", "batch") or bound.get("async_op")
            if result is not None and asynchronous and _left_running(spec, index, result):
                return result
            write_ret(log, index)
            return result
        finally:
            _local.depth = 0

    if op == DESTROY:
        return _unless_nothing_to_destroy(original, recorded)
    return recorded


def _left_running(spec: Op, index: int, result: Any) -> bool:
    """Keep the Works that asynchronous call ``index`` returned, so that a wait on one is
    recorded; whether the call runs on until it is waited for (a collective: or until its work
    completes), its ret written then."""
    returned = result if isinstance(result, list) else [result]
    works = [work for work in returned if isinstance(work, dist.Work)]
    for work in works:
        if spec.kind == "batch" and id(work) in _works:
            continue  # a batch's works on Gloo are its sends' and receives': theirs
        _works[id(work)] = (index, work)
    if len(works) != 1:
        return False
    if spec.kind == "p2p":
        return _pending.owe(index)
    return spec.is_collective and _pending.add(index, works[0])


def _unless_nothing_to_destroy(
    original: Callable[..., Any], recorded: Callable[..., Any]
) -> Callable[..., Any]:
    """``destroy_process_group()`` with no default group raises at once and touches nothing: not a
    call to record (torch's harness classes make it after each test that ended its group, and
    catch it)."""

    @functools.wraps(original)
    def destroy(group: Any = None) -> Any:
        if group is None and not dist.is_initialized():
            return original(group)
        return recorded(group)

    return destroy


def _recorded_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait`` that records which asynchronous call the caller waits for."""

    @functools.wraps(original)
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        recorded = _works.get(id(work))
        if recorded is None or recorded[1] is not work:  # the usual case: a blocking call's own wait
            return original(work, *args, **kwargs)
        return backend_recorder.waited(recorded[0], lambda: original(work, *args, **kwargs))

    return wait


# -- install -------------------------------------------------------------------


def install(log: EventLog) -> None:
    """Record this process's torch.distributed calls into ``log`` (idempotent; a second
    call only switches the log)."""
    state.set_log(log)
    if state.originals:
        return
    for op, spec in OPS.items():
        if spec.python and hasattr(c10d, op):  # else not in this torch
            state.patch_function(op, functools.partial(_wrap, op))
    state.patch(dist.Work, "wait", _recorded_wait(dist.Work.wait))
    backend_recorder.install()


def uninstall() -> None:
    """Put torch.distributed back as it was (for tests)."""
    state.unpatch()
    backend_hook.uninstall()
    describe.forget_groups()
    state.set_log(None)

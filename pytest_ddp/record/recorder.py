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
and compiled code) are recorded there (:mod:`pytest_ddp.record.backend_hook`), in the
group's own sequence, marked ``"extra": {"via": "backend"}``.  They and the
functions' ``async_op=True`` collectives are asynchronous: a ``wait`` event is
written when the caller waits for one (``work.wait()``, ``wait_tensor``), so a
rank waiting for a gradient bucket shows as inside ``all_reduce #k``, and its
``ret`` when that wait returns, or else when the rank next sees its work
complete (see :class:`~.numbering.Pending`); a functional collective never waited for, at the test's end.

While a test has faults armed (:mod:`pytest_ddp.record.injector`), each recorded call
first asks the injector, which may kill, delay, raise or replace it before it is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.ops import BACKEND_REDUCTION, DESTROY, OPS, BackendOp
from pytest_ddp.record import backend_hook, describe, injector
from pytest_ddp.record.injector import armed as _armed
from pytest_ddp.record.numbering import Pending, first_line, numbers, write_ret


class _Depth(threading.local):
    depth = 0  # > 0 while this thread is inside a recorded call


_local = _Depth()
_numbers = numbers()
_pending = Pending()
_log: EventLog | None = None
_originals: dict[tuple[Any, str], Any] = {}
# id(work) -> (call index, work) of the current test's asynchronous calls: isend,
# irecv, batch_isend_irecv and async_op=True collectives.  Checked when the test ends;
# a wait() on one of them is recorded.
_works: dict[int, tuple[int, Any]] = {}
# The current test's calls recorded at the backend, by the data pointer of their tensors:
# where a functional collective's wait_tensor finds the call it waits for.
_backend_tensors: dict[int, int] = {}
# The current test's functional collectives not waited for yet: call index -> what the call
# returned (its output tensors, kept to be waited for at the test's end).
_unwaited: dict[int, Any] = {}


def start_test() -> None:
    """A new test begins: call numbers and sequence numbers start again."""
    _pending.clear()  # first: a ret swept now belongs to the test that ended
    _pending.start_looking()
    backend_hook.disarm()  # the test arms the hook again if it needs it
    _numbers.reset()
    describe.start_test()
    backend_hook.start_test()
    _works.clear()
    _backend_tensors.clear()
    _unwaited.clear()


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
    log = _log
    if log is None or _local.depth:
        return run()
    _local.depth = 1
    try:
        ranks = ",".join(map(str, range(world_size)))
        fields = "" if root is None else f',"root":{root}'
        body = f'"op":"{op}","group":"harness","ranks":[{ranks}],{describe.site(sys._getframe(1))},"t":{time.time()!r}'
        index, _ = _numbers.write_call(log, body + fields, ("harness",))
        try:
            result = run()
        except BaseException as exc:
            write_ret(log, index, exc)
            raise
        log.write_line(f'{{"e":"ret","i":{index},"t":{time.time()!r},"ok":true}}')
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
    """
    deadline = time.monotonic() + wait
    unfinished = []
    wait_unrecorded = _originals.get((dist.Work, "wait"), dist.Work.wait)
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
    return unfinished + _wait_unwaited(deadline, wait)


def _wait_unwaited(deadline: float, wait: float) -> list[dict[str, Any]]:
    """The test's functional collectives that it never waited for, waited for now until
    ``deadline`` (``wait`` seconds after the test); a ret is written for each whose wait returns
    before then.  Their wait_tensor takes no timeout, so a thread of its own waits (it releases
    the GIL while it blocks; left blocked, it goes with the rank, which is not used again)."""
    calls = sorted(_unwaited.items())
    _unwaited.clear()
    _backend_tensors.clear()  # so that the waits below are not recorded as the test's
    log = _log
    if not calls or log is None:
        return []
    returned: dict[int, str | None] = {}  # call index -> why its wait failed, None if it did not
    lock = threading.Lock()  # no ret once the deadline has passed

    def wait_all() -> None:
        for index, result in calls:
            error = None
            try:
                for tensor in backend_hook.tensors_in((result,)):
                    backend_hook.wait_tensor(tensor)
            except Exception as exc:
                error = exc
            with lock:
                if index in returned:  # the deadline passed
                    return
                returned[index] = None if error is None else first_line(error)
                write_ret(log, index, error)

    waiting = threading.Thread(target=wait_all, name="pytest-ddp-unwaited-work", daemon=True)
    waiting.start()
    waiting.join(max(deadline - time.monotonic(), 0.0))
    with lock:
        for index, _ in calls:
            returned.setdefault(index, f"never waited for, and still running {wait:g} s after the test")
    return [{"i": index, "err": why} for index, why in returned.items() if why is not None]


# -- the Python functions ------------------------------------------------------


def _wrap(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    spec = OPS[op]
    describer = describe.DESCRIBERS[spec.kind]
    names = tuple(inspect.signature(original).parameters)
    prefix = f'"op":"{op}",'

    # The recorder's hot path: write the call, run it, write how it ended.
    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        log = _log
        if log is None or _local.depth or backend_hook.tracing():
            return original(*args, **kwargs)
        _local.depth = int(spec.kind != "batch")  # a batch's sends and receives are recorded too
        try:
            if _pending.works:
                _pending.sweep()
            if _armed and (fault := injector.on_call(op, sys._getframe(1), True)):  # fires before the call
                return injector.replaced(fault, recorded, _local, args, kwargs)  # skip, extra, change
            try:
                bound = dict(zip(names, args))
                bound.update(kwargs)
                group, fields, key = describer(op, spec, bound)
                body = f'{prefix}{group.text},{describe.site(sys._getframe(1))},"t":{time.time()!r}{fields}'
            except Exception:  # describing must never break the user's call
                return original(*args, **kwargs)
            index, _ = _numbers.write_call(log, body, key)
            handed = backend_hook.collectives_handed(bound.get("group")) if spec.is_collective else None
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                write_ret(log, index, exc, backend_hook.raised_before_backend(bound.get("group"), handed))
                raise
            if result is not None and (spec.kind in ("p2p", "batch") or bound.get("async_op")):
                works = [w for w in (result if isinstance(result, list) else [result]) if isinstance(w, dist.Work)]
                for work in works:  # a batch's works on Gloo are its sends' and receives': theirs
                    _works[id(work)] = _works.get(id(work), (index, work)) if spec.kind == "batch" else (index, work)
                # An asynchronous call runs until it is waited for (a collective: or its work completes).
                if len(works) == 1 and (_pending.owe(index) if spec.kind == "p2p" else
                                        spec.is_collective and _pending.add(index, works[0])):
                    return result
            log.write_line(f'{{"e":"ret","i":{index},"t":{time.time()!r},"ok":true}}')
            return result
        finally:
            _local.depth = 0

    if op == DESTROY:
        return _unless_nothing_to_destroy(original, recorded)
    return recorded


def _unless_nothing_to_destroy(original: Callable[..., Any], recorded: Callable[..., Any]) -> Callable[..., Any]:
    """``destroy_process_group()`` with no default group raises at once and touches nothing: not a call
    to record (torch's harness classes make it after each test that ended its group, and catch it)."""

    @functools.wraps(original)
    def destroy(group: Any = None) -> Any:
        return original(group) if group is None and not dist.is_initialized() else recorded(group)

    return destroy


# -- at the backend: what no wrapped function issued (DDP, functional collectives, ...) --


def _recording() -> bool:
    return _log is not None and not _local.depth


def _record_backend(spec: BackendOp, args: dict[str, Any], submit: Callable[[], Any]) -> Any:
    """A c10d operation that no recorded function issued: write the call, submit it, and leave
    its ret to its wait or its work's completion."""
    log = _log
    if log is None:
        return submit()
    functional = backend_hook.issued_by_functional()
    issued_async = functional is not None  # its caller blocks later, in wait_tensor
    if functional:  # named as the functional collective (all_gather_into_tensor, not its _coalesced)
        spec = dataclasses.replace(spec, op=functional)
    index = _write_backend_call(log, spec, args, backend_hook.process_group, issued_async)
    if index is None:
        return submit()
    try:
        result = submit()
    except BaseException as exc:
        write_ret(log, index, exc)
        raise
    work = backend_hook.work_of(result)
    if work is None or not _pending.add(index, work):
        log.write_line(f'{{"e":"ret","i":{index},"t":{time.time()!r},"ok":true}}')
    if issued_async:  # where its caller's wait_tensor finds it
        for tensor in backend_hook.outputs(args):
            _backend_tensors[tensor.data_ptr()] = index
    return result


def _record_functional(spec: BackendOp, args: dict[str, Any], submit: Callable[[], Any]) -> Any:
    """A functional collective: write the call, submit it; its ret is written when its caller's
    wait_tensor returns, or at the test's end (:func:`unfinished_work`).  It returns output
    tensors whose work is done later, and no Work: nothing tells when, short of waiting."""
    log = _log
    if log is None:
        return submit()
    index = _write_backend_call(log, spec, args, backend_hook.named_group, True)
    if index is None:
        return submit()
    _local.depth = 1  # the c10d operation it issues, if hooked, is not recorded again
    try:
        result = submit()
    except BaseException as exc:
        write_ret(log, index, exc)
        raise
    finally:
        _local.depth = 0
    _unwaited[index] = result
    if isinstance(result, torch.Tensor):
        _backend_tensors[result.data_ptr()] = index
    else:
        for tensor in backend_hook.tensors_in(result):
            _backend_tensors[tensor.data_ptr()] = index
    return result


def _write_backend_call(
    log: EventLog,
    spec: BackendOp,
    args: dict[str, Any],
    group_in: Callable[[dict[str, Any]], dist.ProcessGroup],
    issued_async: bool,
) -> int | None:
    """Write the call event of an operation recorded at the dispatcher, made on the group that
    ``group_in(args)`` finds; its index, or None where describing it failed (the call then goes
    unrecorded: describing must never break it)."""
    if _pending.works:
        _pending.sweep()
    if _armed:
        injector.on_call(spec.op, sys._getframe(2))
    try:
        head, tail, key = _call_parts(spec, describe.group_of(group_in(args)), args, issued_async)
        body = f'{head}{describe.site(sys._getframe(2))},"t":{time.time()!r}{tail}'
    except Exception:  # describing must never break the call
        return None
    index, _ = _numbers.write_call(log, body, key)
    return index


def _call_parts(
    spec: BackendOp, group: describe.Group, args: dict[str, Any], issued_async: bool
) -> tuple[str, str, tuple[Any, ...]]:
    """The call event of an operation recorded at the dispatcher, but for its site and time
    (what goes before them, what goes after), and its key in the call numbering."""
    op = OPS[spec.op]
    fields = describe.tensors(args.get(spec.tensors)) if spec.tensors else ""
    key: tuple[Any, ...] = (group.name,)
    peer = None
    if spec.rank is not None:
        given = args[spec.rank]
        peer = group.ranks[given] if 0 <= given < len(group.ranks) else given
        fields += f',"{"peer" if op.pairs else "root"}":{peer}'
    if op.pairs:
        key = (group.name, op.direction, peer)
    if issued_async:
        fields += ',"async":true'
    return f'"op":"{spec.op}",{group.text},', f'{fields}{describe.backend_extra(op, args)}', key


def _functional_call_parts(op: str, group: str, tensors: Any, reduce_op: str | None) -> tuple[str, str, Any] | None:
    """:func:`_call_parts` of functional collective ``op`` (its table name) on the group named
    ``group``, reducing with ``reduce_op`` (None: it does not reduce), for the compiled
    kernels, which cache it; None where describing fails."""
    try:
        made_on = describe.group_of(backend_hook.named_group({"group_name": group}))
        return _call_parts(BackendOp(op, "input"), made_on, {"input": tensors, BACKEND_REDUCTION: reduce_op}, True)
    except Exception:
        return None


def _compiled_hooks() -> SimpleNamespace:
    """What the compiled kernels (:mod:`pytest_ddp.record.compiled`) record the functional collectives
    with: this module's state, which they share with the Python recorder, and its helpers."""
    return SimpleNamespace(
        recorder_globals=globals(),
        local=_local,
        pending_works=_pending.works,
        faults=injector.armed,
        numbers=_numbers,
        unwaited=_unwaited,
        backend_tensors=_backend_tensors,
        sweep=_pending.sweep,
        call_parts=_functional_call_parts,
        frame_site=describe.frame_site,
        site=describe.site,
        write_ret=write_ret,
        returned=_returned,
    )


def _waited(index: int | None, wait: Callable[[], Any]) -> Any:
    """The caller waits for asynchronous call ``index`` (None: one not recorded): a wait event,
    the wait, then the call's ret."""
    log = _log
    if log is None or index is None:
        return wait()
    log.write_line(f'{{"e":"wait","i":{index},"t":{time.time()!r}}}')
    try:
        result = wait()
    except BaseException as exc:
        _returned(log, index, exc)
        raise
    _returned(log, index, None)
    return result


def _returned(log: EventLog, index: int, error: BaseException | None) -> None:
    """The caller's wait for asynchronous call ``index`` returned: its ret, if not written yet."""
    if _unwaited.pop(index, None) is None:
        _pending.sweep(index, error)
    else:
        write_ret(log, index, error)


def _record_wait_tensor(tensor: torch.Tensor, wait: Callable[[], Any]) -> Any:
    """A functional collective's caller blocks on its result."""
    index = _backend_tensors.get(tensor.data_ptr())
    if index is not None and index not in _unwaited and index not in _pending.works:
        index = None  # waited for already (each tensor of a coalesced call, or twice)
    return _waited(index, wait)


def _recorded_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait`` that records which asynchronous call the caller waits for."""

    @functools.wraps(original)
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        recorded = _works.get(id(work))
        if recorded is None or recorded[1] is not work:  # the usual case: a blocking call's own wait
            return original(work, *args, **kwargs)
        return _waited(recorded[0], lambda: original(work, *args, **kwargs))

    return wait


# -- install -------------------------------------------------------------------


# Out of what torch.compile compiles (its callees too where ``recursive``), traced as what it replaces.
def _patch(owner: Any, name: str, replacement: Any, recursive: bool = True) -> None:
    original = _originals.setdefault((owner, name), getattr(owner, name))
    backend_hook.traced_as(original, backend_hook.out_of_compile(replacement, recursive))
    setattr(owner, name, replacement)


def install(log: EventLog) -> None:
    """Record this process's torch.distributed calls into ``log`` (idempotent; a second
    call only switches the log)."""
    global _log
    _log = _pending.log = log
    if _originals:
        return
    for op in (name for name, spec in OPS.items() if spec.python):
        if hasattr(c10d, op):  # else not in this torch
            _patch_function(op, functools.partial(_wrap, op))
    _patch(dist.Work, "wait", _recorded_wait(dist.Work.wait))
    if backend_hook.install(_record_backend, _record_functional, _record_wait_tensor, _recording, _compiled_hooks()):
        # Its constructor syncs in C++, its reducer runs in C++ after each forward (a model built by an
        # earlier test, or a module fixture, arms the hook again in this one); its module compiles.
        _patch(DistributedDataParallel, "__init__", _arming(DistributedDataParallel.__init__), False)
        _patch(DistributedDataParallel, "forward", _arming(DistributedDataParallel.forward), False)
        if hasattr(c10d, "_coalescing_manager"):  # else not in this torch
            _patch_function("_coalescing_manager", _arming, False)
        if hasattr(dist, "_broadcast_coalesced"):  # DDP's and FSDP's syncs of module state, in C++
            _patch(dist, "_broadcast_coalesced", _arming(dist._broadcast_coalesced), False)


def _patch_function(name: str, replacement: Callable[[Callable[..., Any]], Any], recursive: bool = True) -> None:
    """Replace a torch.distributed function by ``replacement(original)``, in c10d and in dist where the same."""
    original = getattr(c10d, name)
    replaced = replacement(original)
    _patch(c10d, name, replaced, recursive)
    if getattr(dist, name, None) is original:
        _patch(dist, name, replaced, recursive)


def _arming(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, which issues collectives to the backend itself, not through the
    torch.distributed functions (DDP's reducer and constructor, a coalescing manager's coalesced
    call, the broadcast of module state): every c10d operation is hooked from its first call on,
    until the test ends."""

    @functools.wraps(original)
    def arming(*args: Any, **kwargs: Any) -> Any:
        backend_hook.arm()
        return original(*args, **kwargs)

    return arming


def uninstall() -> None:
    """Put torch.distributed back as it was (for tests)."""
    global _log
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()
    backend_hook.uninstall()
    describe.forget_groups()
    _log = _pending.log = None

"""The recorder: every torch.distributed call of a rank, written before and after it runs.

Installed in each rank before test modules are imported, it replaces the public collective and
point-to-point functions in ``torch.distributed`` and ``torch.distributed.distributed_c10d`` (so
a later ``from torch.distributed import all_reduce`` gets the wrapper too) and writes ``call`` and
``ret`` events to the rank's event log (:mod:`pytest_ddp.common.protocol`).  The call is on disk
before it blocks, so the controller sees where a rank is stuck, even after it died.

Only the outermost call is recorded (``all_gather_object`` calls ``all_gather`` through the
wrapped module globals): a per-thread depth counter keeps inner calls out.  Collectives that
bypass these functions are recorded at the backend (:mod:`pytest_ddp.record.backend_recorder`).
Asynchronous calls get a ``wait`` event when waited for (a rank waiting for a gradient bucket
shows inside its ``all_reduce``), and their ``ret`` when the wait returns or the work completes
(:class:`~.numbering.Pending`).  With faults armed, the injector
(:mod:`pytest_ddp.record.injector`) sees each call first.
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
from torch.nn.parallel import DistributedDataParallel

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.ops import DESTROY, OPS, Op
from pytest_ddp.record import backend_hook, backend_recorder, describe, injector, numbering
from pytest_ddp.record.injector import armed as _armed
from pytest_ddp.record.numbering import first_line, numbers, run_call, write_ret

_local = numbering.local
_pending = numbering.pending
# id(work) -> (call index, work) of the current test's asynchronous calls, checked when it ends.
_works: dict[int, tuple[int, Any]] = {}
originals: dict[tuple[Any, str], Any] = {}  # (owner, name) -> what install replaced there


def start_test() -> None:
    """A new test begins: call numbers and sequence numbers start again."""
    _pending.clear()  # first: a ret swept now belongs to the test that ended
    _pending.start_looking()
    backend_hook.disarm()  # the test arms the hook again if it needs it
    numbers.reset()
    describe.start_test()
    _works.clear()
    backend_recorder.start_test()


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """This thread's torch.distributed calls in the block are no test's (the rank's own set-up)."""
    depth = _local.depth
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def harness_collective(op: str, world_size: int, run: Callable[[], Any], root: int | None = None) -> Any:
    """``run()``, a harness's collective through the store (:mod:`pytest_ddp.adopt.torch_classes`),
    recorded as ``op`` on group ``harness`` so the watchdog sees who waits for whom."""
    log = numbering.log
    if log is None or _local.depth:
        return run()
    _local.depth = 1
    try:
        group = describe.group_text("harness", list(range(world_size)))
        body = f'"op":"{op}",{group},{describe.site(sys._getframe(1))},"t":{time.time()!r}'
        if root is not None:
            body += f',"root":{root}'
        index = numbers.write_call(log, body, ("harness",))
        result = run_call(log, index, run)
        write_ret(log, index)
        return result
    finally:
        _local.depth = 0


def unfinished_work(wait: float) -> list[dict[str, Any]]:
    """The current test's asynchronous calls whose work has not completed within ``wait`` seconds
    in all: ``[{"i": call index, "err": why}]``.

    Gloo marks send and receive work complete only inside ``wait()``, so the rest is waited for:
    with a timeout (a receive nobody sends to blocks forever), never twice (a second wait on a
    send waits for another send).  Their rets are written, so the log is whole before the rank
    says it is done; then :func:`pytest_ddp.record.backend_recorder.wait_unwaited`.
    """
    deadline = time.monotonic() + wait
    unfinished = []
    wait_unrecorded = originals.get((dist.Work, "wait"), dist.Work.wait)
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
        log = numbering.log
        if log is None or _local.depth or backend_hook.tracing():
            return original(*args, **kwargs)
        _local.depth = depth
        try:
            if _pending.works:
                _pending.sweep()
            if _armed:
                fault = injector.on_call(op, sys._getframe(1), True)  # fires before the call
                if fault:
                    return injector.replaced(fault, recorded, args, kwargs)  # skip, extra, change
            try:
                bound = dict(zip(names, args))
                bound.update(kwargs)
                group, fields, key = describer(spec, bound)
                site = describe.site(sys._getframe(1))
                body = f'{prefix}{group.text},{site},"t":{time.time()!r}{fields}'
            except Exception:  # describing must never break the user's call
                return original(*args, **kwargs)
            index = numbers.write_call(log, body, key)
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
    """Keep the Works call ``index`` returned, so a wait is recorded; whether its ret waits for that."""
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
    """``destroy_process_group()`` with no default group raises at once and touches nothing: not
    recorded (torch's harness classes call it after each test, and catch it)."""

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
    """Record this process's torch.distributed calls into ``log`` (again: only switches the log)."""
    numbering.log = log
    if originals:
        return
    for op, spec in OPS.items():
        if spec.python and hasattr(c10d, op):  # else not in this torch
            _patch_function(op, functools.partial(_wrap, op))
    _patch(dist.Work, "wait", _recorded_wait(dist.Work.wait))
    if not backend_recorder.install():
        return
    # What issues collectives to the backend itself arms the c10d hooks.  DDP's constructor syncs
    # in C++, its reducer runs in C++ after each forward (a model built by an earlier test, or a
    # module fixture, arms the hook again in this one); its module compiles.
    _patch(DistributedDataParallel, "__init__", _arming(DistributedDataParallel.__init__), False)
    _patch(DistributedDataParallel, "forward", _arming(DistributedDataParallel.forward), False)
    _patch_function("_coalescing_manager", _arming, False)
    # DDP's and FSDP's syncs of module state, in C++
    _patch(dist, "_broadcast_coalesced", _arming(dist._broadcast_coalesced), False)


def _arming(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def arming(*args: Any, **kwargs: Any) -> Any:
        backend_hook.arm()
        return original(*args, **kwargs)

    return arming


def _patch(owner: Any, name: str, replacement: Any, recursive: bool = True) -> None:
    """``owner.name = replacement``, the original kept to be put back.  Out of what torch.compile
    compiles (its callees too where ``recursive``), and traced as what it replaces."""
    original = originals.setdefault((owner, name), getattr(owner, name))
    backend_hook.traced_as(original, backend_hook.out_of_compile(replacement, recursive))
    setattr(owner, name, replacement)


def _patch_function(
    name: str, replacement: Callable[[Callable[..., Any]], Any], recursive: bool = True
) -> None:
    """Replace a torch.distributed function by ``replacement(original)``, in c10d and dist alike."""
    original = getattr(c10d, name)
    replaced = replacement(original)
    _patch(c10d, name, replaced, recursive)
    if getattr(dist, name, None) is original:
        _patch(dist, name, replaced, recursive)


def rebind(modules: list[str]) -> None:
    """Give these modules, imported before the recorder, the recorded function wherever they bound
    c10d's by name (DTensor's ``from torch.distributed import scatter``): the torch modules the
    forkserver imported for the session's collection, which a rank would import after it."""
    replaced = originals.items()
    recorded = {id(original): getattr(c10d, name) for (owner, name), original in replaced if owner is c10d}
    for name in modules:
        namespace = getattr(sys.modules.get(name), "__dict__", {})
        for attribute, value in list(namespace.items()):
            if id(value) in recorded:
                originals.setdefault((sys.modules[name], attribute), value)
                namespace[attribute] = recorded[id(value)]


def uninstall() -> None:
    """Put torch.distributed back as it was (for tests)."""
    for (owner, name), original in originals.items():
        setattr(owner, name, original)
    originals.clear()
    backend_hook.uninstall()
    describe.start_test()  # the groups described are forgotten
    numbering.log = None

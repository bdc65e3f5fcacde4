"""The recorder at the backend: collectives that bypass torch.distributed's recorded functions.

DDP's C++ reducer, a coalescing manager, the functional collectives of DTensor, FSDP2 and
compiled code: :mod:`pytest_ddp.record.backend_hook` hands each such call here from its
dispatcher kernel, recorded in the group's sequence with ``"extra": {"via": "backend"}``.  Their
``ret`` comes with the wait (:class:`~pytest_ddp.record.numbering.Pending`), or at the test's end
(:func:`wait_unwaited`).  The c10d operations are hooked only once a test may issue such calls.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.ops import BackendOp
from pytest_ddp.record import backend_hook, describe, injector, numbering
from pytest_ddp.record.injector import armed as _armed
from pytest_ddp.record.numbering import first_line, numbers, run_call, write_ret, write_wait

_local = numbering.local
_pending = numbering.pending
# The current test's calls recorded at the backend, by the data pointer of their tensors:
# where a functional collective's wait_tensor finds the call it waits for.
_backend_tensors: dict[int, int] = {}
# The current test's functional collectives not waited for yet: call index -> its output tensors.
_unwaited: dict[int, Any] = {}


def start_test() -> None:
    """A new test begins: the last test's calls are forgotten."""
    _backend_tensors.clear()
    _unwaited.clear()


def install() -> bool:
    """Hook the functional collectives, ready to arm the c10d hooks; False if torch cannot."""
    return backend_hook.install(_record_backend, _record_functional, _record_wait_tensor, _recording)


def _recording() -> bool:
    return numbering.log is not None and not _local.depth


def _record_backend(spec: BackendOp, args: dict[str, Any], submit: Callable[[], Any]) -> Any:
    """A c10d operation no recorded function issued: write the call, submit it; the ret comes later."""
    log = numbering.log
    assert log is not None  # handed here only while recording (_recording)
    functional = backend_hook.issued_by.functional
    issued_async = functional is not None  # its caller blocks later, in wait_tensor
    if functional:  # named as the functional collective (all_gather_into_tensor, not its _coalesced)
        spec = dataclasses.replace(spec, op=functional)
    index = _write_call(log, spec, args, backend_hook.process_group, issued_async)
    if index is None:
        return submit()
    result = run_call(log, index, submit)
    work = backend_hook.work_of(result)
    if work is None or not _pending.add(index, work):
        write_ret(log, index)
    if issued_async:  # where its caller's wait_tensor finds it: the tensors it writes, which come first
        for tensor in backend_hook.tensors_in(itertools.islice(args.values(), 1)):
            _backend_tensors[tensor.data_ptr()] = index
    return result


def _record_functional(spec: BackendOp, args: dict[str, Any], submit: Callable[[], Any]) -> Any:
    """A functional collective: write the call, submit it; its ret comes with wait_tensor, or at the
    test's end (it returns no Work: nothing tells when it is done, short of waiting)."""
    log = numbering.log
    assert log is not None  # handed here only while recording (_recording)
    index = _write_call(log, spec, args, backend_hook.named_group, True)
    if index is None:
        return submit()
    _local.depth = 1  # the c10d operation it issues, if hooked, is not recorded again
    try:
        result = run_call(log, index, submit)
    finally:
        _local.depth = 0
    _unwaited[index] = result
    for tensor in backend_hook.tensors_in((result,)):
        _backend_tensors[tensor.data_ptr()] = index
    return result


def _write_call(
    log: EventLog,
    spec: BackendOp,
    args: dict[str, Any],
    group_in: Callable[[dict[str, Any]], dist.ProcessGroup],
    issued_async: bool,
) -> int | None:
    """Write the call event of an operation; its index, or None where describing it failed."""
    if _pending.works:
        _pending.sweep()
    if _armed:
        injector.on_call(spec.op, sys._getframe(2))
    try:
        group, fields, key = describe.backend_call(spec, args, group_in(args), issued_async)
        body = f'"op":"{spec.op}",{group.text},{describe.site(sys._getframe(2))},"t":{time.time()!r}{fields}'
    except Exception:  # describing must never break the call
        return None
    return numbers.write_call(log, body, key)


# -- waits -----------------------------------------------------------------------


def waited(index: int | None, wait: Callable[[], Any]) -> Any:
    """A wait event, the wait for asynchronous call ``index`` (None: not recorded), then its ret,
    if not written yet."""
    log = numbering.log
    if log is None or index is None:
        return wait()
    write_wait(log, index)
    error = None
    try:
        return wait()
    except BaseException as exc:
        error = exc
        raise
    finally:
        if _unwaited.pop(index, None) is None:
            _pending.sweep(index, error)
        else:
            write_ret(log, index, error)


def _record_wait_tensor(tensor: torch.Tensor, wait: Callable[[], Any]) -> Any:
    """A functional collective's caller blocks on its result."""
    index = _backend_tensors.get(tensor.data_ptr())
    if index is not None and index not in _unwaited and index not in _pending.works:
        index = None  # waited for already (each tensor of a coalesced call, or twice)
    return waited(index, wait)


def wait_unwaited(deadline: float, wait: float) -> list[dict[str, Any]]:
    """Wait until ``deadline`` for the test's functional collectives it never waited for, writing
    their rets; ``[{"i": call index, "err": why}]`` for each that failed or still runs.
    wait_tensor takes no timeout, so a thread waits (left blocked, it goes with the rank)."""
    calls = sorted(_unwaited.items())
    _unwaited.clear()
    _backend_tensors.clear()  # so that the waits below are not recorded as the test's
    log = numbering.log
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

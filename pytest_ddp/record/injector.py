"""The rank side of fault injection: arms the current test's faults and fires them, each
``fault`` event written first, so it survives the rank's kill.
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from pytest_ddp.common import procfs
from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.ops import OPS
from pytest_ddp.common.protocol import Injected
from pytest_ddp.faults import REPLACING, Fault, FaultError
from pytest_ddp.record import describe, numbering

# op -> the faults armed on this rank at that op; empty when none (the recorder's hot path tests it).
armed: dict[str, list[Fault]] = {}
_counts: dict[str, int] = {}  # op -> calls of it this test
_log: EventLog | None = None
_replacing = threading.local()  # .active: this thread makes the calls of a replacing fault
OOM_CHUNK = 64 * 2**20  # bytes allocated at a time
OOM_HEADROOM = 256 * 2**20  # address space left to the rank when it allocates until MemoryError


def arm(faults: tuple[Fault, ...] | list[Fault], rank: int, log: EventLog) -> None:
    """The faults of a new test (those of other ranks are ignored); none disarms."""
    global _log
    armed.clear()
    _counts.clear()
    _log = log
    for fault in faults:
        if fault.rank == rank:
            armed.setdefault(fault.at, []).append(fault)


def on_call(op: str, frame: FrameType | None, replaceable: bool = False) -> Fault | None:
    """The rank enters a call of ``op``: fire the fault armed at this count, if any; return one
    that replaces the call (for :func:`replaced`), whose calls are not counted."""
    faults = armed.get(op)
    if not faults or getattr(_replacing, "active", False):
        return None
    count = _counts[op] = _counts.get(op, 0) + 1
    for fault in faults:
        if fault.call == count:
            _fire(fault, json.loads("{" + describe.site(frame) + "}")["site"])
            if fault.action in REPLACING:
                if not replaceable:
                    raise FaultError(
                        f"{fault}: this {op} reached the backend without a torch.distributed function "
                        "(DDP's reducer, a functional collective, compiled code): it cannot be replaced"
                    )
                return fault
    return None


def replaced(
    fault: Fault, recorded: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """What the call replaced by ``fault`` returns (skip, extra or changed); the recorder's depth is
    cleared, so that these calls are recorded."""
    numbering.local.depth = 0
    _replacing.active = True
    try:
        if fault.action == "skip":
            return None
        if fault.action == "extra":
            recorded(*args, **kwargs)
            return recorded(*args, **kwargs)
        return _changed(fault, recorded, args, kwargs)
    finally:
        _replacing.active = False


def _changed(
    fault: Fault, recorded: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    bound = inspect.signature(recorded).bind(*args, **kwargs)
    name = OPS[fault.at].tensors
    tensor = bound.arguments.get(name) if name else None
    if fault.shape is not None or fault.dtype is not None:
        if not isinstance(tensor, torch.Tensor):
            raise FaultError(f"{fault}: its {name} is not one tensor ({type(tensor).__name__})")
        dtype = tensor.dtype if fault.dtype is None else getattr(torch, fault.dtype)
        shape = tensor.shape if fault.shape is None else fault.shape
        tensor = torch.zeros(shape, dtype=dtype, device=tensor.device)
        bound.arguments[name] = tensor  # type: ignore[index]
    reduction = OPS[fault.at].reduction  # set wherever reduce_op= is accepted (ops.REDUCING)
    if fault.reduce_op is not None and reduction is not None:
        bound.arguments[reduction] = getattr(dist.ReduceOp, fault.reduce_op)
    if fault.op is None:
        return recorded(*bound.args, **bound.kwargs)
    # Another of ops.INTERCHANGEABLE, on the same tensor and group, rooted at the group's first rank.
    other = OPS[fault.op]
    group = bound.arguments.get("group")
    given: dict[str, Any] = {"group": group}
    if other.tensors is not None:
        given[other.tensors] = tensor if isinstance(tensor, torch.Tensor) else torch.zeros(1)
    if other.rank is not None:
        given[other.rank] = 0 if group is None else dist.get_global_rank(group, 0)
    return getattr(dist, fault.op)(**given)


def _fire(fault: Fault, site: str) -> None:
    if _log is not None:
        _log.write(Injected(str(fault), fault.action, fault.at, fault.call, site))
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "exit":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(fault.code)
    elif fault.action == "raise":
        assert fault.exc is not None  # checked by faults.check
        raise fault.exc
    elif fault.action == "delay":
        time.sleep(fault.seconds)
    elif fault.action == "hang":
        threading.Event().wait()
    elif fault.action == "oom":
        _exhaust_memory(fault)
    elif fault.action == "disconnect":
        disconnect_peers()


def _exhaust_memory(fault: Fault) -> None:
    """Allocate memory until MemoryError, or ``fault.size`` bytes, then raise MemoryError; without a
    size under a lowered address-space limit, so the machine's memory is not used up."""
    limits = resource.getrlimit(resource.RLIMIT_AS)
    if fault.size is None:
        vm_size = procfs.status().get("VmSize")
        if vm_size is None:
            raise OSError("no VmSize in /proc/self/status: the address space to limit is not known")
        address_space = procfs.size(vm_size)
        resource.setrlimit(resource.RLIMIT_AS, (address_space + OOM_HEADROOM, limits[1]))
    held: list[bytes] = []
    allocated = 0
    try:
        while fault.size is None or allocated < fault.size:
            size = OOM_CHUNK if fault.size is None else min(OOM_CHUNK, fault.size - allocated)
            held.append(b"\x01" * size)
            allocated += size
    except MemoryError:
        pass
    finally:
        held.clear()  # freed now: the traceback keeps this frame, not the memory
        resource.setrlimit(resource.RLIMIT_AS, limits)
    raise MemoryError(f"injected by pytest-ddp: {fault} ({allocated / 2**20:.0f} MiB allocated)")


def disconnect_peers() -> None:
    """Shut down (both ways) this process's TCP connections to its peers, not those to the
    rendezvous store (``MASTER_PORT``); their descriptors stay open, so the backend meets the
    broken connection on its next use."""
    store_port = int(os.environ.get("MASTER_PORT", "0"))
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        sock = socket.socket(fileno=int(name))  # its family and type asked of the kernel
        try:
            # getpeername raises for a socket that is not connected (a listening one)
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getpeername()[1] != store_port:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()  # the backend still owns the descriptor

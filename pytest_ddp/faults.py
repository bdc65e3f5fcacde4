"""Faults to inject into a ddp test: which rank fails, how, and at which of its calls.

Declared on the mark or given to :func:`pytest_ddp.run`::

    from pytest_ddp import faults

    @pytest.mark.ddp(world_size=4, faults=[faults.kill(rank=1, at="all_reduce", call=3)])
    def test_training_survives_a_dead_rank(rank): ...

A fault fires on rank ``rank`` when that rank enters its ``call``-th call of the
operation ``at`` in the test (counted per test, over every group, whether the
call came from a torch.distributed function or reached the backend directly,
as DDP's gradient all-reduces do), *before* the call takes part: a killed rank
never enters it.  The recorder fires it (:mod:`pytest_ddp.record.injector`) and first
writes a ``fault`` event, so the report says what was injected.

This module only declares and checks faults; no torch import, so the
controller and the pure tests use it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pytest_ddp.common.dtypes import DTYPES
from pytest_ddp.common.ops import INIT, INTERCHANGEABLE, OPS, REDUCING

Action = Literal["kill", "exit", "raise", "delay", "hang", "oom", "disconnect", "skip", "extra", "change"]
# Faults after which the rank's process is gone: a death the test asked for.
DEADLY: frozenset[str] = frozenset({"kill", "exit"})
# Faults that make another call in the call's place (none, two, a changed one): the recorder's
# wrapper of a torch.distributed function carries them out, so a call reaching the backend
# without one (DDP's reducer, a functional collective) cannot take them.
REPLACING: frozenset[str] = frozenset({"skip", "extra", "change"})
# What each fault does, as the report says it (Fault.what; oom's and change's words are built there).
_WHAT = {
    "kill": "SIGKILL", "exit": "exit({code})", "raise": "raise {exc!r}", "delay": "delay of {seconds:g} s",
    "disconnect": "connections to its peers broken", "skip": "call skipped", "extra": "call made twice",
    "hang": "hang",
}
# torch.distributed.ReduceOp's members, by name (change(reduce_op=...)).
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


class FaultError(ValueError):
    """A fault that cannot be injected (the message names what is wrong)."""


@dataclass(frozen=True)
class Fault:
    """One fault: ``action`` on ``rank`` at its ``call``-th call of ``at``."""

    action: Action
    rank: int
    at: str  # an operation of pytest_ddp.common.ops.OPS
    call: int = 1
    seconds: float = 0.0  # delay
    code: int = 1  # exit
    size: int | None = None  # oom: bytes to allocate before the MemoryError; None: until a real one
    exc: BaseException | None = None  # raise
    # change: what differs in the call made instead (None: as the caller passed it)
    shape: tuple[int, ...] | None = None  # the call's tensor replaced by zeros of this shape
    dtype: str | None = None  # ... of this dtype ("float64")
    op: str | None = None  # another collective (INTERCHANGEABLE) on the same tensor and group
    reduce_op: str | None = None  # another ReduceOp (REDUCE_OPS), by name

    @property
    def what(self) -> str:
        """``SIGKILL``, ``exit(1)``, ``raise RuntimeError('boom')``, ``delay of 3 s``, ..."""
        if self.action == "oom":
            return "out of memory" + ("" if self.size is None else f" after {self.size} bytes")
        if self.action == "change":
            return "call changed to " + ", ".join(
                f"{name} {value if name != 'shape' else list(value)}"
                for name, value in (("op", self.op), ("shape", self.shape), ("dtype", self.dtype),
                                    ("reduce op", self.reduce_op))
                if value is not None
            )
        return _WHAT.get(self.action, "hang").format(code=self.code, exc=self.exc, seconds=self.seconds)

    def __str__(self) -> str:
        """``SIGKILL on rank 1 at all_reduce call 3``: how the report names an injected fault."""
        return f"{self.what} on rank {self.rank} at {self.at} call {self.call}"

    @property
    def deadly(self) -> bool:
        """The rank's process ends when this fault fires."""
        return self.action in DEADLY


def kill(rank: int, at: str, call: int = 1) -> Fault:
    """SIGKILL the rank as it enters the call: a crashed process or node."""
    return Fault("kill", rank, at, call)


def exit(rank: int, at: str, call: int = 1, code: int = 1) -> Fault:
    """End the rank's process with ``code`` (``os._exit``: no cleanup) as it enters the call."""
    return Fault("exit", rank, at, call, code=code)


def raise_(
    rank: int, at: str, call: int = 1, exc: BaseException | type[BaseException] | None = None
) -> Fault:
    """Raise ``exc`` (default a RuntimeError naming the fault) from the call, before it communicates."""
    if exc is None:
        exc = RuntimeError
    if isinstance(exc, type):
        exc = exc(f"injected by pytest-ddp on rank {rank} at {at} call {call}")
    return Fault("raise", rank, at, call, exc=exc)


def delay(rank: int, at: str, seconds: float, call: int = 1) -> Fault:
    """Sleep ``seconds`` before the call: a slow rank."""
    return Fault("delay", rank, at, call, seconds=seconds)


def hang(rank: int, at: str, call: int = 1) -> Fault:
    """Never reach the call: the rank blocks forever just before it (outside any collective)."""
    return Fault("hang", rank, at, call)


def oom(rank: int, at: str, call: int = 1, size: int | None = None) -> Fault:
    """Run out of memory before the call: allocate until a real ``MemoryError`` (under a lowered
    address-space limit, so the machine is not exhausted) or, with ``size``, allocate that many
    bytes and raise ``MemoryError`` there; the memory is freed as the error unwinds."""
    return Fault("oom", rank, at, call, size=size)


def disconnect(rank: int, at: str, call: int = 1) -> Fault:
    """Shut down the rank's TCP connections to its peers before the call (not the store's): the
    backend on both sides sees a peer reset."""
    return Fault("disconnect", rank, at, call)


def skip(rank: int, at: str, call: int = 1) -> Fault:
    """Do not make the call: it returns None at once, unrecorded (a rank that skipped it)."""
    return Fault("skip", rank, at, call)


def extra(rank: int, at: str, call: int = 1) -> Fault:
    """Make the call twice, with the same arguments: one call more than the other ranks make."""
    return Fault("extra", rank, at, call)


def change(
    rank: int,
    at: str,
    call: int = 1,
    *,
    shape: tuple[int, ...] | list[int] | None = None,
    dtype: Any = None,
    op: str | None = None,
    reduce_op: str | None = None,
) -> Fault:
    """Make another call in the call's place: on a tensor of zeros of ``shape`` or ``dtype`` (a
    name, "float64", or a torch.dtype) instead of the call's tensor, with ``reduce_op`` ("MAX")
    instead of its ReduceOp, or the collective ``op`` (all_reduce, broadcast, reduce, barrier)
    on the same tensor and group instead of ``at``."""
    dtype = None if dtype is None else str(dtype).removeprefix("torch.")
    shape = tuple(shape) if isinstance(shape, list) else shape
    return Fault("change", rank, at, call, shape=shape, dtype=dtype, op=op, reduce_op=reduce_op)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check(fault: Any, world_size: int | None = None, init: bool = True) -> Fault:
    """``fault``, checked; :class:`FaultError` saying what is wrong.  ``world_size`` None: the
    rank is checked only for being an int >= 0 (the world size is not known yet)."""
    if not isinstance(fault, Fault):
        raise FaultError(
            f"{fault!r} is not a fault: make one with pytest_ddp.faults, e.g. faults.kill(rank=1, at=...)"
        )
    name = f"{fault.action}(rank={fault.rank!r}, at={fault.at!r}, call={fault.call!r})"
    if not _is_int(fault.rank) or fault.rank < 0:
        raise FaultError(f"{name}: rank must be an int >= 0")
    if world_size is not None and fault.rank >= world_size:
        raise FaultError(f"{name}: there is no rank {fault.rank} in world_size {world_size}")
    if fault.at not in OPS:
        raise FaultError(
            f"{name}: {fault.at!r} is not an operation pytest-ddp records; one of {', '.join(OPS)}"
        )
    if fault.at == INIT and init:
        raise FaultError(
            f"{name}: with init=True the plugin calls init_process_group before the test; "
            "use init=False to inject a fault there"
        )
    if not _is_int(fault.call) or fault.call < 1:
        raise FaultError(f"{name}: call must be an int >= 1 (the first call is 1)")
    if fault.action == "delay" and not _is_seconds(fault.seconds):
        raise FaultError(f"{name}: seconds={fault.seconds!r} must be a number >= 0")
    if fault.action == "exit" and not (_is_int(fault.code) and 0 <= fault.code <= 255):
        # The exit status is the code's low byte: os._exit(256) exits 0.
        raise FaultError(f"{name}: code={fault.code!r} must be an int from 0 to 255 (an exit status)")
    if fault.action == "oom" and fault.size is not None and (not _is_int(fault.size) or fault.size < 1):
        raise FaultError(f"{name}: size={fault.size!r} must be an int >= 1 (bytes) or None")
    if fault.action == "raise" and not isinstance(fault.exc, BaseException):
        raise FaultError(f"{name}: exc={fault.exc!r} must be an exception or an exception class")
    if fault.action in REPLACING:
        _check_replacing(fault, name)
    return fault


def _is_seconds(value: Any) -> bool:
    """A number >= 0 (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value >= 0


def _is_shape(value: Any) -> bool:
    """A tuple of ints >= 0."""
    return isinstance(value, tuple) and all(_is_int(n) and n >= 0 for n in value)


def _check_replacing(fault: Fault, name: str) -> None:
    spec = OPS[fault.at]
    if not spec.python or spec.api != "torch" or spec.kind == "group":
        raise FaultError(
            f"{name}: {fault.action} replaces a call of a torch.distributed communication function; "
            f"{fault.at} is not one"
        )
    if fault.action != "change":
        return
    if (fault.shape, fault.dtype, fault.op, fault.reduce_op) == (None, None, None, None):
        raise FaultError(f"{name}: change needs what to change: shape=, dtype=, op= or reduce_op=")
    if fault.shape is not None and not _is_shape(fault.shape):
        raise FaultError(f"{name}: shape={fault.shape!r} must be a tuple of ints >= 0")
    if fault.dtype is not None and fault.dtype not in DTYPES:
        raise FaultError(f"{name}: dtype={fault.dtype!r} is not a torch dtype; one of {', '.join(DTYPES)}")
    changes_tensor = fault.shape is not None or fault.dtype is not None
    if changes_tensor and (spec.tensors is None or spec.kind == "batch"):
        raise FaultError(f"{name}: shape= and dtype= change the call's tensor, and {fault.at} takes none")
    if fault.op is not None and (fault.op not in INTERCHANGEABLE or fault.op == fault.at):
        others = ", ".join(o for o in INTERCHANGEABLE if o != fault.at)
        raise FaultError(f"{name}: op={fault.op!r} must be another collective: one of {others}")
    if fault.op is not None and fault.at not in INTERCHANGEABLE:
        raise FaultError(
            f"{name}: op= changes one of {', '.join(INTERCHANGEABLE)} into another; not {fault.at}"
        )
    if fault.reduce_op is not None and fault.reduce_op not in REDUCE_OPS:
        raise FaultError(f"{name}: reduce_op={fault.reduce_op!r} must be one of {', '.join(REDUCE_OPS)}")
    if fault.reduce_op is not None and fault.at not in REDUCING:
        raise FaultError(
            f"{name}: reduce_op= changes the reduce op of {', '.join(REDUCING)}; {fault.at} has none"
        )


def check_all(value: Any, world_size: int | None = None, init: bool = True) -> tuple[Fault, ...]:
    """A list or tuple of faults, each checked; two at the same (rank, operation, call) refused."""
    if isinstance(value, Fault):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise FaultError(f"{value!r} must be a list of faults")
    checked = tuple(check(fault, world_size, init) for fault in value)
    places = [(f.rank, f.at, f.call) for f in checked]
    for place in places:
        if places.count(place) > 1:
            raise FaultError(f"two faults on rank {place[0]} at {place[1]} call {place[2]}")
    for fault in checked:
        for deadly in checked:
            same_place = (deadly.rank, deadly.at) == (fault.rank, fault.at)
            if deadly.deadly and same_place and deadly.call < fault.call:
                raise FaultError(f"{fault} can never fire: {deadly} ends the rank's process before it")
    return checked

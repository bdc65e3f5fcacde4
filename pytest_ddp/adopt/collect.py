"""Which collected items are adopted (``--ddp-adopt``), and on how many ranks they run.

The items of torch's and DeepSpeed's harness classes are marked ``ddp(world_size=<the class's>,
init=False, check_collectives=False)``, as under their own harness; a ``ddp`` mark of the item's own
gives the rest (timeout, backend, ...), and one that contradicts the class is the item's error.  A
class that runs its tests in one process (its own ``join_or_run`` or ``_ensure_processes_spawned``)
is left to pytest, and so is an item its harness skips before it runs (:mod:`pytest_ddp.adopt.own_skips`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest

from pytest_ddp.adopt import own_skips

HARNESS = "torch.testing._internal.common_distributed"  # where torch's harness classes live
# Why an item's own ddp mark cannot hold for its harness class (the controller reports it at setup).
conflict_key = pytest.StashKey[str]()


def adopt(items: list[pytest.Item], in_rank: bool) -> None:
    """Mark the items of torch's harness classes, and DeepSpeed's, as ddp tests."""
    harness = sys.modules.get(HARNESS)  # None: no test module imported torch's harness
    kinds = set()
    for item in items:
        cls = getattr(item, "cls", None)
        kind = None if cls is None else _kind(cls, harness)
        if cls is None or kind is None:
            continue
        own = item.get_closest_marker("ddp")
        world_size = _world_size(item, cls, kind)
        # One its harness skips starts no rank (one with a ddp mark of its own runs on its ranks).
        if own is None and own_skips.leave_to_harness(item, cls, kind, world_size):
            continue  # pytest and the harness skip it here, as without --ddp-adopt
        skip = None if own is not None else own_skips.spawned_skip(item, kind)
        if skip is not None:  # the skip each of the harness's processes would exit with
            item.add_marker(pytest.mark.skip(reason=skip))
            continue
        conflict = None if own is None else _conflict(own, cls, world_size)
        if conflict is not None:
            item.stash[conflict_key] = conflict  # the item keeps its own mark, and never runs
            continue
        # Ahead of the item's own mark, whose other arguments it takes.  Collectives not compared:
        # a test may make a rank's collective time out on purpose.
        kwargs = {"check_collectives": False, **({} if own is None else own.kwargs)}
        if world_size is not None or "world_size" not in kwargs:
            kwargs["world_size"] = world_size or 1
        args = () if own is None else own.args
        item.add_marker(pytest.mark.ddp(*args, **{**kwargs, "init": False}), append=False)
        kinds.add(kind)
        if in_rank and kind == "deepspeed":
            from pytest_ddp.adopt import deepspeed

            deepspeed.install(cls)
    if in_rank and kinds - {"deepspeed"}:
        from pytest_ddp.adopt import torch_classes

        torch_classes.install()


def _kind(cls: type, harness: Any) -> str | None:
    from pytest_ddp.adopt.deepspeed import launcher_class

    if launcher_class(cls) is not None:
        return "deepspeed"
    if harness is None:
        return None
    process, continuous = harness.MultiProcessTestCase, harness.MultiProcContinuousTest
    joins = process.__dict__["join_or_run"]
    if issubclass(cls, process) and inspect.getattr_static(cls, "join_or_run") is joins:
        return "process"
    spawned = continuous.__dict__["_ensure_processes_spawned"]
    if issubclass(cls, continuous) and inspect.getattr_static(cls, "_ensure_processes_spawned") is spawned:
        return "continuous"
    return None


def _conflict(own: pytest.Mark, cls: type, world_size: int | None) -> str | None:
    """How the item's own ddp mark contradicts its harness class, if it does."""
    if own.kwargs.get("init", False) is not False:
        return (
            f"@pytest.mark.ddp(init={own.kwargs['init']!r}): {cls.__qualname__} makes its own process group "
            "under --ddp-adopt; leave init out of the mark"
        )
    sizes = own.kwargs.get("world_size")
    if world_size is None or sizes is None or sizes in (world_size, [world_size], (world_size,)):
        return None
    return (
        f"@pytest.mark.ddp(world_size={sizes!r}) contradicts {cls.__qualname__}'s own world_size, "
        f"{world_size}, which --ddp-adopt runs it on: leave world_size out of the mark, "
        f"or make it {world_size}"
    )


def _world_size(item: pytest.Item, cls: Any, kind: str) -> int | None:
    """The number of processes the harness would start; None where that raises (the rank asks again
    as the test sets up, and gets the same skip or error)."""
    try:
        if kind == "process":
            return int(cls(item.name).world_size)
        if kind == "deepspeed":  # @pytest.mark.world_size(n), else the class's (a list: its first)
            mark = item.get_closest_marker("world_size")
            sizes = mark.args[0] if mark is not None else cls.world_size
            return int(sizes if isinstance(sizes, int) else sizes[0])
        return int(cls._get_world_size(_device_type(cls)))
    except Exception:
        return None


def _device_type(cls: Any) -> str:
    """A continuous class's device type, read as torch's ``_ensure_processes_spawned`` reads it."""
    attr = cls.__dict__.get("device_type", cls.device_type)
    if isinstance(attr, classmethod):
        return str(attr.__func__(cls))
    if isinstance(attr, property):
        return str(attr.fget(cls))  # type: ignore[misc]
    return str(attr() if callable(attr) else attr)

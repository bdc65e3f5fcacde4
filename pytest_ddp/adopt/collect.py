"""Which collected items are adopted (``--ddp-adopt``), and on how many ranks they run.

The items of torch's and DeepSpeed's harness classes are marked ``ddp(world_size=<the class's>,
init=False, check_collectives=False)``, as under their own harness.  A class that runs its tests in
one process (its own ``join_or_run`` or ``_ensure_processes_spawned``) is left to pytest.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest

HARNESS = "torch.testing._internal.common_distributed"  # where torch's harness classes live
# How an adopted item runs: "process", "continuous" (MultiProcContinuousTest) or "deepspeed".
adopted_key = pytest.StashKey[str]()


def adopt(items: list[pytest.Item], in_rank: bool) -> None:
    """Mark the items of torch's harness classes, and DeepSpeed's, as ddp tests."""
    harness = sys.modules.get(HARNESS)  # None: no test module imported torch's harness
    kinds = set()
    for item in items:
        cls = getattr(item, "cls", None)
        kind = None if cls is None else _kind(cls, harness)
        if kind is None or item.get_closest_marker("ddp") is not None:
            continue
        # Not compared: a test may make a rank's collective time out on purpose.
        world_size = _world_size(item, cls, kind)
        item.add_marker(pytest.mark.ddp(world_size=world_size, init=False, check_collectives=False))
        item.stash[adopted_key] = kind
        kinds.add(kind)
        if in_rank and kind == "deepspeed" and cls is not None:
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


def _world_size(item: pytest.Item, cls: Any, kind: str) -> int:
    """The number of processes the harness would start; 1 where that raises (the rank asks again as
    the test sets up, and gets the same skip or error)."""
    try:
        if kind == "process":
            return int(cls(item.name).world_size)
        if kind == "deepspeed":  # @pytest.mark.world_size(n), else the class's (a list: its first)
            mark = item.get_closest_marker("world_size")
            sizes = mark.args[0] if mark is not None else cls.world_size
            return int(sizes if isinstance(sizes, int) else sizes[0])
        return int(cls._get_world_size(_device_type(cls)))
    except Exception:
        return 1


def _device_type(cls: Any) -> str:
    """A continuous class's device type, read as torch's ``_ensure_processes_spawned`` reads it."""
    attr = cls.__dict__.get("device_type", cls.device_type)
    if isinstance(attr, classmethod):
        return str(attr.__func__(cls))
    if isinstance(attr, property):
        return str(attr.fget(cls))  # type: ignore[misc]
    return str(attr() if callable(attr) else attr)

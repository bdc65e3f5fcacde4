"""Which collected items are adopted (``--ddp-adopt``), and on how many ranks they run.

The items of torch's harness classes (``MultiProcessTestCase`` and its children, which spawn a process
per rank and join them; ``MultiProcContinuousTest``) are marked ``ddp(world_size=<the class's>,
init=False)``: the test makes its own process group, as it does under torch's harness.  A class that
runs its tests in one process (``join_or_run`` or ``_ensure_processes_spawned`` of its own, as the
local-tensor classes have) is left to pytest, and so is an item that has a ``ddp`` mark already.
The controller and every rank collect alike, so each marks the same items; a rank also makes
torch's classes run there (:mod:`pytest_ddp.adopt.torch_classes`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest

HARNESS = "torch.testing._internal.common_distributed"  # where torch's harness classes live
# How an adopted item runs: "process" (MultiProcessTestCase), "continuous" (MultiProcContinuousTest).
adopted_key = pytest.StashKey[str]()


def adopt(items: list[pytest.Item], in_rank: bool) -> None:
    """Mark the items of torch's harness classes as ddp tests."""
    harness = sys.modules.get(HARNESS)
    if harness is None:  # no test module imported torch's harness
        return
    adopted = False
    for item in items:
        cls = getattr(item, "cls", None)
        kind = None if cls is None else _kind(cls, harness)
        if kind is None or item.get_closest_marker("ddp") is not None:
            continue
        item.add_marker(pytest.mark.ddp(world_size=_world_size(item, cls, kind), init=False))
        item.stash[adopted_key] = kind
        adopted = True
    if adopted and in_rank:
        from pytest_ddp.adopt import torch_classes

        torch_classes.install()


def _kind(cls: type, harness: Any) -> str | None:
    process, continuous = harness.MultiProcessTestCase, harness.MultiProcContinuousTest
    if issubclass(cls, process) and inspect.getattr_static(cls, "join_or_run") is process.__dict__["join_or_run"]:
        return "process"
    spawned = continuous.__dict__["_ensure_processes_spawned"]
    if issubclass(cls, continuous) and inspect.getattr_static(cls, "_ensure_processes_spawned") is spawned:
        return "continuous"
    return None


def _world_size(item: pytest.Item, cls: Any, kind: str) -> int:
    """The number of processes torch's harness would start for the item.  Where that raises (a skip,
    an error), 1: the rank asks again as the test sets up, and the test gets the same skip or error."""
    try:
        if kind == "process":
            return int(cls(item.name).world_size)
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

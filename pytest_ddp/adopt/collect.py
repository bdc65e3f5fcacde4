"""Which collected items are adopted (``--ddp-adopt``), and on how many ranks they run.

The items of torch's and DeepSpeed's harness classes are marked ``ddp(world_size=<the class's>,
init=False, check_collectives=False)``, as under their own harness; a ``ddp`` mark of the item's own
gives the rest (timeout, backend, ...), and one that contradicts the class is the item's error.  A
class that runs its tests in one process (its own ``join_or_run`` or ``_ensure_processes_spawned``)
is left to pytest.

So is an item its own harness skips before starting any process (a unittest skip decorator, a
pytest skip mark, a continuous class whose backend is missing, DeepSpeed's launcher short of
devices): pytest and its harness skip it here as without ``--ddp-adopt``, and no rank group starts
for it.  Where torch's harness skips only in the processes it started (``skip_if_lt_x_gpu``: each
exits with a skip code), the item gets that skip as a mark.  Each check runs the harness's own code
where it can; one that cannot tell (an error, a harness of another shape) leaves the item adopted,
and the ranks skip it.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import unittest
from typing import Any

import pytest

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
        if own is None and _leave_to_harness(item, cls, kind, world_size):
            continue  # pytest and the harness skip it here, as without --ddp-adopt
        skip = None if own is not None or kind != "process" else _lt_x_gpu_skip(item, harness)
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

            deepspeed.install(launcher_class(cls))
    if in_rank and kinds - {"deepspeed"}:
        from pytest_ddp.adopt import torch_classes

        torch_classes.install()


def launcher_class(cls: type) -> type | None:
    """The class of DeepSpeed's harness (``DistributedExec``) that ``cls`` launches with, if it is one."""
    if not getattr(cls, "is_dist_test", False):
        return None
    return next((base for base in cls.__mro__ if "_launch_daemonic_procs" in base.__dict__), None)


def _kind(cls: type, harness: Any) -> str | None:
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


# -- what an item's own harness skips ----------------------------------------------------


class _WouldStart(Exception):
    """The harness went on to start its processes: the item runs."""


def _leave_to_harness(item: pytest.Item, cls: type, kind: str, world_size: int | None) -> bool:
    """Whether the item's own harness skips it before starting any process (it is then not adopted)."""
    # unittest's skip decorators (skipIf, torch's requires_nccl), on the class or the test
    decorated = any(getattr(obj, "__unittest_skip__", False) for obj in (cls, getattr(item, "obj", None)))
    if decorated or _skip_mark(item):
        return True
    if kind == "continuous":
        return _continuous_skip(cls)
    if kind == "deepspeed" and world_size is not None:
        harness = sys.modules.get(getattr(launcher_class(cls), "__module__", ""))
        return deepspeed_skips(cls, world_size, getattr(harness, "get_accelerator", None))
    return False


def _skip_mark(item: pytest.Item) -> bool:
    """A pytest skip or skipif mark that holds (pytest's own evaluation)."""
    from _pytest.skipping import evaluate_skip_marks

    try:
        return evaluate_skip_marks(item) is not None
    except Exception:  # a condition that raises is pytest's error to report, at the item's setup
        return False


@functools.cache  # one look per class
def _continuous_skip(cls: Any) -> bool:
    """Whether ``MultiProcContinuousTest._ensure_processes_spawned`` raises SkipTest before spawning
    (its backend is missing): torch's own method, run on a subclass that stops where it would spawn."""

    def would_start(probe: Any, world_size: int) -> None:
        raise _WouldStart

    probe: Any = types.new_class(cls.__name__, (cls,), exec_body=lambda ns: ns.update(
        _spawn_processes=classmethod(would_start), _processes_spawned=False, __module__=cls.__module__
    ))  # fmt: skip
    try:
        probe._ensure_processes_spawned()
    except unittest.SkipTest:
        return True
    except Exception:  # _WouldStart, or what the ranks will raise again
        return False
    return False


def deepspeed_skips(cls: type, world_size: int, get_accelerator: Any) -> bool:
    """DeepSpeed's checks before it launches (``DistributedTest.__call__``, then ``_launch_procs``), on the
    accelerator its harness module imported: a class that needs an accelerator where there is none, or
    more processes than devices (on CPU, its NUMA nodes)."""
    if get_accelerator is None:  # a harness of DeepSpeed's shape on torch alone
        return False
    accelerator = get_accelerator()
    if not accelerator.is_available():
        return bool(getattr(cls, "requires_cuda_env", False))
    return int(accelerator.device_count()) < world_size


def _lt_x_gpu_skip(item: pytest.Item, harness: Any) -> str | None:
    """torch's ``skip_if_lt_x_gpu(x)`` on the test, if it skips here: its own check, run with the test
    taken out of it and a stand-in for the test case that takes the skip."""
    wrappers = set(_nested_codes(harness.skip_if_lt_x_gpu.__code__))
    fn = getattr(item, "obj", None)
    while fn is not None:
        code = getattr(fn, "__code__", None)
        if code in wrappers and "func" in code.co_freevars:
            taken: list[str] = []
            test = types.CellType(lambda *args, **kwargs: None)
            closure = zip(code.co_freevars, fn.__closure__)
            cells = tuple(test if name == "func" else cell for name, cell in closure)
            check = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, cells)
            try:
                check(types.SimpleNamespace(_handle_test_skip=taken.append))
            except (Exception, SystemExit):  # not of the shape known: the ranks decide
                return None
            return taken[0] if taken else None
        fn = getattr(fn, "__wrapped__", None)
    return None


def _nested_codes(code: types.CodeType) -> list[types.CodeType]:
    """The code of the functions defined within ``code``'s, at any depth."""
    inner = [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return [found for const in inner for found in (const, *_nested_codes(const))]

"""Which adopted items their own harness skips before a test runs (too few devices, a missing backend):
those are not adopted, so that no rank group starts for them.

Where the harness skips before starting any process (a unittest skip decorator, a pytest skip mark, a
continuous class whose backend is missing, DeepSpeed's launcher short of devices), the item is left
to pytest and its harness, which skip it here as they do without ``--ddp-adopt``.  Where torch's
harness skips only in the processes it started (``skip_if_lt_x_gpu``: each process exits with a skip
code), the item gets that skip as a mark.  Each check runs the harness's own code where it can; one
that cannot tell (an error, a harness of another shape) leaves the item adopted, and the ranks skip it.
"""

from __future__ import annotations

import functools
import sys
import types
import unittest
from typing import Any

import pytest


class _WouldStart(Exception):
    """The harness went on to start its processes: the item runs."""


def leave_to_harness(item: pytest.Item, cls: type, kind: str, world_size: int | None) -> bool:
    """Whether the item's own harness skips it before starting any process (it is then not adopted)."""
    if _unittest_skip(item, cls) or _skip_mark(item):
        return True
    if kind == "continuous":
        return _continuous_skip(cls)
    if kind == "deepspeed" and world_size is not None:
        from pytest_ddp.adopt.deepspeed import launcher_class

        harness = sys.modules.get(getattr(launcher_class(cls), "__module__", ""))
        return deepspeed_skips(cls, world_size, getattr(harness, "get_accelerator", None))
    return False


def spawned_skip(item: pytest.Item, kind: str) -> str | None:
    """The skip every process torch's harness starts for the item would exit with, if it is certain."""
    fn = getattr(item, "obj", None)
    return _lt_x_gpu_skip(fn) if kind == "process" else None


def _unittest_skip(item: pytest.Item, cls: type) -> bool:
    """unittest's skip decorators (``skipIf``, torch's ``requires_nccl``), on the class or the test."""
    return any(getattr(obj, "__unittest_skip__", False) for obj in (cls, getattr(item, "obj", None)))


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


def _lt_x_gpu_skip(fn: Any) -> str | None:
    """torch's ``skip_if_lt_x_gpu(x)`` on the test, if it skips here: its own check, run with the test
    taken out of it and a stand-in for the test case that takes the skip."""
    harness = sys.modules.get("torch.testing._internal.common_distributed")
    if harness is None:
        return None
    wrappers = set(_nested_codes(harness.skip_if_lt_x_gpu.__code__))
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

"""The fallbacks of the backend hook, the one module that uses torch's private names."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pytest_ddp import backend_hook, describe


def _never(*args: Any) -> Any:
    raise AssertionError("nothing may be recorded")


def test_a_torch_that_refuses_the_kernels_gets_none_and_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where registering a kernel fails (an older or newer torch), nothing is hooked: install says
    so, and only the torch.distributed functions are recorded."""
    assert not backend_hook._libraries  # not installed in this process

    class Refusing:
        def __init__(self, *args: Any) -> None:
            raise RuntimeError("no such dispatch key")

    monkeypatch.setattr(torch.library, "Library", Refusing)
    assert backend_hook.install(_never, _never, lambda: True) is False
    assert backend_hook._libraries == []


def test_a_torch_that_does_not_count_its_groups_keeps_torchs_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist.distributed_c10d, "_world", types.SimpleNamespace())
    assert backend_hook.groups_made() is None
    describe.start_test()
    assert describe._name_in_test("7") == "7"


def test_groups_made_during_a_test_are_numbered_from_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist.distributed_c10d, "_world", types.SimpleNamespace(group_count=5))
    describe.start_test()
    assert [describe._name_in_test(n) for n in ("5", "6", "3", "my-desc")] == ["1", "2", "before-3", "my-desc"]

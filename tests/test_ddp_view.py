"""The fallbacks of the DDP view, the one module that uses torch's private names."""

from __future__ import annotations

import types
from typing import Any

import torch.distributed as dist

from pytest_ddp import ddp_view


def _never(*args: Any) -> Any:
    raise AssertionError("nothing may be recorded")


def test_a_group_the_view_cannot_copy_is_passed_on_as_it_is() -> None:
    """A group without the private backend accessors (another torch, another kind of group)."""
    group = types.SimpleNamespace(rank=lambda: 0, size=lambda: 1)
    assert ddp_view.recording_view(group, "ddp", _never) is group  # type: ignore[arg-type]


def test_a_torch_without_the_entry_points_gets_no_replacements() -> None:
    assert ddp_view.entry_points(types.SimpleNamespace(), _never, lambda frame: True) == {}


def test_a_torch_with_the_entry_points_gets_each_replaced() -> None:
    replaced = ddp_view.entry_points(dist, _never, lambda frame: True)
    present = [n for n in ("Reducer", *ddp_view.GROUP_FIRST_ENTRY_POINTS) if hasattr(dist, n)]
    assert sorted(replaced) == sorted(present) and present

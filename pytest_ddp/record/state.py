"""What :mod:`pytest_ddp.record.recorder` and :mod:`pytest_ddp.record.backend_recorder` replaced in
torch, kept to be put back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pytest_ddp.record import backend_hook

originals: dict[tuple[Any, str], Any] = {}  # (owner, name) -> what the recorder replaced there


def patch(owner: Any, name: str, replacement: Any, recursive: bool = True) -> None:
    """``owner.name = replacement``, the original kept to be put back.  Out of what torch.compile
    compiles (its callees too where ``recursive``), and traced as what it replaces."""
    original = originals.setdefault((owner, name), getattr(owner, name))
    backend_hook.traced_as(original, backend_hook.out_of_compile(replacement, recursive))
    setattr(owner, name, replacement)


def patch_function(
    name: str, replacement: Callable[[Callable[..., Any]], Any], recursive: bool = True
) -> None:
    """Replace a torch.distributed function by ``replacement(original)``, in c10d and dist alike."""
    original = getattr(c10d, name)
    replaced = replacement(original)
    patch(c10d, name, replaced, recursive)
    if getattr(dist, name, None) is original:
        patch(dist, name, replaced, recursive)


def unpatch() -> None:
    """Put back everything :func:`patch` replaced."""
    for (owner, name), original in originals.items():
        setattr(owner, name, original)
    originals.clear()

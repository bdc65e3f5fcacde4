"""DeepSpeed's ``DistributedTest`` classes (tests/unit/common.py, copied by projects) in a rank: its
conftest's ``item.cls()(item._request)`` runs as it is, but its two launchers run ``_dist_run`` here,
on rank 0's rendezvous file, instead of starting processes.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pytest_ddp.adopt.exchange import exchange
from pytest_ddp.common.ops import BROADCAST_OBJECTS, GATHER_OBJECTS
from pytest_ddp.rank.context import rank_context


def install(base: Any) -> None:
    """Run the tests of the classes that launch with ``base`` (DeepSpeed's ``DistributedExec``) in the
    rank instead of in processes of their own."""
    base._launch_daemonic_procs = _launch_in_rank
    base._launch_non_daemonic_procs = _launch_in_rank


def _launch_in_rank(self: Any, num_procs: int, init_method: str) -> None:
    """What DeepSpeed's process for this rank does, then its main process's end: any skip skips."""
    context = rank_context()
    if num_procs != context.world_size:
        raise AssertionError(
            f"{type(self).__qualname__}: world_size {num_procs} here, {context.world_size} when collected: "
            "pytest-ddp runs a DeepSpeed test on one world size (a list of them is not supported)"
        )
    [shared] = exchange(BROADCAST_OBJECTS, init_method if context.rank == 0 else None, root=0)
    error: BaseException | None = None
    skip = ""
    try:
        skip = self._dist_run(context.rank, num_procs, os.environ.get("MASTER_PORT"), shared) or ""
    except Exception as exc:
        error = exc
    finally:  # as DeepSpeed's main process closes its pool, after a failure too
        if not self.reuse_dist_env:
            self._dist_destroy()
    skips = exchange(GATHER_OBJECTS, "" if error is not None else str(skip))
    if error is not None:
        raise error
    if any(skips):
        pytest.skip(next(message for message in skips if message))

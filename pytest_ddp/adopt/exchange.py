"""What the ranks of an adopted test tell each other in place of their harness's main process:
through the group's store, recorded as a collective of group ``harness``, so the watchdog sees a
rank waiting there."""

from __future__ import annotations

import json
from typing import Any

from pytest_ddp.rank import default_group
from pytest_ddp.rank.context import rank_context
from pytest_ddp.record import recorder

_exchanges = 0  # made by this rank: the same count on every rank of a group, which run the same tests


def exchange(op: str, value: Any, root: int | None = None) -> list[Any]:
    """Every rank's ``value`` (JSON), in rank order; ``root``'s alone where it is given (a broadcast)."""
    global _exchanges
    _exchanges += 1
    context = rank_context()
    prefix = f"pytest-ddp/harness/{_exchanges}/"

    def run() -> list[Any]:
        store = default_group.store()
        if root is None or context.rank == root:
            store.set(f"{prefix}{context.rank}", json.dumps(value))
        keys = [f"{prefix}{rank}" for rank in (range(context.world_size) if root is None else [root])]
        store.wait(keys)
        return [json.loads(store.get(key)) for key in keys]

    result: list[Any] = recorder.harness_collective(op, context.world_size, run, root)
    return result

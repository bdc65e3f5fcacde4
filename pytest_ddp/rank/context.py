"""Who this rank process is (the ``rank``, ``world_size`` and ``device`` fixtures' answers), or
that it is no rank.  Imports nothing: every pytest session asks it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankContext:
    """Who this process is: what the ``rank``, ``world_size`` and ``device`` fixtures return."""

    rank: int
    world_size: int
    backend: str
    init: bool
    local_rank: int  # the GPU it uses with NCCL: its rank on one machine, LOCAL_RANK when launched
    group_dir: str = ""  # the folder of its group's files on this machine, removed with the group

    @property
    def device(self) -> str:
        return f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu"


_context: RankContext | None = None


def current() -> RankContext | None:
    """The context of this rank process, or None in the controller."""
    return _context


def rank_context() -> RankContext:
    assert _context is not None  # set before the rank's session starts
    return _context


def set_current(context: RankContext) -> None:
    global _context
    _context = context

"""The field corpus (issue 44): cases reduced from public reports, one module per family.
benchmarks/field_score.py runs and scores them; tests/test_field_corpus.py checks their form."""

from __future__ import annotations

import importlib

from benchmarks.field.case import MARK, Case

FAMILIES = (
    "init", "objects", "ddp", "early_exit", "control_flow", "libraries", "fsdp2_dtensor", "groups_p2p",
    "slow_rank", "mpi", "pipelining",
)  # fmt: skip


def cases(family: str) -> list[Case]:
    """The cases of one family (its module's CASES)."""
    return list(importlib.import_module(f"benchmarks.field.{family}").CASES)


def corpus() -> dict[str, list[Case]]:
    """Every family's cases, in FAMILIES' order."""
    return {family: cases(family) for family in FAMILIES}


__all__ = ["FAMILIES", "MARK", "Case", "cases", "corpus"]

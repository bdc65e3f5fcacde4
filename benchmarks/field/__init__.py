"""The field corpus (issue 44): cases reduced from public reports, one module per family.
benchmarks/field_score.py runs and scores them; tests/test_field_corpus.py checks their form."""

from __future__ import annotations

import importlib

from benchmarks.field.case import MARK, Case

FAMILIES = (
    "init", "objects", "ddp", "early_exit", "control_flow", "libraries", "fsdp2_dtensor", "groups_p2p",
    "slow_rank", "mpi", "pipelining",
)  # fmt: skip


# A family's modules: its own, then the parts it was split into, by concern, where it outgrew the
# 600-line cap the package keeps too (benchmarks/field/<family>_<concern>.py). A held-out set, while
# there is one, is each family's <family>_held.py, listed here too.
PARTS: dict[str, tuple[str, ...]] = {
    "init": ("init_held",),
    "objects": ("objects_held",),
    "ddp": ("ddp_stopping", "ddp_evaluation", "ddp_held"),
    "early_exit": ("early_exit_data", "early_exit_held"),
    "control_flow": ("control_flow_own_view", "control_flow_held"),
    "libraries": ("libraries_lightning", "libraries_trainer", "libraries_held"),
    "fsdp2_dtensor": ("fsdp2_dtensor_held",),
    "groups_p2p": ("groups_p2p_held",),
    "slow_rank": ("slow_rank_held",),
    "mpi": ("mpi_communicators", "mpi_held"),
    "pipelining": ("pipelining_held",),
}  # fmt: skip


def cases(family: str) -> list[Case]:
    """The cases of one family (its modules' CASES)."""
    modules = (family, *PARTS.get(family, ()))
    found: list[Case] = []
    for module in modules:
        found += importlib.import_module(f"benchmarks.field.{module}").CASES
    return found


def corpus() -> dict[str, list[Case]]:
    """Every family's cases, in FAMILIES' order."""
    return {family: cases(family) for family in FAMILIES}


__all__ = ["FAMILIES", "MARK", "PARTS", "Case", "cases", "corpus"]

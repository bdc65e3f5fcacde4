"""What torch's harness makes of a test from how each of its processes ended (pure).  A rank's end:
``{"end": "ok" | "error" | "skip" | "exit", "code": exit code, "reason": first line}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "passed", "skipped", "failed"
    reason: str = ""
    culprits: tuple[int, ...] = ()  # where it failed, the ranks at fault


def process_test(ends: list[dict[str, Any]], any_exit_code: bool = False) -> Verdict:
    """``MultiProcessTestCase``'s main process (``_check_return_codes``): a rank that raised fails the
    test; else rank 0's exit code decides, and no other's: a skip code skips the test, a code other
    than 0 fails it (unless the test may end with any code, ``skip_return_code_checks``)."""
    errored = tuple(rank for rank, end in enumerate(ends) if end["end"] == "error")
    if errored:
        return Verdict("failed", ends[errored[0]]["reason"], errored)
    first = ends[0]
    if any_exit_code:
        return Verdict("passed")
    if first["end"] == "skip":
        return Verdict("skipped", first["reason"])
    if first["end"] == "exit":
        return Verdict("failed", f"rank 0 exited with code {first['code']}; torch's harness expects 0", (0,))
    return Verdict("passed")


def continuous_test(ends: list[dict[str, Any]]) -> Verdict:
    """``MultiProcContinuousTest``'s main process (``_worker_run_main_wait``): the first rank, in rank
    order, whose test did not pass decides: its skip skips the test, its error fails it."""
    for end in ends:
        if end["end"] == "skip":
            return Verdict("skipped", end["reason"])
        if end["end"] != "ok":
            culprits = tuple(rank for rank, other in enumerate(ends) if other["end"] in ("error", "exit"))
            return Verdict("failed", end["reason"], culprits)
    return Verdict("passed")

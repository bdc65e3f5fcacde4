"""The phrases every report is made of: a list of ranks, a call, a call's signature; ranks grouped
by what is said of them.  Pure: no processes, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from pytest_ddp.diagnose.state import Call


def rank_list(ranks: Iterable[int], noun: str = "rank") -> str:
    """``rank 2``, ``ranks 0, 3``, ``ranks 0-3, 6``; ``processes 1, 2`` with ``noun="process"``."""
    ordered = sorted(set(ranks))
    plural = noun + ("es" if noun.endswith("s") else "s")
    if len(ordered) == 1:
        return f"{noun} {ordered[0]}"
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    # Runs of three or more read better as a range; "0, 1" stays as it is.
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return f"{plural} {', '.join(parts)}" if parts else f"no {plural}"


def describe_call(call: Call) -> str:
    """``all_reduce #3 (test_x.py:12)``, ``all_reduce #3 (test_x.py:40 via accelerate/accelerator.py:2861)``
    for a call made inside a library; group set-up calls are not numbered: ``init_process_group (t.py:4)``."""
    via = f" via {call.caller}" if call.caller else ""
    return f"{call.label} ({call.site}{via})"


def verb(ranks: Iterable[int], one: str, many: str) -> str:
    return one if len(set(ranks)) == 1 else many


def signature_text(call: Call, reduction: bool = False) -> str:
    """``all_reduce shapes [[10]] float32``, ``broadcast shapes [[3]] float32 root 0``; with
    ``reduction``, its reduce op too (``op MAX``: where the calls compared differ in it)."""
    parts = [call.kind.method]
    if call.shapes:
        parts.append(f"shapes {[list(s) for s in call.shapes]}")
    if call.dtypes:
        parts.append(",".join(sorted(set(call.dtypes))))
    if call.root is not None:
        parts.append(f"root {call.root}")
    if reduction and call.reduction is not None:
        parts.append(f"op {call.reduction}")
    return " ".join(parts)


K = TypeVar("K", bound=Hashable)


def grouped(ranks: Iterable[int], key: Callable[[int], K]) -> list[tuple[K, list[int]]]:
    """Ranks with the same key together, groups in the order of their lowest rank."""
    groups: dict[K, list[int]] = {}
    for r in sorted(ranks):
        groups.setdefault(key(r), []).append(r)
    return list(groups.items())


def said(ranks: Iterable[int], words: Callable[[int], str], sep: str = "; ", noun: str = "rank") -> str:
    """``rank 1 died (exit code 1); ranks 2, 3 raised ...``: each group of ranks the same words say."""
    return sep.join(f"{rank_list(group, noun)} {text}" for text, group in grouped(ranks, words))

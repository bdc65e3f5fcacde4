"""Warnings recorded in the ranks, carried to the controller's warnings summary.

A warning raised by several ranks is shown once, labelled with them, as pytest-xdist does.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from pytest_ddp.diagnose.state import RankState
from pytest_ddp.diagnose.wording import rank_list
from pytest_ddp.report.writable import printable


def _category(name: str) -> type[Warning]:
    module, _, qualname = name.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return UserWarning
    return found if isinstance(found, type) and issubclass(found, Warning) else UserWarning


def merged(states: list[RankState]) -> list[tuple[warnings.WarningMessage, str]]:
    """One ``(warning, node id)`` per distinct warning of the test, its message ending with
    the ranks that raised it: ``boom [ranks 0, 1]``."""
    # (message, category, file, line number, node id) -> (the ranks that raised it, its source line)
    seen: dict[tuple[str, str, str, int, str], tuple[list[int], str | None]] = {}
    for state in states:
        for event in state.warnings:
            w = event.warning
            key = (w["message"], w["category"], w["filename"], w["lineno"], event.id)
            seen.setdefault(key, ([], w.get("line")))[0].append(state.rank)
    found = []
    for (text, category_name, filename, lineno, nodeid), (raised_by, line) in seen.items():
        category = _category(category_name)
        labelled = printable(f"{text} [{rank_list(raised_by)}]")
        try:
            message: Warning = category(labelled)
        except Exception:  # a category that does not take one message argument
            message = UserWarning(labelled)
        shown = None if line is None else printable(line)
        warning = warnings.WarningMessage(message, type(message), printable(filename), lineno, line=shown)
        found.append((warning, printable(nodeid)))
    return found

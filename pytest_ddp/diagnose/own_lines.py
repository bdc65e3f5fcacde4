"""A culprit rank's own line, where the run holds it: the line of the test's file its code raised
at, or the exit its code took.  Pure.

A verdict names the call the peers wait in; the user's fix is at the culprit's own line.  A raise
leaves a traceback in the rank's failed report (pytest's serialized ``longrepr``); a process that
ended by ``os._exit`` leaves none, and its source tells which exit it may have taken after its
last call (:func:`pytest_ddp.diagnose.code_paths.exits_after`), as it tells a rank that returned
while its peers went on which ``break`` in a branch for it alone it took.  A stalled rank's line is its
stack's, dumped after the verdict: the report reads it there."""

from __future__ import annotations

import re
from typing import Any

from pytest_ddp.diagnose import code_paths
from pytest_ddp.diagnose.state import RankState, ops_made, site_parts

# A traceback's frame line, as ``--tb=native`` writes it.
_NATIVE = re.compile(r'\s*File "(?P<file>.*)", line (?P<line>\d+)')


def raised_at(reports: dict[str, dict[str, Any]]) -> str | None:
    """``test_x.py:57``: the innermost frame in the test's own file of the first failed report's
    traceback (its setup's, call's or teardown's); None where none has one there."""
    for report in reports.values():
        data = report.get("data")
        if report.get("outcome") != "failed" or not isinstance(data, dict):
            continue
        location, longrepr = data.get("location"), data.get("longrepr")
        if not isinstance(location, (list, tuple)) or not location or not isinstance(longrepr, dict):
            continue
        frames = [frame for frame in _frames(longrepr) if _same_file(frame[0], str(location[0]))]
        if frames:
            file, line = frames[-1]
            return f"{file}:{line}"
    return None


def _frames(longrepr: dict[str, Any]) -> list[tuple[str, int]]:
    """(file, line) of each entry of the traceback (the last exception's), outermost first."""
    entries = (longrepr.get("reprtraceback") or {}).get("reprentries") or []
    frames = []
    for entry in entries:
        data = entry.get("data") or {}
        where = data.get("reprfileloc")
        if isinstance(where, dict) and isinstance(where.get("lineno"), int):
            frames.append((str(where.get("path")), where["lineno"]))
        if entry.get("type") == "ReprEntryNative":
            for text in data.get("lines") or []:
                frames += [(m["file"], int(m["line"])) for m in _NATIVE.finditer(text)]
    return frames


def _same_file(path: str, test_file: str) -> bool:
    """The two names of one file: pytest writes a traceback's relative to the working directory
    (absolute where that is shorter), and a test's location relative to the rootdir."""
    a, b = path.replace("\\", "/"), test_file.replace("\\", "/")
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def left_at(state: RankState, ranks: dict[int, RankState], source: code_paths.Source) -> str | None:
    """``test_x.py:145``: where a rank that left outside any call, after its last call, left by,
    where its code holds one way out reachable from that call before its next: an exit
    (``os._exit(1)``) for a process that ended with an exit status, a ``break`` or ``return`` in a
    branch of the code for that rank alone for a rank that returned from its test (before any call:
    on the way to the call its peers wait in); None otherwise."""
    returned = state.finished and not state.failed and state.alive
    ended_itself = state.exit_code is not None and state.exit_code >= 0  # an exit status, not a signal
    exited = not state.alive and ended_itself and state.died_in is None
    if not (returned or exited):
        return None
    last = next((c for c in reversed(state.calls) if (c.is_collective or c.is_p2p) and c.site), None)
    # A rank that returned before any call: from the start of the function its peers wait in.
    waited = next((c for s in ranks.values() if (c := s.blocked_call) is not None and c.site), None)
    walked_from = last or waited
    if walked_from is None or (last is None and exited):
        return None
    file, start = site_parts(walked_from.site)
    text = source(file)
    if text is None or start is None:
        return None
    made = ops_made(ranks.values(), file)
    if exited:
        lines = code_paths.exits_after(text, start, made)
    else:
        lines = code_paths.leaves_in_own_branch(text, start, made, state.rank, from_entry=last is None)
    return f"{file}:{lines[0]}" if lines is not None and len(lines) == 1 else None

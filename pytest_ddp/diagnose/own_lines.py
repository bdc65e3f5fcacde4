"""A culprit rank's own line, where the run holds it: the line of the test's file its code raised
at, or the exit its code took.  Pure.

A verdict names the call the peers wait in; the user's fix is at the culprit's own line.  A raise
leaves a traceback in the rank's failed report (pytest's serialized ``longrepr``); a process that
ended by ``os._exit`` leaves none, and its source tells which exit it may have taken after its
last call (:func:`pytest_ddp.diagnose.code_paths.exits_after`), as it tells a rank that returned
while its peers went on which ``break`` it took: in a branch for it alone, or under a test of a
value that differs between ranks.  A stalled rank's line is its stack's, dumped after the
verdict: the report reads it there."""

from __future__ import annotations

import re
from typing import Any

from pytest_ddp.diagnose import code_paths
from pytest_ddp.diagnose.source_text import Source
from pytest_ddp.diagnose.state import LeftBy, RankState, ops_made, site_parts

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


def exited_at(state: RankState, ranks: dict[int, RankState], source: Source) -> str | None:
    """``test_x.py:145``: the exit (``os._exit(1)``) a process that ended with an exit status outside
    any call took after its last call, where its code holds one reachable from that call before its
    next; None otherwise."""
    ended_itself = state.exit_code is not None and state.exit_code >= 0  # an exit status, not a signal
    if state.alive or not ended_itself or state.died_in is not None:
        return None
    walk = _walk_from(state, ranks, source, from_entry_allowed=False)
    if walk is None:
        return None
    text, file, start, made, _ = walk
    lines = code_paths.exits_after(text, start, made)
    return f"{file}:{lines[0]}" if lines is not None and len(lines) == 1 else None


def left_by(state: RankState, ranks: dict[int, RankState], source: Source) -> LeftBy | None:
    """The ``break`` or ``return`` a rank that returned from its test left by, after its last call
    (before any call: on the way to the call its peers wait in), where its code holds one way out
    reachable from there before its next call (:func:`ways_out`); None otherwise."""
    found = ways_out(state, ranks, source)
    if found is None or len(found[1]) != 1:
        return None
    file, [leave] = found
    return as_left_by(file, leave)


def ways_out(
    state: RankState, ranks: dict[int, RankState], source: Source
) -> tuple[str, list[code_paths.Leave]] | None:
    """(the file, the ``break`` and ``return`` statements there) a rank that returned from its test
    may have left by: in a branch of the code for that rank alone, or under a test of a value that
    may differ between ranks (:func:`pytest_ddp.diagnose.code_paths.leaves_in_own_branch`); None
    where it did not return, or the code cannot tell."""
    if not (state.finished and not state.failed and state.alive):
        return None
    walk = _walk_from(state, ranks, source, from_entry_allowed=True)
    if walk is None:
        return None
    text, file, start, made, from_entry = walk
    leaves = code_paths.leaves_in_own_branch(text, start, made, state.rank, from_entry=from_entry)
    return None if leaves is None else (file, leaves)


def as_left_by(file: str, leave: code_paths.Leave) -> LeftBy:
    """A way out of the code of ``file``, as the rank's state and the verdict say it."""
    return LeftBy(f"{file}:{leave.line}", None if leave.own else f"{file}:{leave.test}")


def _walk_from(
    state: RankState, ranks: dict[int, RankState], source: Source, from_entry_allowed: bool
) -> tuple[str, str, int, dict[int, str], bool] | None:
    """(the source, its file, the line and ops made there, whether from its function's entry) where
    the way a rank left is looked for: its last call's line, else, for a rank that made none, the
    call its peers wait in, from the start of the function holding it."""
    last = next((c for c in reversed(state.calls) if (c.is_collective or c.is_p2p) and c.site), None)
    waited = next((c for s in ranks.values() if (c := s.blocked_call) is not None and c.site), None)
    walked_from = last or (waited if from_entry_allowed else None)
    if walked_from is None:
        return None
    file, start = site_parts(walked_from.site)
    text = source(file)
    if text is None or start is None:
        return None
    return text, file, start, ops_made(ranks.values(), file), last is None

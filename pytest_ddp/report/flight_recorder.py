"""A failed test's calls in the format of torch's Flight Recorder: one dump per rank, which
torch's own analyser (``torchfrtrace <folder>``) reads.

A dump is a pickled dict: ``version``, ``pg_config`` (each group: name, description, ranks),
``pg_status`` and ``entries``, one per collective in call order; the analyser matches entries by
``collective_seq_id`` and names the missing ranks and the entries that differ.

They follow what torch 2.13's recorder writes for Gloo on CPU, but name every group with its
ranks (torch's names none, on which ``torchfrtrace`` fails with a ``KeyError``):

- the state is always "scheduled" (times in the ``time_discovered`` fields): the analyser blames
  ranks whose states differ, and Gloo may let one rank out of a collective its peers are still in;
- sends and receives get no entry: the analyser expects every member of the group in each entry.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

from pytest_ddp.common.ops import COLLECTIVES
from pytest_ddp.diagnose.state import Call, RankState, site_parts
from pytest_ddp.report import writable
from pytest_ddp.report.writable import file_name

VERSION = "2.10"  # the format torch 2.13's recorder writes, which its analyser reads
PREFIX = "rank_"  # a dump's file name: rank_0, rank_1, ...
# The analyser refuses other libraries in a profiling name: an MPI world's calls are written as NCCL's.
LIBRARIES = ("gloo", "nccl")
WORLD = "WORLD"

# torch's names of its dtypes, as its recorder writes them.
SCALAR_TYPES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
}


def _group_desc(name: str) -> str:
    return "default_pg" if name == WORLD else "undefined"  # torch's, for an unnamed group


def _sizes(call: Call, size: int) -> tuple[list[list[int]], list[list[int]]]:
    """Input and output sizes; those pytest-ddp does not compare (uneven splits, objects) as zero
    elements on every rank, so that the analyser judges the op alone."""
    kind = call.kind
    if kind.tensors is None and kind.obj is None and not call.shapes:
        return [], []  # a barrier, a communicator made: no tensors
    if kind.uneven or not call.shapes:
        return [[0]], [[0]]
    shapes = [list(s) for s in call.shapes]
    # The analyser checks a gather's output against the group's inputs (a reduce-scatter's input
    # against its outputs): the side not recorded is written as the group makes it.
    if kind.described == "part_of_output":
        return shapes, [[size, *s] for s in shapes]
    if kind.described == "part_of_input":
        return [[size, *s] for s in shapes], shapes
    if kind.described == "whole_input":
        return shapes, [[math.prod(s) // size] for s in shapes]
    return shapes, shapes


def _frames(call: Call) -> list[dict[str, Any]]:
    """The call's frames, innermost first (the library's frame that made it, if any, then the
    user's site), each named by the operation called from it: ``all_reduce at test_x.py:12``."""
    frames = []
    for site in (call.caller, call.site):
        if site:
            filename, line = site_parts(site)
            frames.append({"name": call.kind.method, "filename": filename, "line": line or 0})
    return frames


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


def _has_entry(call: Call) -> bool:
    """A collective of a group: not a send or receive (see the module's docstring), nor the
    making of a group, nor a collective called before there was a group (it raised)."""
    return call.op in COLLECTIVES and bool(call.group_ranks)


def groups_of(states: list[RankState]) -> dict[int, dict[str, tuple[int, ...]]]:
    """Per rank, the groups it is in, by name: those it made an entry on, then those of others'
    entries that list it (a member that never reached the group's first call)."""
    own: dict[int, dict[str, tuple[int, ...]]] = {}
    for state in states:
        own[state.rank] = {}
        for call in state.calls:
            if _has_entry(call):
                own[state.rank].setdefault(call.group, call.group_ranks)
    groups = {rank: dict(mine) for rank, mine in own.items()}
    for mine in own.values():
        for name, ranks in mine.items():
            for rank in ranks:
                groups.setdefault(rank, {}).setdefault(name, ranks)
    return groups


def dump(
    state: RankState, groups: dict[str, tuple[int, ...]], pg_ids: dict[str, int], library: str, timeout: float
) -> dict[str, Any]:
    """One rank's dump: its collectives as entries; ``groups`` the rank's (:func:`groups_of`),
    ``pg_ids`` every group's number."""
    collectives = dict.fromkeys(groups, 0)  # group -> its last collective's number
    completed = dict.fromkeys(groups, 0)
    ops = dict.fromkeys(groups, 0)
    entries: list[dict[str, Any]] = []
    for call in state.calls:
        if not _has_entry(call):
            continue
        collectives[call.group] = call.seq
        if call.state != "running":
            completed[call.group] = call.seq
        ops[call.group] += 1
        inputs, outputs = _sizes(call, len(call.group_ranks))
        dtypes = [SCALAR_TYPES.get(d, d) for d in call.dtypes]
        entries.append(
            {
                "record_id": len(entries),
                "pg_id": pg_ids[call.group],
                "process_group": (call.group, _group_desc(call.group)),
                "collective_seq_id": collectives[call.group],
                "p2p_seq_id": 0,
                "op_id": ops[call.group],
                "profiling_name": f"{library}:{call.kind.flight_recorder_name}",
                "time_created_ns": _ns(call.enter),
                "input_sizes": inputs,
                "input_dtypes": dtypes if inputs else [],
                "output_sizes": outputs,
                "output_dtypes": dtypes if outputs else [],
                "state": "scheduled",
                "time_discovered_started_ns": _ns(call.enter),
                "time_discovered_completed_ns": _ns(call.exit),
                "retired": call.exit is not None,
                "timeout_ms": int(timeout * 1000),
                "is_p2p": False,
                "frames": _frames(call),
            }
        )
    return {
        "version": VERSION,
        "pg_config": {
            name: {"name": name, "desc": _group_desc(name), "ranks": str(list(ranks))}
            for name, ranks in groups.items()
        },
        "pg_status": {
            str(pg_ids[name]): {
                "last_enqueued_collective": collectives[name],
                "last_started_collective": collectives[name],
                "last_completed_collective": completed[name],
            }
            for name in groups
        },
        "entries": entries,
    }


def write(directory: str | Path, test_id: str, states: list[RankState], backend: str, timeout: float) -> Path:
    """``<test>.fr/``, beside the test's other report files: a dump ``rank_<N>`` per rank, those
    that died or made no call included (the analyser wants one of each member); its path. The
    folder and its files as :mod:`pytest_ddp.report.writable` writes them: never through a link."""
    fr_name = f"{file_name(test_id)}.fr"
    library = backend if backend in LIBRARIES else "nccl"
    groups = groups_of(states)
    pg_ids: dict[str, int] = {}
    for mine in groups.values():
        for name in mine:
            pg_ids.setdefault(name, len(pg_ids))
    with writable.folder(directory) as parent, writable.folder(fr_name, parent) as dumps:
        for state in states:
            data = pickle.dumps(dump(state, groups[state.rank], pg_ids, library, timeout))
            writable.write_file(dumps, f"{PREFIX}{state.rank}", data)
    return Path(directory) / fr_name

"""A failing test's JSON report (:func:`pytest_ddp.report.json_report.to_json`) as a timeline: each
rank's calls as slices in time, those still running at the verdict marked stuck, and as a Chrome
trace (which Perfetto and chrome://tracing open; :mod:`pytest_ddp.report.picture` draws the HTML).

Pure: a report dict in, data and text out; times are seconds from the report's ``started``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_ddp.common.ops import op


@dataclass(frozen=True)
class Slice:
    """One call on one rank, placed in time."""

    rank: int
    lane: int  # 0, or a further lane for a call that overlaps an earlier one (asynchronous work)
    start: float  # seconds from the test's start
    end: float
    call: dict[str, Any]  # the report's call
    stuck: bool  # still running at the verdict, on a rank still alive
    died_in: bool  # still running when its rank died

    @property
    def label(self) -> str:
        """``all_reduce #3``: the report's label of the call."""
        return str(self.call["label"])

    @property
    def kind(self) -> str:
        """The operation's kind: collective, p2p, batch or group."""
        return op(self.call["op"]).kind


@dataclass(frozen=True)
class Timeline:
    """The report's calls in time; ``end`` is the later of the verdict and the last event."""

    verdict: float
    end: float
    slices: list[Slice]
    lanes: dict[int, int]  # rank -> number of lanes (at least 1)
    rank_ends: dict[int, tuple[str, float]]  # rank -> ("finished" or "died", when)


def timeline(report: dict[str, Any]) -> Timeline:
    """Place every call of every rank of ``report`` in time."""
    # A test no rank ran has neither time, and no calls to place.
    origin = float(report.get("started", 0.0))
    verdict = float(report.get("ended", origin)) - origin
    slices: list[Slice] = []
    lanes: dict[int, int] = {}
    rank_ends: dict[int, tuple[str, float]] = {}
    for rank in report["ranks"]:
        alive = rank.get("alive", True)
        stop = verdict  # where a call still running ends: the verdict, or the rank's death
        if not alive and rank.get("died_at") is not None:
            stop = rank["died_at"] - origin
            rank_ends[rank["rank"]] = ("died", stop)
        elif rank.get("finished_at") is not None:
            rank_ends[rank["rank"]] = ("finished", rank["finished_at"] - origin)
        lane_ends: list[float] = []  # where each lane's last call ended
        for call in sorted(rank["calls"], key=lambda c: (c["enter"], c["index"])):
            start = call["enter"] - origin
            running = call.get("exit") is None
            finish = max(start, stop if running else call["exit"] - origin)
            lane = next((i for i, last in enumerate(lane_ends) if last <= start), len(lane_ends))
            if lane == len(lane_ends):
                lane_ends.append(finish)
            lane_ends[lane] = finish
            stuck, died_in = running and alive, running and not alive
            slices.append(Slice(rank["rank"], lane, start, finish, call, stuck, died_in))
        lanes[rank["rank"]] = max(1, len(lane_ends))
    end = max([verdict, *(piece.end for piece in slices), *(when for _, when in rank_ends.values())])
    return Timeline(verdict, end, slices, lanes, rank_ends)


def verdict_name(report: dict[str, Any]) -> str:
    """``deadlock (partial)``, ``timeout``, ``not started``: the verdict in a few words."""
    status = str(report.get("status") or "failed").replace("_", " ")
    kind = report.get("kind")
    return f"{status} ({kind})" if kind and kind != status else status


def headline(report: dict[str, Any]) -> str:
    """The report's headline; of a test no rank ran (whose report has none), its error's first line."""
    if "start_error" in report:
        return f"ddp: not started: {report['start_error'].splitlines()[0]}"
    return str(report["headline"])


# -- the Chrome trace ------------------------------------------------------------------------------

PID = 1  # the whole test is one process in the trace; each rank (and lane) a thread
STUCK_CNAME = "terrible"  # chrome://tracing's reserved red; Perfetto colours by name
US = 1e6  # the format's times are microseconds


def _us(seconds: float) -> float:
    return round(seconds * US, 3)


def _args(piece: Slice) -> dict[str, Any]:
    call = piece.call
    keys = (
        "op", "seq", "group", "group_ranks", "shapes", "dtypes", "site", "caller", "peer", "root", "error"
    )
    args = {key: call[key] for key in keys if call.get(key) not in (None, [], "")}
    if piece.stuck:
        args["state"] = "stuck"
    elif piece.died_in:
        args["state"] = "running when the rank died"
    else:
        args["state"] = call.get("state")
    if call.get("async"):
        args["async"] = True
    return args


def trace(report: dict[str, Any]) -> dict[str, Any]:
    """The report as a Chrome trace: a track per rank (more where calls overlap), a slice per call
    (``... [stuck]`` ones), and instants for the ranks' ends and the verdict."""
    line = timeline(report)
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "pid": PID,
            "name": "process_name",
            "args": {"name": f"{report['test']}: {verdict_name(report)}"},
        }
    ]
    tids: dict[tuple[int, int], int] = {}
    for rank in sorted(line.lanes):
        for lane in range(line.lanes[rank]):
            tid = tids[rank, lane] = len(tids) + 1
            name = f"rank {rank}" + (f" (overlapping calls {lane})" if lane else "")
            events.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": name}})
            sort = {"sort_index": tid}
            events.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index", "args": sort})
    for piece in line.slices:
        tid = tids[piece.rank, piece.lane]
        event = {
            "ph": "X",
            "pid": PID,
            "tid": tid,
            "ts": _us(piece.start),
            "dur": _us(piece.end - piece.start),
            "name": piece.label + (" [stuck]" if piece.stuck else ""),
            "cat": "stuck" if piece.stuck else piece.kind,
            "args": _args(piece),
        }
        if piece.stuck:
            event["cname"] = STUCK_CNAME
            marker = {"ph": "i", "s": "t", "pid": PID, "tid": tid, "ts": _us(piece.end), "cat": "stuck"}
            events += [event, {**marker, "name": f"stuck in {piece.label}", "cname": STUCK_CNAME}]
        else:
            if piece.call.get("state") == "raised" or piece.died_in:
                event["cname"] = "bad"
            events.append(event)
    for rank, (how, when) in sorted(line.rank_ends.items()):
        end = {"ph": "i", "s": "t", "pid": PID, "tid": tids[rank, 0], "ts": _us(when)}
        events.append({**end, "name": f"rank {rank} {how}"})
    verdict = {
        "ph": "i",
        "s": "g",
        "pid": PID,
        "ts": _us(line.verdict),
        "name": f"verdict: {verdict_name(report)}",
        "args": {key: report.get(key) for key in ("summary", "culprits", "waiting", "call", "elapsed")},
    }
    events.append(verdict)
    other = {"test": report["test"], "headline": headline(report), "verdict": verdict_name(report)}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}

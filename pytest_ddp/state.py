"""What the controller knows about each rank: the event log and the states built from it.

A rank tells its controller everything through one append-only file of JSON
lines, written with one unbuffered ``os.write`` per event.  A line is whole
even if the rank dies right after writing it, and the controller can read the
file while the rank is blocked inside a C++ collective or after it died.  No
pipe, no thread in the rank that could itself be stuck.

Events (``"e"`` names the kind; ``"t"`` is ``time.time()`` in the rank):

``test``    a new test starts on this rank: ``id`` (node id or function name)
``phase``   a test phase starts: ``when`` (setup/call/teardown)
``report``  a phase ended: ``when``, ``outcome`` (passed/failed/skipped),
            ``data`` (the serialized pytest report, or for ``run()`` the result)
``done``    the test is over on this rank (after teardown)
``call``    a torch.distributed call was entered: see :class:`Call`
``ret``     call ``i`` returned (``ok`` true) or raised (``ok`` false, ``err``)

The controller folds the events of the current test into a :class:`RankState`;
the watchdog judges a :class:`Snapshot` of all of them.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from .ops import Op, op

def exit_text(code: int | None) -> str:
    """``exit code 1``, or ``killed by SIGABRT`` for a negative (signal) exit code."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class EventLog:
    """The rank side: appends one JSON line per event, unbuffered."""

    _encoder = json.JSONEncoder(separators=(",", ":"), default=str)  # built once: dumps() builds one per call

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, event: dict[str, Any]) -> None:
        self.write_line(self._encoder.encode(event))

    def write_line(self, line: str) -> None:
        """A line already in the event format (the recorder's hot path)."""
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class EventReader:
    """The controller side: returns the whole lines appended since the last read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: Any = None  # opened once the rank has created it
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        if self._file is None:
            try:
                self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 - read for the group's life
            except FileNotFoundError:
                return []
        data = self._partial + self._file.readall()
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when data ended with a newline
        lines = [line for line in lines if line.strip()]
        # One parse for all of them: much cheaper than one per line.
        return json.loads(b"[" + b",".join(lines) + b"]") if lines else []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class Call:
    """One recorded torch.distributed call on one rank."""

    index: int  # per-rank call number in this test, from 0
    op: str  # function name: "all_reduce", "recv", "init_process_group", ...
    group: str  # group name: "WORLD" for the default group
    group_ranks: tuple[int, ...]  # global ranks in the group
    seq: int  # 1-based; per group for collectives, per (group, op kind, peer) for p2p
    site: str  # "file.py:12": the first frame outside torch and pytest_ddp
    enter: float
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    peer: int | None = None  # p2p: the other rank (src of a recv, dst of a send); None = any
    root: int | None = None  # rooted collectives: broadcast/scatter src, reduce/gather dst
    is_async: bool = False
    obj_type: str | None = None  # *_object calls: type of the object(s)
    obj_size: int | None = None  # *_object calls: pickled size in bytes
    extra: dict[str, Any] = field(default_factory=dict)  # init: rank, world_size, init_method
    exit: float | None = None
    error: str | None = None  # "TypeError: cannot pickle '_thread.lock' object"

    @property
    def state(self) -> str:
        """"running" while inside the call, then "ok" or "raised"."""
        if self.exit is None:
            return "running"
        return "raised" if self.error is not None else "ok"

    @property
    def kind(self) -> Op:
        """What the operation is (see :mod:`pytest_ddp.ops`)."""
        return op(self.op)

    @property
    def is_p2p(self) -> bool:
        """A send or receive between two ranks (not batch_isend_irecv, to many at once)."""
        return self.kind.pairs

    @property
    def is_recv(self) -> bool:
        return self.kind.direction == "recv"

    @property
    def blocks(self) -> bool:
        """The caller stays inside until the call is done (not so for asynchronous work)."""
        return not self.is_async and self.kind.blocks

    @property
    def is_collective(self) -> bool:
        """Every member of its group must enter it: it has a number in the group's sequence."""
        return self.kind.is_collective

    @property
    def label(self) -> str:
        """``all_reduce #3`` or ``recv #1 from 0``: how reports name a call."""
        text = f"{self.op} #{self.seq}" if self.seq else self.op
        if self.is_p2p:
            direction = "from" if self.is_recv else "to"
            text += f" {direction} {'any' if self.peer is None else self.peer}"
        if self.group != "WORLD":
            text += f" on group {self.group} {list(self.group_ranks)}"
        return text

    def signature(self) -> tuple[Any, ...]:
        """What the ranks should agree on for the same collective to mean the same thing on each:
        op, shapes, dtypes and root; not the shapes of an operation whose splits may be uneven."""
        shapes = () if self.kind.uneven else tuple(tuple(s) for s in self.shapes)
        return (self.op, shapes, tuple(self.dtypes), self.root)

    @classmethod
    def from_event(cls, ev: dict[str, Any]) -> Call:
        return cls(
            index=ev["i"],
            op=ev["op"],
            group=ev.get("group", "WORLD"),
            group_ranks=tuple(ev.get("ranks", ())),
            seq=ev.get("seq", 0),
            site=ev.get("site", "?"),
            enter=ev["t"],
            shapes=ev.get("shapes", []),
            dtypes=ev.get("dtypes", []),
            devices=ev.get("devices", []),
            peer=ev.get("peer"),
            root=ev.get("root"),
            is_async=ev.get("async", False),
            obj_type=ev.get("obj_type"),
            obj_size=ev.get("obj_size"),
            extra=ev.get("extra", {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "op": self.op,
            "group": self.group,
            "group_ranks": list(self.group_ranks),
            "seq": self.seq,
            "site": self.site,
            "state": self.state,
            "enter": self.enter,
            "exit": self.exit,
            "shapes": self.shapes,
            "dtypes": self.dtypes,
            "devices": self.devices,
            "peer": self.peer,
            "root": self.root,
            "async": self.is_async,
            "obj_type": self.obj_type,
            "obj_size": self.obj_size,
            "extra": self.extra,
            "error": self.error,
        }


@dataclass
class RankState:
    """One rank during one test, as the controller sees it."""

    rank: int
    alive: bool = True
    exit_code: int | None = None  # negative: killed by that signal
    phase: str = "starting"  # starting, setup, call, teardown, finished
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)  # when -> report event
    calls: list[Call] = field(default_factory=list)
    finished_at: float | None = None  # the test ended on this rank (done event)
    failed_at: float | None = None  # first failing report, or death
    died_at: float | None = None
    peak_rss: int | None = None  # bytes, reported by the rank when its test ended
    peak_cuda: int | None = None
    group_intact: bool = True  # the rank's process group outlived the test (init=True groups)
    # Asynchronous calls whose work had not completed shortly after the test
    # ended: [{"i": call index, "err": why}].
    in_flight: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.failed_at is not None

    @property
    def finished(self) -> bool:
        """Out of the test for good: its test ended, or its process is gone."""
        return self.finished_at is not None or not self.alive

    @property
    def current_call(self) -> Call | None:
        """The call this rank is blocked in, if any (the last one, still running, and one that
        blocks: issuing asynchronous work takes a moment, but waits for nobody)."""
        if self.calls and self.calls[-1].state == "running" and self.calls[-1].blocks and self.alive:
            return self.calls[-1]
        return None

    def apply(self, ev: dict[str, Any]) -> None:
        """Fold one event of the current test into this state."""
        kind = ev["e"]
        if kind == "call":
            self.calls.append(Call.from_event(ev))
        elif kind == "ret":
            call = self.calls[ev["i"]] if ev["i"] < len(self.calls) else None
            if call is not None:
                call.exit = ev["t"]
                if not ev.get("ok", True):
                    call.error = ev.get("err", "error")
        elif kind == "phase":
            self.phase = ev["when"]
        elif kind == "report":
            self.reports[ev["when"]] = ev
            if ev["outcome"] == "failed" and self.failed_at is None:
                self.failed_at = ev["t"]
        elif kind == "done":
            self.phase = "finished"
            self.finished_at = ev["t"]
            self.peak_rss = ev.get("peak_rss")
            self.peak_cuda = ev.get("peak_cuda")
            self.group_intact = ev.get("group_intact", True)
            self.in_flight = ev.get("in_flight", [])

    def mark_dead(self, exit_code: int, when: float) -> None:
        self.alive = False
        self.exit_code = exit_code
        self.died_at = when
        if self.finished_at is None and self.failed_at is None:
            self.failed_at = when


@dataclass
class Snapshot:
    """All ranks of one test at one moment: the watchdog's whole input."""

    now: float
    started: float  # when the test was handed to the ranks
    timeout: float  # seconds
    grace: float  # seconds a failed rank's peers get before they are stopped
    ranks: list[RankState]

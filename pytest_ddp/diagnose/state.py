"""What the controller knows about each rank: a :class:`RankState` folded from the events of the
current test (:mod:`pytest_ddp.common.protocol`); the watchdog judges a :class:`Snapshot` of all.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from pytest_ddp.common.ops import DESTROY, INIT, NEW_GROUP, Op, op
from pytest_ddp.common.protocol import (
    NULL_PEER,
    CallEvent,
    Done,
    Event,
    Fatal,
    Injected,
    PhaseStart,
    ProtocolError,
    Report,
    RetEvent,
    Setting,
    TestStart,
    ThreadRaised,
    WaitEvent,
    WarningRecorded,
    to_wire,
)
from pytest_ddp.faults import DEADLY


def exit_text(code: int | None) -> str:
    """``exit code 1``, or ``killed by SIGABRT`` for a negative (signal) exit code."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def site_parts(site: str) -> tuple[str, int | None]:
    """``"tests/t.py:12"`` -> ``("tests/t.py", 12)``; a site with no line number -> (it, None)."""
    file, _, line = site.rpartition(":")
    return (file, int(line)) if file and line.isdecimal() else (site, None)


def ops_made(states: Iterable[RankState], file: str) -> dict[int, str]:
    """Line of ``file`` -> the op the ranks' calls from it were, where they were all one op made
    there, not inside a library (what :mod:`pytest_ddp.diagnose.code_paths` reads as a line's call)."""
    ops: dict[int, set[str | None]] = {}
    for call in (c for state in states for c in state.calls if c.is_collective or c.is_p2p):
        where, line = site_parts(call.site)
        if where == file and line is not None:
            ops.setdefault(line, set()).add(call.op if call.caller is None else None)
    made: dict[int, str] = {}
    for line, names in ops.items():
        op = next(iter(names))
        if len(names) == 1 and op is not None:
            made[line] = op
    return made


def _peer_text(peer: int | None, mpi: bool) -> str:
    """MPI's PROC_NULL is ``null``; torch's -1 is a rank number, if no rank's."""
    return "any" if peer is None else "null" if mpi and peer == NULL_PEER else str(peer)


def _tag_text(tag: int | None) -> str:
    return " (any tag)" if tag is None else f" (tag {tag})"


# init_process_group's rendezvous that use no store of the rank group's: a store passed, a file.
_OWN_STORES = ("store", "file://")


# What the JSON report says of a call, in its order (Call.to_dict).
_REPORTED = (
    "index", "op", "group", "group_ranks", "seq", "site", "caller", "state", "enter", "exit", "shapes",
    "dtypes", "devices", "peer", "root", "tag", "async", "obj_type", "obj_size", "extra", "error",
)


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
    tag: int | None = None  # MPI p2p: the message's tag; None: a receive of any tag
    is_async: bool = False
    obj_type: str | None = None  # *_object calls: type of the object(s)
    obj_size: int | None = None  # *_object calls: pickled size in bytes
    extra: dict[str, Any] = field(default_factory=dict)  # init: rank, world_size, init_method
    # Made inside a library: its frame (``site`` is then the user's line that led there).
    caller: str | None = None
    # The user's lines that led to ``site``, innermost first (the calls of the user's functions).
    outer: tuple[str, ...] = ()
    exit: float | None = None
    error: str | None = None  # "TypeError: cannot pickle '_thread.lock' object"
    before_backend: bool = False  # raised before its group's backend was handed it: the group is as it was
    # An MPI receive that returned: the sender and tag of the message it got, where it left them open.
    got_source: int | None = None
    got_tag: int | None = None

    @property
    def state(self) -> str:
        if self.exit is None:
            return "running"
        return "raised" if self.error is not None else "ok"

    @property
    def kind(self) -> Op:
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
        """``all_reduce #3``, ``recv #1 from 0``, ``Send #1 to 0 (tag 5)``: how reports name a call."""
        kind = self.kind
        text = f"{kind.method} #{self.seq}" if self.seq else kind.method
        if self.is_p2p:
            direction = "from" if self.is_recv else "to"
            text += f" {direction} {_peer_text(self.peer, kind.api == 'mpi')}"
            if kind.api == "mpi":
                text += _tag_text(self.tag)
                if kind.recv_from:  # Sendrecv
                    source, tag = self.extra.get("recv_from"), self.extra.get("recv_tag")
                    text += f", from {_peer_text(source, True)}{_tag_text(tag)}"
        if self.group != "WORLD":
            text += f" on group {self.group} {list(self.group_ranks)}"
        return text

    @property
    def reduction(self) -> str | None:
        """The reduce op it was given (``MAX``, ``MPI_SUM``); None where none or not recorded."""
        return self.extra.get("op")

    def signature(self) -> tuple[Any, ...]:
        """What the ranks must agree on in one collective: op, shapes (unless splits may be
        uneven), dtypes, root and reduce op."""
        shapes = () if self.kind.uneven else tuple(tuple(s) for s in self.shapes)
        return (self.op, shapes, tuple(self.dtypes), self.root, self.reduction)

    @classmethod
    def from_event(cls, ev: CallEvent) -> Call:
        # Each of the event's fields is the call's, under its name, but the time it entered.
        named = {f.name: getattr(ev, f.name) for f in fields(ev) if f.name != "time"}
        named.update(group_ranks=tuple(ev.group_ranks), outer=tuple(ev.outer))
        return cls(**named, enter=ev.time)

    def to_dict(self) -> dict[str, Any]:
        """The call in the JSON report: :data:`_REPORTED`, each under its name (``async``: is_async's)."""
        reported = {key: getattr(self, "is_async" if key == "async" else key) for key in _REPORTED}
        reported["group_ranks"] = list(self.group_ranks)
        return reported


# /proc/PID/status's signal masks, in the order they decide what a signal does.
_USR1 = (("SigBlk", "blocked"), ("SigIgn", "ignored"), ("SigCgt", "caught"))


@dataclass(frozen=True)
class Process:
    """What the kernel said of a live rank's process when the verdict came (/proc/PID/stat, status)."""

    state: str  # R, S, D, T (stopped: SIGSTOP), t (stopped by a debugger), Z, ...
    usr1: str  # SIGUSR1's handling, which asks for the stacks: "caught", "ignored", "blocked", "default"

    @classmethod
    def read(cls, state: str, status: dict[str, str]) -> Process:
        bit = 1 << (signal.SIGUSR1 - 1)

        def has(name: str) -> bool:
            try:
                return bool(int(status.get(name, "0"), 16) & bit)
            except ValueError:
                return False

        found = [name for field, name in _USR1 if has(field)]
        return cls(state, found[0] if found else "default")

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")

    @property
    def text(self) -> str:
        """``stopped (state T in /proc: SIGSTOP, or a debugger)``, ``state S in /proc``."""
        if not self.stopped:
            return f"state {self.state} in /proc"
        by = "a debugger" if self.state == "t" else "SIGSTOP, or a debugger"
        return f"stopped (state {self.state} in /proc: {by})"

    @property
    def no_stack(self) -> str:
        """Why the process wrote no Python stack when asked (SIGUSR1, faulthandler's)."""
        if self.stopped:
            return "no Python stack: a stopped process runs no signal handler"
        if self.usr1 in ("ignored", "blocked"):
            return f"no Python stack: SIGUSR1, which asks for it, is {self.usr1} (the test's doing)"
        if self.usr1 == "default":
            return "no Python stack: SIGUSR1, which asks for it, has no handler (the test reset it)"
        return (f"no Python stack came: SIGUSR1, which asks for it, has another handler (the test's),"
                f" or the process ran no Python ({self.text})")


@dataclass(frozen=True)
class LeftBy:
    """The ``break`` or ``return`` a rank that returned left its peers by."""

    site: str  # ``t.py:6``
    # None: in a branch of the code for that rank alone; else the test it is under, of a value that
    # may differ between ranks (``t.py:5``: ``if stop:``, ``stop`` set under ``if rank == 0:``).
    value_test: str | None = None


@dataclass
class RankState:
    """One rank during one test, as the controller sees it."""

    rank: int
    alive: bool = True
    exit_code: int | None = None  # negative: killed by that signal
    phase: str = "starting"  # starting, setup, call, teardown, finished
    # when -> the report event in its wire form (watchdog and merge read it so).
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    finished_at: float | None = None  # the test ended on this rank (done event)
    failed_at: float | None = None  # first failing report, or death
    died_at: float | None = None
    peak_rss: int | None = None  # bytes, reported by the rank when its test ended
    peak_cuda: int | None = None
    group_intact: bool = True  # see protocol.Done
    group_alive: bool = False  # see protocol.Done
    # Asynchronous calls whose work had not completed after the test: [{"i": index, "err": why}].
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    waiting_on: int | None = None  # index of the asynchronous call whose work the rank waits for
    threads_left: list[dict[str, str]] = field(default_factory=list)  # see protocol.Done
    interrupted: dict[str, Any] | None = None  # pytest.exit() or KeyboardInterrupt in the test
    warnings: list[WarningRecorded] = field(default_factory=list)
    thread_raised: list[ThreadRaised] = field(default_factory=list)  # its test's threads that raised
    injected: list[Injected] = field(default_factory=list)  # faults that fired on this rank, in order
    settings: list[Setting] = field(default_factory=list)  # values the ranks must give alike, in order
    fatal: str | None = None  # the first Fatal event's error: the rank exits, or its events were lost
    process: Process | None = None  # a rank still in the test when the verdict came: the kernel's word
    stack_missing: bool = False  # asked for its stacks at the verdict, it wrote none
    # A process that ended by an exit outside any call: the exit its code took (own_lines.exited_at).
    exited_at: str | None = None
    # A rank that returned while its peers went on: the break or return it left by (own_lines.left_by).
    left_by: LeftBy | None = None
    # Its new_group calls, and how many of its calls were looked at for them (new_groups).
    _new_groups: list[Call] = field(default_factory=list, init=False, repr=False)
    _looked_at: int = field(default=0, init=False, repr=False)

    @property
    def failed(self) -> bool:
        return self.failed_at is not None

    @property
    def used_store(self) -> bool:
        """The test made a default group by a rendezvous on its rank group's store (``env://``, or
        ``tcp://`` to it), whose keys stay there: no later rendezvous can be made on that store."""
        methods = [str(c.extra.get("init_method")) for c in self.calls if c.op == INIT]
        return any(not method.startswith(_OWN_STORES) for method in methods)

    @property
    def ends(self) -> list[Call]:
        """The rank's destroy_process_group calls, in order."""
        return [c for c in self.calls if c.op == DESTROY]

    def ended(self, group: str) -> bool:
        """The rank destroyed ``group``, or the default group, which ends every group."""
        return any(c.group in ("WORLD", group) for c in self.ends)

    @property
    def died_as_injected(self) -> bool:
        """An injected fault (kill, exit) ended the process: a death that alone fails nothing."""
        return self.ended_by is not None

    @property
    def ended_by(self) -> Injected | None:
        """The injected fault (kill, exit) that ended this rank's process, if one did."""
        return None if self.alive else next((f for f in self.injected if f.action in DEADLY), None)

    @property
    def finished(self) -> bool:
        """Out of the test for good: its test ended, or its process is gone."""
        return self.finished_at is not None or not self.alive

    @property
    def current_call(self) -> Call | None:
        """The call this rank is blocked in, if any: the asynchronous call whose work it waits
        for, else its last call if that is still running and blocks."""
        return self._call_inside() if self.alive else None

    @property
    def died_in(self) -> Call | None:
        """The call this rank's process died inside, if any (Gloo aborts a rank inside a
        collective whose sizes do not match its peer's)."""
        return None if self.alive else self._call_inside()

    def _call_inside(self) -> Call | None:
        if self.waiting_on is not None and self.calls[self.waiting_on].state == "running":
            return self.calls[self.waiting_on]
        if self.calls and self.calls[-1].state == "running" and self.calls[-1].blocks:
            return self.calls[-1]
        return None

    @property
    def last_raised(self) -> Call | None:
        if self.calls and self.calls[-1].state == "raised":
            return self.calls[-1]
        return None

    @property
    def blocked_call(self) -> Call | None:
        """The call this rank is blocked in; none once it is out of the test, whatever its log says."""
        return None if self.finished else self.current_call

    def new_groups(self) -> list[Call]:
        """Its new_group calls that made a group (one that raised on its arguments made none, and
        torch counted none), in order: the watchdog reads them each time it looks, so only the
        calls made since are scanned, not a long test's whole history."""
        for call in self.calls[self._looked_at:]:
            if call.op == NEW_GROUP:
                self._new_groups.append(call)
        self._looked_at = len(self.calls)
        return [call for call in self._new_groups if call.state != "raised"]

    def latest_init(self) -> Call | None:
        return next((c for c in reversed(self.calls) if c.op == INIT), None)

    def group_timeout(self, group: str) -> float | None:
        """The seconds the test gave the group a call is on to wait (``timeout=`` of its
        ``init_process_group``, or of its k-th ``new_group``: the recorder numbers a test's groups
        from 1, as torch counts them); None where it gave none, or a group made with
        ``use_local_synchronization`` (named otherwise) leaves the count uncertain."""
        if group == "WORLD":
            made = self.latest_init()
        else:
            groups = self.new_groups()
            counted = group.isdigit() and 0 < int(group) <= len(groups)
            if not counted or any(c.extra.get("local") for c in groups):
                return None
            made = groups[int(group) - 1]
        seconds = None if made is None else made.extra.get("timeout")
        return float(seconds) if isinstance(seconds, (int, float)) else None

    def apply(self, ev: Event) -> None:
        """Fold one event of the current test in; :class:`ProtocolError` for one out of place."""
        match ev:
            case CallEvent():
                self.calls.append(Call.from_event(ev))
                self.waiting_on = None  # a wait before it has returned
            case RetEvent():
                if ev.index < len(self.calls):
                    call = self.calls[ev.index]
                    call.exit = ev.time
                    if not ev.ok:
                        call.error = ev.error or "error"
                        call.before_backend = ev.before_backend
                    call.got_source, call.got_tag = ev.source, ev.tag
            case PhaseStart():
                self.phase = ev.when
            case Report():
                self.reports[ev.when] = to_wire(ev)
                if ev.outcome == "failed" and self.failed_at is None:
                    self.failed_at = ev.time
            case Done():
                self.phase = "finished"
                self.finished_at = ev.time
                self.peak_rss = ev.peak_rss
                self.peak_cuda = ev.peak_cuda
                self.group_intact = ev.group_intact
                self.group_alive = ev.group_alive
                self.in_flight = ev.in_flight
                self.threads_left = ev.threads_left
                self.interrupted = ev.interrupted
            case WarningRecorded():
                self.warnings.append(ev)
            case ThreadRaised():
                self.thread_raised.append(ev)
            case Injected():
                self.injected.append(ev)
            case Setting():
                self.settings.append(ev)
            case WaitEvent():
                if ev.index < len(self.calls):
                    self.waiting_on = ev.index
            case TestStart():
                pass  # the controller knows which test it handed over
            case Fatal():  # the rank exits next (its stderr says why), or a line of its log was lost
                if self.failed_at is None:
                    self.failed_at = ev.time
                self.fatal = self.fatal or ev.error
            case _:
                raise ProtocolError(f"{type(ev).__name__} event during a test")

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
    store: str | None = None  # ``host:port`` of the rank group's store, which env:// rendezvous dial

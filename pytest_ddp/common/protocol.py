"""What controller and ranks say to each other: typed commands and events, and their wire format.

The wire format is newline-delimited JSON: one object per line, its kind (the class's ``KIND``)
under ``"cmd"`` (commands, controller -> rank) or ``"e"`` (events, rank -> controller), over the
command pipe, a rank's event log file or a socket.  Every event has ``"t"``, the rank's
``time.time()`` when it wrote it.

``call``, ``ret`` and ``wait`` are written as hand-built JSON strings on the recorder's hot path
(:mod:`pytest_ddp.record.numbering`): their keys (``WIRE_NAMES``) are defined here and must not
change without it.

A rank's start travels once, before any command, as one JSON object (:class:`RankStart`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pickle
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

# The torch modules the forkserver imports for the session's collection (pytest_ddp.groups.preload):
# to the forkserver, the file that names them; then the names of those it imported, in the
# environment a rank is forked with until it takes its own, for its recorder (recorder.rebind).
PRELOAD_ENV = "PYTEST_DDP_PRELOAD"


class ProtocolError(ValueError):
    """A message that is not a known command or event, or not the one expected here."""


# -- commands (controller -> rank) ---------------------------------------------------


@dataclass(slots=True)
class RunItem:
    """Run the pytest item ``id``; ``next`` is the item this group runs after it (fixtures kept for it).
    ``store_port``: a fresh store for this test (see :mod:`pytest_ddp.rank.default_group`)."""

    KIND: ClassVar[Literal["run"]] = "run"
    id: str
    next: str | None = None
    store_port: int | None = None


@dataclass(slots=True)
class CallFunction:
    """Call ``module.qualname(rank, *args, **kwargs)``; ``args`` is base64 of pickled ``(args, kwargs)``,
    ``faults`` base64 of the pickled faults to inject (:mod:`pytest_ddp.faults`), if any."""

    KIND: ClassVar[Literal["call"]] = "call"
    id: str
    module: str
    qualname: str
    args: str
    faults: str | None = None


def encode_value(value: Any) -> str:
    """A Python value as it travels in a ``call`` command or a function's result: base64 of its pickle."""
    return base64.b64encode(pickle.dumps(value)).decode()


def decode_value(encoded: str) -> Any:
    """The value :func:`encode_value` encoded."""
    return pickle.loads(base64.b64decode(encoded))


@dataclass(slots=True)
class Stop:
    """End the rank's session (session fixtures are torn down) and exit."""

    KIND: ClassVar[Literal["stop"]] = "stop"


Command = RunItem | CallFunction | Stop


# -- events (rank -> controller) -----------------------------------------------------


@dataclass(slots=True)
class _Event:
    time: float = field(default_factory=time.time, kw_only=True)  # the rank's, when it wrote the event


@dataclass(slots=True)
class Ready(_Event):
    KIND: ClassVar[Literal["ready"]] = "ready"  # the rank is up
    items: list[str] = field(default_factory=list)  # node ids collected (pytest mode)
    errors: list[str] = field(default_factory=list)  # "nodeid: text" per collection error


@dataclass(slots=True)
class Fatal(_Event):
    KIND: ClassVar[Literal["fatal"]] = "fatal"  # the rank could not go on; it exits next
    error: str  # a traceback


@dataclass(slots=True)
class TestStart(_Event):
    __test__ = False  # not a pytest test class
    KIND: ClassVar[Literal["test"]] = "test"  # a test starts
    id: str


@dataclass(slots=True)
class PhaseStart(_Event):
    KIND: ClassVar[Literal["phase"]] = "phase"  # a test phase starts
    when: str  # setup, call, teardown


@dataclass(slots=True)
class Report(_Event):
    KIND: ClassVar[Literal["report"]] = "report"  # a phase ended
    when: str
    outcome: str  # passed, failed, skipped
    duration: float = 0.0
    # the serialized report, or run()'s result; None: a plain pass, sent without its report
    data: dict[str, Any] | None = None


@dataclass(slots=True)
class Done(_Event):
    KIND: ClassVar[Literal["done"]] = "done"  # the test is over on this rank
    # The default group outlived the test (init=False: the test left none of its own).
    group_intact: bool = True
    group_alive: bool = False  # a default process group is left
    # Asynchronous calls whose work had not completed: [{"i": call index, "err": why}].
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    # Threads the test started that still ran after it: [{"name": ..., "stack": ...}].
    threads_left: list[dict[str, str]] = field(default_factory=list)
    # pytest.exit() or KeyboardInterrupt in the test: {"kind", "reason", "returncode"}.
    interrupted: dict[str, Any] | None = None
    peak_rss: int | None = None  # bytes
    peak_cuda: int | None = None


@dataclass(slots=True)
class WarningRecorded(_Event):
    KIND: ClassVar[Literal["warning"]] = "warning"  # pytest recorded it during a test
    warning: dict[str, Any]  # message, category, filename, lineno, line
    id: str  # the node id pytest recorded it for

    @classmethod
    def of(cls, message: warnings.WarningMessage, nodeid: str) -> WarningRecorded:
        """The fields of a recorded warning that travel: text, category, where it was raised."""
        category = message.category
        fields = {
            "message": str(message.message),
            "category": f"{category.__module__}:{category.__qualname__}",
            "filename": message.filename,
            "lineno": message.lineno,
            "line": message.line,
        }
        return cls(fields, nodeid)


@dataclass(slots=True)
class ThreadRaised(_Event):
    """A thread raised out of its function during a test (``threading.excepthook``): a loader's
    worker whose batch the test then waits for forever."""

    KIND: ClassVar[Literal["thread_raised"]] = "thread_raised"
    thread: str  # its name: "Thread-3 (worker)"
    error: str  # "OSError: corrupt shard"
    site: str | None = None  # the user's innermost line in its traceback


@dataclass(slots=True)
class SessionEnd(_Event):
    # after "stop": the teardown of the fixtures the rank still held
    KIND: ClassVar[Literal["session_end"]] = "session_end"
    outcome: str  # passed, failed
    duration: float = 0.0
    data: dict[str, Any] | None = None  # the serialized teardown report; None for a pass


# MPI's peer for MPI.PROC_NULL: a send or receive that completes at once, with nobody.
NULL_PEER = -1


@dataclass(slots=True)
class CallEvent(_Event):
    """A torch.distributed or MPI call entered; the recorder writes it by hand, under the wire names."""

    KIND: ClassVar[Literal["call"]] = "call"
    WIRE_NAMES: ClassVar[dict[str, str]] = {"index": "i", "group_ranks": "ranks", "is_async": "async"}
    index: int  # per-rank call number in this test, from 0
    op: str
    group: str = "WORLD"  # group name, "WORLD" for the default group
    group_ranks: list[int] = field(default_factory=list)  # global ranks of the group
    seq: int = 0  # 1-based; per group for collectives, per (group, direction, peer) for p2p; 0: none
    site: str = "?"  # "file.py:12"
    # made inside a library: its frame that made the call ("accelerate/accelerator.py:2861")
    caller: str | None = None
    # the user's lines that led to ``site``, innermost first: where the user's functions were called
    outer: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    peer: int | None = None  # p2p: the other rank; None for a receive from any source; NULL_PEER
    root: int | None = None  # rooted collectives
    tag: int | None = None  # MPI p2p: the message's tag; None for a receive of any tag
    is_async: bool = False  # async_op=True
    obj_type: str | None = None  # *_object calls
    obj_size: int | None = None
    # init: rank, world_size, init_method; "via": "backend"; "op": a reducing collective's reduce
    # op (torch: "SUM", "MAX", ...; MPI: the MPI.Op's name); MPI: "bytes",
    # Sendrecv's receiving end ("recv_from", absent: any source; "recv_tag", absent: any tag)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RetEvent(_Event):
    KIND: ClassVar[Literal["ret"]] = "ret"  # call ``index`` returned or raised
    WIRE_NAMES: ClassVar[dict[str, str]] = {"index": "i", "error": "err", "source": "src"}
    index: int
    ok: bool = True
    error: str | None = None  # "TypeError: cannot pickle ..." when not ok
    before_backend: bool = False  # it raised before its group's backend was handed it
    source: int | None = None  # an MPI receive from any source: the rank whose message it got
    tag: int | None = None  # an MPI receive of any tag: the tag of the message it got


@dataclass(slots=True)
class WaitEvent(_Event):
    """The rank is blocked in call ``index`` (``work.wait()``, ``wait_tensor``) until its ``ret``."""

    KIND: ClassVar[Literal["wait"]] = "wait"
    WIRE_NAMES: ClassVar[dict[str, str]] = {"index": "i"}
    index: int


@dataclass(slots=True)
class Injected(_Event):
    """An injected fault fires on this rank (see :mod:`pytest_ddp.faults`), written before it acts."""

    KIND: ClassVar[Literal["fault"]] = "fault"
    text: str  # "SIGKILL on rank 1 at all_reduce call 3"
    action: str
    op: str
    call: int
    site: str = "?"  # where the test made that call


@dataclass(slots=True)
class Setting(_Event):
    """A value every rank must give alike, as a library took it here (:mod:`pytest_ddp.record.schedules`)."""

    KIND: ClassVar[Literal["setting"]] = "setting"
    name: str  # "their pipeline schedules' n_microbatches"
    value: int | str
    site: str = "?"  # where the test gave it
    group: str = "WORLD"  # the process group whose ranks must give it alike


Event = (
    Ready | Fatal | TestStart | PhaseStart | Report | Done | WarningRecorded | ThreadRaised | SessionEnd
    | CallEvent | RetEvent | WaitEvent | Injected | Setting
)
Record = Command | Event


# -- the codec -----------------------------------------------------------------------

COMMAND_TYPES = get_args(Command)
_COMMANDS: dict[str, type[Any]] = {cls.KIND: cls for cls in COMMAND_TYPES}
_EVENTS: dict[str, type[Any]] = {cls.KIND: cls for cls in get_args(Event)}


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@dataclass(frozen=True)
class _Codec:
    """How one record class travels: its fields as (name, wire key), the keys it needs."""

    fields: tuple[tuple[str, str], ...]
    required: frozenset[str]  # wire keys without a default (every event's "t" among them)
    omitted_when_none: frozenset[str]  # fields that default to None are left off the wire when None


def _codec(cls: type[Any]) -> _Codec:
    renames = {"time": "t", **getattr(cls, "WIRE_NAMES", {})}
    fields = dataclasses.fields(cls)
    return _Codec(
        fields=tuple((f.name, renames.get(f.name, f.name)) for f in fields),
        required=frozenset(renames.get(f.name, f.name) for f in fields if f.name == "time" or _required(f)),
        omitted_when_none=frozenset(f.name for f in fields if f.default is None),
    )


_CODECS = {cls: _codec(cls) for cls in (*_COMMANDS.values(), *_EVENTS.values())}
# Every key a call or ret event may carry: the recorder's hand-built lines must keep to them.
CALL_KEYS = frozenset({"e", *(key for _, key in _CODECS[CallEvent].fields)})
RET_KEYS = frozenset({"e", *(key for _, key in _CODECS[RetEvent].fields)})
_encoder = json.JSONEncoder(separators=(",", ":"), default=str)  # built once: dumps() builds one per call


def to_wire(record: Record) -> dict[str, Any]:
    cls = type(record)
    codec = _CODECS[cls]
    wire: dict[str, Any] = {"cmd" if cls in COMMAND_TYPES else "e": cls.KIND}
    for name, key in codec.fields:
        value = getattr(record, name)
        if value is not None or name not in codec.omitted_when_none:
            wire[key] = value
    return wire


def from_wire(wire: dict[str, Any]) -> Record:
    """The record for one decoded JSON object; :class:`ProtocolError` for an unknown kind or a
    missing key.  Keys a record does not know are ignored."""
    if "e" in wire:
        cls = _EVENTS.get(wire["e"])
    elif "cmd" in wire:
        cls = _COMMANDS.get(wire["cmd"])
    else:
        raise ProtocolError(f"neither a command nor an event: {wire!r:.200}")
    if cls is None:
        raise ProtocolError(f"unknown kind: {wire!r:.200}")
    codec = _CODECS[cls]
    if not codec.required <= wire.keys():
        raise ProtocolError(f"{cls.KIND} without {sorted(codec.required - wire.keys())}: {wire!r:.200}")
    return cls(**{name: wire[key] for name, key in codec.fields if key in wire})


def encode(record: Record) -> bytes:
    """One line of the wire format, newline included."""
    return (_encoder.encode(to_wire(record)) + "\n").encode()


def decode(line: bytes | str) -> Record:
    """The record on one line (or one message of a framed channel such as a pipe)."""
    try:
        wire = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {line!r:.200}") from exc
    if not isinstance(wire, dict):
        raise ProtocolError(f"not a JSON object: {line!r:.200}")
    return from_wire(wire)


def decode_command(line: bytes | str) -> Command:
    record = decode(line)
    if not isinstance(record, Command):
        raise ProtocolError(f"not a command: {record.KIND}")
    return record


# -- a rank's start (controller -> rank, once, in its spec file) ---------------------


# Whether a decoded JSON value is one of a field's type, by the field's annotation (a string here).
_JSON_IS: dict[str, Callable[[Any], bool]] = {
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "int | None": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, bytes),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "dict[str, str]": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
}


def fields_from_json(cls: type[Any], data: Any, what: str) -> dict[str, Any]:
    """``data``, a decoded JSON object, as dataclass ``cls``'s keyword arguments, checked field for
    field; a ProtocolError names ``what`` and the key missing, unknown or of another type."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: not a JSON object: {data!r:.80}")
    declared = {f.name: f for f in dataclasses.fields(cls)}
    required = {name for name, f in declared.items() if _required(f)}
    if missing := sorted(required - data.keys()):
        raise ProtocolError(f"{what} without {missing}")
    if unknown := sorted(data.keys() - declared.keys()):
        raise ProtocolError(f"{what} with unknown keys {unknown}")
    kwargs = {}
    for name, value in data.items():
        annotation = str(declared[name].type)
        if annotation == "RankRole":  # a dataclass's dict
            kwargs[name] = RankRole(**fields_from_json(RankRole, value, "a rank's role"))
        elif annotation in _JSON_IS and _JSON_IS[annotation](value):
            kwargs[name] = value
        else:
            raise ProtocolError(f"{what} whose {name!r} is not {annotation}: {value!r:.80}")
    return kwargs


@dataclass(frozen=True)
class RankRole:
    """A rank's place in its group, which holds on any machine (a launched host forks the rank)."""

    rank: int  # its rank in the group's world
    world_size: int  # the group's
    backend: str  # gloo, nccl or mpi
    init: bool  # it joins the default process group before any test (init=True)
    mode: str  # "pytest": it runs test items; "function": run()'s functions
    pg_timeout: float  # seconds: the default process group's own timeout
    store_host: str  # where the group's TCPStore listens
    store_port: int | None  # the store's port; None: no store (an MPI world)
    local_rank: int  # its rank on its node (LOCAL_RANK, an NCCL rank's GPU)


@dataclass(frozen=True)
class RankStart:
    """What a rank process is started with: its role, and where it lives on its machine.  Written to
    a file only its user can read (:func:`pytest_ddp.groups.spawn.write_start_file`)."""

    role: RankRole
    events: str  # path of its event log
    stdout: str  # path of the file its fd 1 writes to
    stderr: str  # path of the file its fd 2 writes to
    dump: str  # path of the file its stacks are dumped to (SIGUSR1)
    env: dict[str, str]  # its whole environment
    cwd: str  # its working directory
    pytest_args: list[str]  # its pytest session's command line (pytest mode)
    sys_path: list[str]  # its import path; empty: the forkserver's
    basetemp: str  # its pytest session's --basetemp

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankStart:
        """The start :meth:`to_json` wrote; ProtocolError for a key missing, unknown or of another type."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ProtocolError(f"a rank's start: not JSON: {text!r:.80}") from exc
        return cls(**fields_from_json(cls, data, "a rank's start"))

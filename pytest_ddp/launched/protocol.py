"""What global rank 0's pytest (the controller) and the other launched pytest processes (hosts) say.

Every launched pytest is a *host* of rank processes, one per group (a *slot*).  A message is a
frame on the link (:mod:`pytest_ddp.launched.link`): a JSON header, and for :class:`Data` and
:class:`Command` a newline and raw bytes; anything else, field for field, is a ProtocolError.

Host -> controller: ``hello``, ``data`` (what a rank appended to one of its files: hosts share
no file system with the controller; it wakes the controller as a notify byte would), ``dumped``,
``exited``.  Controller -> host: ``start``, ``command``, ``dump``, ``kill``, ``end`` (the exit
status every host exits with, and why the session ended early, if it did).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_args

from pytest_ddp.common.protocol import ProtocolError, RankRole, fields_from_json


@dataclass
class Hello:
    KIND: ClassVar[str] = "hello"
    rank: int
    local_rank: int
    node_rank: int
    node: str  # the host's name (its node, in reports)
    items: list[str]  # node ids collected, in order
    errors: list[str]  # collection errors
    log: str  # where its own pytest output goes


@dataclass
class Data:
    KIND: ClassVar[str] = "data"
    slot: int
    file: str  # which of the rank's files (group.rank_files names them)
    payload: bytes = b""


@dataclass
class Dumped:
    KIND: ClassVar[str] = "dumped"
    slot: int


@dataclass
class Exited:
    KIND: ClassVar[str] = "exited"
    slot: int
    code: int  # negative: the signal
    time: float  # when it ended, the host's time.time()


@dataclass
class Start:
    KIND: ClassVar[str] = "start"
    slot: int
    role: RankRole  # the rank's start less what only the host knows (its files, cwd, environment, sys.path)
    env: dict[str, str] = field(default_factory=dict)  # on top of the host's environment
    items: list[str] = field(default_factory=list)  # the group's node ids


@dataclass
class Command:
    KIND: ClassVar[str] = "command"
    slot: int
    payload: bytes = b""  # pytest_ddp.common.protocol.encode(command)


@dataclass
class Dump:
    KIND: ClassVar[str] = "dump"
    slot: int


@dataclass
class Kill:
    KIND: ClassVar[str] = "kill"
    slot: int


@dataclass
class End:
    KIND: ClassVar[str] = "end"
    status: int
    reason: str = ""  # for the host's log: why the session ended early


Message = Hello | Data | Dumped | Exited | Start | Command | Dump | Kill | End
_TYPES: dict[str, type[Any]] = {t.KIND: t for t in get_args(Message)}
_RAW = (Data, Command)  # their payload travels raw after the header


def encode(message: Message) -> bytes:
    fields = dataclasses.asdict(message)
    payload = fields.pop("payload", b"") if isinstance(message, _RAW) else b""
    return json.dumps({"k": message.KIND, **fields}).encode() + b"\n" + payload


def decode(frame: bytes) -> Message:
    header, _, payload = frame.partition(b"\n")
    try:
        fields = json.loads(header)
        kind = _TYPES[fields.pop("k")]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ProtocolError(f"not a host message: {frame[:80]!r}") from exc
    if kind in _RAW:
        fields["payload"] = payload
    try:
        return kind(**fields_from_json(kind, fields, f"a {kind.KIND} message"))
    except ProtocolError as exc:
        raise ProtocolError(f"a malformed {kind.KIND} message: {frame[:80]!r} ({exc})") from None

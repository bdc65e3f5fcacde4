"""A rank's event log: its events in an append-only file, and the controller's reading of it.

One ``os.write`` per line: a line is whole even if the rank dies right after it, and the
controller reads the file while the rank is blocked in C++ or dead.
"""

from __future__ import annotations

import io
import json
import os

from pytest_ddp.common.protocol import (
    COMMAND_TYPES,
    Event,
    Fatal,
    ProtocolError,
    Record,
    decode,
    encode,
    from_wire,
)


class LineDecoder:
    """Records out of a byte stream read piece by piece (a growing file, a socket); a line cut
    short waits for the rest.  A chunk's lines are parsed in one ``json.loads`` (cheaper)."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> list[Record]:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended with a newline
        lines = [line for line in lines if line.strip()]
        if not lines:
            return []
        try:
            return [from_wire(wire) for wire in json.loads(b"[" + b",".join(lines) + b"]")]
        except ValueError:  # ProtocolError included: one line at a time, to find the bad one
            return [_record_or_fatal(line) for line in lines]


def _record_or_fatal(line: bytes) -> Record:
    """The record on ``line``, or, for a line that holds none, a :class:`Fatal` of its rank: a
    write cut short (a full disk) has lost what the rank said, so its test cannot pass."""
    try:
        return decode(line)
    except ProtocolError as exc:
        why = "a line that is not an event (a write cut short by a full disk?)"
        return Fatal(f"its event log holds {why}: {exc}")


class EventLog:
    """The rank side: appends one line per event, with one unbuffered ``os.write``."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, event: Event) -> None:
        os.write(self._fd, encode(event))

    def write_line(self, line: str) -> None:
        """A line already in the wire format, without its newline (the recorder's hot path)."""
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class EventReader:
    """The controller side: the events appended since the last read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: io.FileIO | None = None  # opened once the rank has created it
        self._decoder = LineDecoder()

    def read_new(self) -> list[Event]:
        if self._file is None:
            try:
                self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 - read for the group's life
            except FileNotFoundError:
                return []
        records = self._decoder.feed(self._file.readall())  # all that was written since the last read
        for record in records:
            if isinstance(record, COMMAND_TYPES):
                raise ProtocolError(f"a command in an event log: {record.KIND}")
        return records  # type: ignore[return-value]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

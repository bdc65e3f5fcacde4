"""What the kernel says of a process: its /proc files, parsed in one place, and which process is at
the other end of a Unix socket (``SO_PEERCRED``).  Standard library only: the MPI stand-in uses it too.
A process can end at any moment: a reader says so (None, or OSError where its docstring says).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED's struct ucred: pid, uid, gid
MAX_ANCESTORS = 64  # how far up descends_from looks: deeper, a process is nobody's that we know


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat that the plugin reads."""

    name: str  # comm: the executable's name, or what prctl set (15 bytes; any character but NUL)
    state: str  # R, S, D, Z, T, ...
    parent: int
    group: int  # the process group
    session: int
    started: int  # clock ticks after boot: with the pid, names one process for the machine's uptime


def parse_stat(text: str) -> Stat:
    """/proc/PID/stat's text (ValueError if it is not).  The name is between the first ``(`` and the
    *last* ``)``: it may hold spaces and parentheses itself."""
    head, close, tail = text.rpartition(")")
    _, open_, name = head.partition("(")
    fields = tail.split()
    if not close or not open_ or len(fields) < 20:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    return Stat(name, fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def stat(pid: int | str) -> Stat | None:
    """``pid``'s stat; None once it is gone (or its file is not one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_stat(f.read())
    except (OSError, ValueError):
        return None


def parent_of(pid: int) -> int | None:
    """``pid``'s parent; None once it is gone."""
    found = stat(pid)
    return None if found is None else found.parent


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is ``pid``'s parent, or its parent's, and so on (init excluded)."""
    for _ in range(MAX_ANCESTORS):
        parent = parent_of(pid)
        if parent is None or parent <= 1:
            return False
        if parent == ancestor:
            return True
        pid = parent
    return False


def pids() -> Iterator[int]:
    """The processes /proc lists now."""
    return (int(entry) for entry in os.listdir("/proc") if entry.isdigit())


def parse_fields(text: str) -> dict[str, str]:
    """``Name:\\tvalue`` lines (/proc/PID/status, /proc/meminfo): {name: value, stripped}."""
    pairs = (line.partition(":") for line in text.splitlines())
    return {name: value.strip() for name, colon, value in pairs if colon}


def status(pid: int | str = "self") -> dict[str, str]:
    """/proc/PID/status's fields (``Uid``, ``Threads``, ``VmSize``, ...); OSError once it is gone."""
    with open(f"/proc/{pid}/status") as f:
        return parse_fields(f.read())


def meminfo() -> dict[str, str]:
    """/proc/meminfo's fields (``MemAvailable``, ...)."""
    with open("/proc/meminfo") as f:
        return parse_fields(f.read())


def size(value: str) -> int:
    """Bytes of a size as status and meminfo write it (``1024 kB``); ValueError if it is not one."""
    number, _, unit = value.partition(" ")
    if unit.strip() not in ("kB", ""):
        raise ValueError(f"not a size in kB: {value!r}")
    return int(number) * (1024 if unit.strip() else 1)


def parse_environ(data: bytes) -> dict[str, str]:
    """/proc/PID/environ's bytes as {name: value}, non-UTF-8 bytes as surrogates (as ``os.environ``)."""
    entries = (entry.decode(errors="surrogateescape") for entry in data.split(b"\0") if b"=" in entry)
    return {name: value for name, _, value in (entry.partition("=") for entry in entries)}


def environment_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with; OSError once it is gone (or is another user's)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        return parse_environ(f.read())


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket, as the kernel saw it at connect
    (for the connecting end: the process that listened; for a socketpair: the one that made it)."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    pid, uid, _ = _CREDENTIALS.unpack(data)
    return pid, uid

"""How much of one text of a rank's reaches the session: a message, a traceback's lines, a warning,
what the rank wrote to its stdout or stderr during a test.

A test's 200 MB message reached the terminal and each report file several times over (1.6 GB);
a browser and a CI log hold :data:`TEXT_LIMIT`. Its first and last half are kept, around a note of
how much was cut: the cause is often at the end of a traceback, or of a log.
"""

from __future__ import annotations

import os
from pathlib import Path

TEXT_LIMIT = 128 * 1024  # characters (bytes, of a file) of one text, at most
NOTE_ROOM = 64  # characters of the note that says how much was cut, at most


def cut(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text``, or its first and last characters around a note of how much was cut: ``limit`` in
    all, so that a text cut once is not cut again."""
    if len(text) <= limit:
        return text
    half = (limit - NOTE_ROOM) // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half:,} characters cut by pytest-ddp ...]\n{text[-half:]}"


def read_bounded(path: Path, offset: int, limit: int = TEXT_LIMIT) -> str:
    """What a rank's file holds past ``offset``, its first and last bytes only where it holds more
    than ``limit`` (cut as :func:`cut` cuts), without reading the rest; nothing if it is not there."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size - offset <= limit:
                f.seek(offset)
                return f.read().decode(errors="replace")
            half = (limit - NOTE_ROOM) // 2
            f.seek(offset)
            head = f.read(half)
            f.seek(size - half)
            tail = f.read(half)
    except FileNotFoundError:
        return ""
    cut_bytes = size - offset - 2 * half
    note = f"\n[... {cut_bytes:,} bytes cut by pytest-ddp ...]\n"
    return head.decode(errors="replace") + note + tail.decode(errors="replace")

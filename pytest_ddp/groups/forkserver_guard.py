"""The forkserver forks for its session alone.

multiprocessing's forkserver takes any connection to its socket as a fork request, and ends on one
it cannot parse (its loop lets only ``ECONNABORTED`` pass), killing every rank it forked: a few bytes
another process of the user wrote there failed the running test as ``ranks 0, 1 died``.  The
session's one client is the process that started the forkserver, its parent: any other peer (as the
kernel names it) is refused before a byte is read, written down in the forkserver's folder, and the
session warns of it (:class:`pytest_ddp.groups.spawn.Refusals`); but a process forked from here (a
rank, or what its test started: ranks are subreapers, so orphans stay in the tree) is the session's
too, and is served.
"""

from __future__ import annotations

import errno
import os
from multiprocessing import reduction
from pathlib import Path
from typing import Any

from pytest_ddp.common import procfs

REFUSED = "refused"  # in the forkserver's folder: a line per connection it refused, naming its peer


def guard() -> None:
    """In the forkserver, after its imports: refuse a connection that is not its parent's."""
    server = os.getpid()
    receive = reduction.recvfds

    def recvfds(sock: Any, size: int) -> list[int]:
        if os.getpid() == server:  # not in a rank forked from here, which may pass descriptors itself
            _refuse_strangers(sock)
        return list(receive(sock, size))

    reduction.recvfds = recvfds


def _refuse_strangers(sock: Any) -> None:
    pid, uid = procfs.peer_credentials(sock)
    if pid == os.getppid() or procfs.descends_from(pid, os.getpid()):
        return
    found = procfs.stat(pid)
    name = "gone" if found is None else " ".join(found.name.split())  # a comm may hold a newline
    line = f"pid {pid} ({name}, uid {uid})\n"
    try:
        path = Path(sock.getsockname()).parent / REFUSED
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # unsaid, but refused all the same: any other error would end the forkserver
    # The forkserver's loop closes the connection and serves the next one.
    raise ConnectionAbortedError(errno.ECONNABORTED, f"refused {line.strip()}: not this forkserver's parent")

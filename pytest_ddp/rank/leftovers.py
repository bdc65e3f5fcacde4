"""What a test leaves behind in its rank process: threads still running, processes still alive.

Runs in the rank; a test's threads and processes are those not there when it began.  The rank is
its descendants' subreaper (``PR_SET_CHILD_SUBREAPER``), so orphans stay in its tree; a rank killed
with SIGKILL has a keeper, told by the kernel (``PR_SET_PDEATHSIG``), that kills the rank's
session.  Neither catches a process that left the session (``setsid``) of a killed rank.
"""

from __future__ import annotations

import concurrent.futures.thread
import os
import signal
import sys
import threading
import time
import traceback
from types import FrameType

import pytest

from pytest_ddp.common import prctl, procfs

KEEPER_SIGNAL = signal.SIGUSR2  # the keeper's "your rank is gone"
THREAD_JOIN_WAIT = 1.0  # seconds in all that threads a test started get to end once the test is over


class LeftoverProcessWarning(pytest.PytestWarning):
    """A test left processes running in its rank; the rank ended them."""


# -- threads --------------------------------------------------------------------------


def threads_started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    """The Python threads alive now that were not at ``before``, but those started in C (Gloo's)."""
    current = threading.current_thread()
    return [
        t
        for t in threading.enumerate()
        if t not in before and t is not current and not isinstance(t, threading._DummyThread)
    ]


def _idle_library_thread(thread: threading.Thread, frame: FrameType | None) -> bool:
    """Whether ``thread`` runs nothing of its own accord, so cannot take part in a later test's
    collectives: an idle ThreadPoolExecutor worker (inductor's pool), tqdm's monitor (which
    torch.compile starts).  Left running, they are not the test's fault."""
    if type(thread).__name__ == "TMonitor" and type(thread).__module__ == "tqdm._monitor":
        return True
    # An idle worker blocks in its queue's get, in C: its innermost Python frame is _worker.
    if frame is None or frame.f_code is not _POOL_WORKER:
        return False
    queue = frame.f_locals.get("work_queue")
    return queue is not None and queue.empty()


_POOL_WORKER = concurrent.futures.thread._worker.__code__


def threads_left(before: set[threading.Thread], wait: float = THREAD_JOIN_WAIT) -> list[dict[str, str]]:
    """The test's threads, but idle library ones, still running after ``wait`` s, with their stacks."""
    deadline = time.monotonic() + wait
    frames = sys._current_frames()
    for thread in threads_started_since(before):
        if not _idle_library_thread(thread, frames.get(thread.ident or -1)):
            thread.join(max(0.0, deadline - time.monotonic()))
    frames = sys._current_frames()
    left = []
    for thread in threads_started_since(before):
        frame = frames.get(thread.ident or -1)
        if thread.is_alive() and not _idle_library_thread(thread, frame):
            stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
            left.append({"name": thread.name, "stack": stack})
    return left


def threads_left_text(threads: list[dict[str, str]], wait: float = THREAD_JOIN_WAIT) -> str:
    """The failure of a test that left threads running ``wait`` s after it: what to fix first, then
    each stack."""
    names = ", ".join(repr(t["name"]) for t in threads)
    noun = "thread" if len(threads) == 1 else "threads"
    lines = [
        f"{noun} {names} started by the test still running {wait:g} s after it ended "
        f"(it could take part in a later test's collectives; join it before the test returns)"
    ]
    for thread in threads:
        lines += ["", f"thread {thread['name']!r}:", thread["stack"].rstrip()]
    return "\n".join(lines)


# -- processes ------------------------------------------------------------------------


def descendants() -> list[int]:
    """This process's descendants, parents before their children."""
    found: list[int] = []
    parents = [os.getpid()]
    while parents:
        parent = parents.pop(0)
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # it exited meanwhile
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", "rb") as f:
                    children = [int(pid) for pid in f.read().split()]
            except OSError:
                continue
            found += children
            parents += children
    return found


def describe(pid: int) -> str:
    """``pid 812 (sleep 300)``: the process's command line, else its name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
        with open("/proc/self/cmdline", "rb") as f:
            if command == f.read():
                return f"pid {pid} (a fork of the rank)"
        if not command:
            with open(f"/proc/{pid}/comm", "rb") as f:
                command = f.read()
    except OSError:
        return f"pid {pid}"
    text = command.replace(b"\0", b" ").decode(errors="replace").strip()
    return f"pid {pid} ({text[:80]})"


def end_processes(pids: list[int]) -> None:
    """SIGKILL these descendants and reap them, parents first (their children then become ours)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped by its own parent, or not ours


class ProcessLedger:
    """The rank's processes, made at its first test: those alive then are not a test's."""

    def __init__(self) -> None:
        self._counting = _forks_are_counted()
        # The last scan, and forks_made() just before it (None: every look scans).
        self._scanned: list[int] = []
        self._scanned_at: int | None = None
        self.kept = set(self.alive())

    def alive(self) -> list[int]:
        """:func:`descendants`, or the last scan while the kernel has made no task since (it misses
        none, but may hold one that ended): a scan reads a file per thread, the count one file."""
        made = forks_made() if self._counting else None
        if made is None or made != self._scanned_at:
            self._scanned, self._scanned_at = descendants(), made
        return self._scanned

    def to_end(self, owned: set[int]) -> list[int]:
        """The processes to end now that a test is over: not kept, nor ``owned`` by a wider fixture."""
        known = self.kept | owned
        ending = [pid for pid in self.alive() if pid not in known]
        if ending and self._scanned_at is not None:  # the last scan may list one that ended since
            self._scanned_at = None
            ending = [pid for pid in self.alive() if pid not in known]
        return ending


def forks_made() -> int | None:
    """How many tasks the kernel has made since boot (/proc/stat's ``processes``); None if unread."""
    try:
        with open("/proc/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    start = data.find(b"\nprocesses ")
    if start < 0:
        return None
    line = data[start + 1 : data.find(b"\n", start + 1)].split()
    return int(line[1]) if len(line) == 2 and line[1].isdigit() else None


def _forks_are_counted() -> bool:
    """Whether :func:`forks_made` grows when a thread is made (a kernel that fakes /proc may not)."""
    before = forks_made()
    thread = threading.Thread(target=lambda: None, name="ddp-count-check")
    thread.start()
    thread.join()
    after = forks_made()
    return before is not None and after is not None and after > before


# -- the keeper -----------------------------------------------------------------------


def start_keeper(rank: int) -> int:
    """Fork the process that kills this rank's session once the rank is gone; its pid.  From the
    main thread: the kernel signals the keeper when the thread that forked it exits."""
    session = os.getsid(0)
    parent = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {KEEPER_SIGNAL})
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {KEEPER_SIGNAL})
        return pid
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the rank's pipes must close when it ends
        prctl.name(f"ddp-keeper{rank}")
        if prctl.die_with_parent(parent, KEEPER_SIGNAL):  # else the rank died before we asked
            signal.sigwait({KEEPER_SIGNAL})
        _kill_session(session)
    finally:
        os._exit(0)


def _kill_session(session: int) -> None:
    me = os.getpid()
    for pid in procfs.pids():
        found = procfs.stat(pid) if pid != me else None
        if found is not None and found.session == session:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

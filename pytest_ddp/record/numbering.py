"""A rank's one sequence of call numbers, the one writer of each event line of a call (``call``,
``wait``, ``ret``: :class:`pytest_ddp.common.protocol.CallEvent`), and its asynchronous calls' rets;
where torch.distributed's calls are recorded, shared by :mod:`pytest_ddp.record.recorder` and
:mod:`pytest_ddp.record.backend_recorder` (the MPI recorder keeps its own log).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.protocol import RetEvent


class Numbers:
    """Call index and sequence numbers of the current test.  The call event is written under the
    lock that numbers it, so indices reach the log in order (``ret`` events find their call by index)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index = 0
        self.seq: dict[tuple[Any, ...], int] = {}

    def reset(self) -> None:
        with self.lock:
            self.index = 0
            self.seq = {}

    def write_call(self, log: EventLog, body: str, key: tuple[Any, ...] | None) -> int:
        """Number the call (seq 0 without a key), write it; returns its index."""
        with self.lock:
            index = self.index
            self.index += 1
            seq = 0
            if key is not None:
                seq = self.seq[key] = self.seq.get(key, 0) + 1
            log.write_line(f'{{"e":"call","i":{index},"seq":{seq},{body}}}')
            return index


numbers = Numbers()  # this rank's: one sequence of call indexes for torch's and MPI's calls


class _Depth(threading.local):
    depth = 0  # > 0 while this thread is inside a recorded call


# Where torch.distributed's calls are recorded (set by recorder.install); None: they are not.
log: EventLog | None = None
local = _Depth()


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or ["?"])[0][:200]


def write_ret(
    log: EventLog,
    index: int,
    error: BaseException | None = None,
    before_backend: bool = False,
    source: int | None = None,
    tag: int | None = None,
) -> None:
    """Call ``index`` returned, or raised ``error``; ``source`` and ``tag``: an MPI receive's message."""
    if error is not None:
        err = f"{type(error).__name__}: {error}"
        log.write(RetEvent(index, ok=False, error=err, before_backend=before_backend))
        return
    got = ""
    if source is not None:
        got += f',"src":{source}'
    if tag is not None:
        got += f',"tag":{tag}'
    log.write_line(f'{{"e":"ret","i":{index},"t":{time.time()!r},"ok":true{got}}}')


def write_wait(log: EventLog, index: int) -> None:
    """The caller is now blocked in asynchronous call ``index`` until its ret."""
    log.write_line(f'{{"e":"wait","i":{index},"t":{time.time()!r}}}')


SWEEP_INTERVAL = 0.005  # seconds between looks at pending work that nobody waits for


class Pending:
    """The current test's asynchronous calls whose ret is not written yet: written when the
    caller's wait returns, or when the rank sees the work complete (at its next recorded call, or
    from a thread that looks while any is pending: DDP waits in C++).  Not from a done callback: it
    runs in the backend's thread and takes the GIL from the caller once per collective."""

    def __init__(self) -> None:
        self.works: dict[int, tuple[Any, Any]] = {}  # call index -> (work, its future)
        # isend and irecv calls whose ret waits for their wait() (or the test's end): Gloo's send and
        # receive work has no future and completes only inside wait(), a send's once its peer receives.
        self.owed: set[int] = set()
        self._wake = threading.Event()  # set while works are pending
        self._looker_pid: int | None = None  # the process whose thread looks (threads do not survive fork)

    def add(self, index: int, work: Any) -> bool:
        """Leave the call's ret to its wait or its work's completion; False where it has no future."""
        try:
            future = work.get_future()
        except Exception:
            return False
        with numbers.lock:
            self.works[index] = (work, future)
        if not self._wake.is_set():  # setting it takes a lock and wakes the thread
            self._wake.set()
        return True

    def owe(self, index: int) -> bool:
        """Leave the ret of point-to-point call ``index`` to its wait, or the test's end (:meth:`settle`)."""
        with numbers.lock:
            self.owed.add(index)
        return True

    def settle(self, index: int, error: BaseException | None = None) -> None:
        """The wait for call ``index`` returned (with ``error`` if it raised): its ret, if owed."""
        with numbers.lock:
            if index in self.owed:
                self.owed.discard(index)
                if log is not None:
                    write_ret(log, index, error)

    def sweep(self, waited: int | None = None, error: BaseException | None = None) -> bool:
        """Write the rets of completed work and of ``waited``; whether any call is still pending."""
        if waited is not None:
            self.settle(waited, error)
        with numbers.lock:
            for index, (work, future) in list(self.works.items()):
                if index == waited:
                    failure = error
                elif work.is_completed():
                    failure = _failure(future)
                else:
                    continue
                del self.works[index]
                if log is not None:
                    write_ret(log, index, failure)
            return bool(self.works)

    def start_looking(self) -> None:
        """Start this process's looking thread (before a test: not one of the test's leftovers)."""
        if self._looker_pid != os.getpid():
            self._looker_pid = os.getpid()
            threading.Thread(target=self._look, name="pytest-ddp-pending-work", daemon=True).start()

    def clear(self) -> None:
        """Forget the pending calls (their test is over)."""
        with numbers.lock:
            self.works.clear()
            self.owed.clear()

    def _look(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(SWEEP_INTERVAL)
            if not self.sweep():
                self._wake.clear()
                if self.works:  # added between the sweep and the clear
                    self._wake.set()


pending = Pending()  # the recorder's


def _failure(future: Any) -> BaseException | None:
    """What a completed work's future failed with, if anything."""
    try:
        future.value()
    except Exception as exc:
        return exc
    return None


def run_call(log: EventLog, index: int, run: Callable[[], Any]) -> Any:
    """``run()``, what call ``index`` does: if it raises, the call's ret says so."""
    try:
        return run()
    except BaseException as exc:
        write_ret(log, index, exc)
        raise

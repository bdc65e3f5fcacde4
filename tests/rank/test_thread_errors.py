"""A thread that raises out of its function during a test is told as it happens, with the user's
line it raised at (rank/thread_errors.py); the hook it wraps still runs, and is put back after.
Real threads, in this process; then on real ranks, in the report."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest_ddp
from pytest_ddp.common.protocol import ThreadRaised
from pytest_ddp.rank import thread_errors

HERE = os.path.relpath(__file__)


def _run(target: Any) -> None:
    worker = threading.Thread(target=target, name="worker")
    worker.start()
    worker.join()


def _worker() -> None:
    raise OSError("corrupt shard")  # the worker's raise


def test_a_thread_that_raises_is_told_with_its_line_and_the_wrapped_hook_still_runs() -> None:
    told: list[ThreadRaised] = []
    wrapped: list[str] = []
    before = threading.excepthook
    threading.excepthook = pytests = lambda args: wrapped.append(args.thread.name if args.thread else "?")
    try:
        with thread_errors.told(told.append):
            _run(_worker)
            _run(lambda: exec("raise SystemExit(3)"))  # threading ignores SystemExit: so is it here
        assert threading.excepthook is pytests  # the one wrapped is back
        _run(_worker)  # after the test: not told
    finally:
        threading.excepthook = before
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.endswith("# the worker's raise"))
    assert [(t.thread, t.error, t.site) for t in told] == [("worker", "OSError: corrupt shard", f"{HERE}:{line}")]
    assert wrapped == ["worker", "worker", "worker"]


def test_a_hook_the_test_set_itself_is_left_in_place() -> None:
    before = threading.excepthook
    try:
        with thread_errors.told(lambda event: None):
            threading.excepthook = own = lambda args: None
        assert threading.excepthook is own
    finally:
        threading.excepthook = before


def loader_dies_then_rank_0_fails(rank: int) -> None:
    _run(_worker)  # the loader's worker dies
    if rank == 0:
        raise ValueError("no batch")


def test_on_a_rank_the_thread_that_raised_is_in_the_report() -> None:
    result = pytest_ddp.run(loader_dies_then_rank_0_fails, world_size=2, timeout=30)
    assert result.outcome == "failed"
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.endswith("# the worker's raise"))
    assert f"its thread worker raised OSError: corrupt shard at {HERE}:{line}" in result.diagnosis.text

"""Function mode: a rank of :func:`pytest_ddp.run` calls module-level functions, one per command."""

from __future__ import annotations

import importlib
import threading
import traceback
from typing import Any

from pytest_ddp.common.protocol import (
    CallFunction,
    PhaseStart,
    RankStart,
    Ready,
    Report,
    TestStart,
    decode_value,
    encode_value,
)
from pytest_ddp.rank import leftovers
from pytest_ddp.rank.channel import THREAD_JOIN_WAIT, Channel, done_event, start_test
from pytest_ddp.record import injector


def serve_functions(start: RankStart, channel: Channel) -> int:
    """Function mode: call ``module.qualname(rank, *args, **kwargs)`` per command."""
    channel.event(Ready(), wake=True)
    for command in channel.commands(CallFunction):
        start_test()
        armed = decode_value(command.faults) if command.faults else ()
        injector.arm(armed, start.role.rank, channel.log)
        threads_before = set(threading.enumerate())
        channel.event(TestStart(command.id))
        channel.event(PhaseStart("call"))
        data: dict[str, Any]
        try:
            fn: Any = importlib.import_module(command.module)
            for part in command.qualname.split("."):
                fn = getattr(fn, part)
            args, kwargs = decode_value(command.args)
            value = fn(start.role.rank, *args, **kwargs)
            try:
                encoded: str | None = encode_value(value)
            except Exception:
                encoded = None  # a value that cannot be pickled arrives as None
            outcome, data = "passed", {"value": encoded}
        except BaseException as exc:  # the function's failure is the result, whatever it is
            outcome = "failed"
            data = {
                "exception": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        threads_left = leftovers.threads_left(threads_before, THREAD_JOIN_WAIT)
        if threads_left and outcome == "passed":
            text = leftovers.threads_left_text(threads_left, THREAD_JOIN_WAIT)
            outcome, data = "failed", {"exception": text}
        channel.event(Report("call", outcome, data=data), wake=True)
        channel.event(done_event(threads_left), wake=True)
    return 0


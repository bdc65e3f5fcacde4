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
    decode_value,
    encode_value,
)
from pytest_ddp.rank import leftovers, thread_errors
from pytest_ddp.rank.channel import Channel


def serve_functions(start: RankStart, channel: Channel) -> int:
    """Function mode: call ``module.qualname(rank, *args, **kwargs)`` per command."""
    channel.event(Ready(), wake=True)
    for command in channel.commands(CallFunction):
        channel.start_test(command.id, decode_value(command.faults) if command.faults else ())
        threads_before = set(threading.enumerate())
        channel.event(PhaseStart("call"))
        data: dict[str, Any]
        try:
            fn: Any = importlib.import_module(command.module)
            for part in command.qualname.split("."):
                fn = getattr(fn, part)
            args, kwargs = decode_value(command.args)
            with thread_errors.told(channel.event):
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
        threads_left = leftovers.threads_left(threads_before)
        if threads_left and outcome == "passed":
            text = leftovers.threads_left_text(threads_left)
            outcome, data = "failed", {"exception": text}
        channel.event(Report("call", outcome, data=data), wake=True)
        channel.test_done(threads_left)
    return 0

"""A call's site is the user's innermost line, not a library's: a call made inside an installed
library (accelerate, DeepSpeed, torchmetrics) or the standard library is recorded at the user's
line that led there, with the library's frame as its caller, shown from site-packages; a plain
``dist.all_reduce`` keeps its own line and has no caller."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

import pytest_ddp
from pytest_ddp.record import describe

HERE = os.path.relpath(__file__)  # how a site shows this file: relative to the working folder


def _line(marker: str) -> int:
    return next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith(marker))


def _sited(frame: FrameType) -> dict[str, str]:
    return json.loads("{" + describe.site(frame) + "}")


# A library's function that "calls torch.distributed": it describes its own frame, as the
# recorder describes the frame that called a torch.distributed function.
LIBRARY = "import sys\n\ndef sync(site):\n    return site(sys._getframe())\n"


def _library(path: str) -> Callable[[Callable[[FrameType], Any]], Any]:
    """The library's ``sync``, as if its file were ``path``."""
    namespace: dict[str, Any] = {}
    exec(compile(LIBRARY, path, "exec"), namespace)
    return namespace["sync"]


def test_a_plain_call_is_sited_at_its_own_line_with_no_caller() -> None:
    assert _sited(sys._getframe()) == {"site": f"{HERE}:{_line('# plain')}"}  # plain


def _helper_that_calls() -> dict[str, Any]:
    return _sited(sys._getframe())  # in the helper


def test_a_call_in_the_users_function_keeps_the_users_lines_that_led_there() -> None:
    # Where that function was called (under ``if rank == 0:``, code_ties.one_rank_call), up to the
    # first frame not the user's (pytest's, which called this test).
    assert _helper_that_calls() == {  # the helper called
        "site": f"{HERE}:{_line('# in the helper')}", "outer": [f"{HERE}:{_line('# the helper called')}"],
    }
    sync = _library("/venv/lib/python3.11/site-packages/fakecomm/comm.py")
    assert sync(lambda frame: _helper_through(sync)) == {  # called with a library between
        "site": f"{HERE}:{_line('# through the library, from a helper')}", "caller": "fakecomm/comm.py:4",
        "outer": [f"{HERE}:{_line('# called with a library between')}"],
    }


def _helper_through(sync: Callable[[Callable[[FrameType], Any]], Any]) -> dict[str, Any]:
    return sync(_sited)  # through the library, from a helper


def test_a_call_inside_an_installed_library_is_sited_at_the_users_line() -> None:
    sync = _library("/venv/lib/python3.11/site-packages/fakecomm/comm.py")
    sited = sync(_sited)  # through the library
    assert sited == {"site": f"{HERE}:{_line('# through the library')}", "caller": "fakecomm/comm.py:4"}


def test_a_call_inside_the_standard_library_is_sited_at_the_users_line() -> None:
    sync = _library(os.path.join(os.path.dirname(os.__file__), "fakestd.py"))
    sited = sync(_sited)  # through the standard library
    assert sited == {"site": f"{HERE}:{_line('# through the standard library')}", "caller": "fakestd.py:4"}


def test_a_librarys_own_thread_is_sited_in_the_library() -> None:
    sync = _library("/venv/lib/python3.11/site-packages/fakecomm/worker.py")
    found: list[dict[str, str]] = []
    # The thread's target is the library's function: no frame of the user's led there.
    worker = threading.Thread(target=sync, args=(lambda frame: found.append(_sited(frame)),))
    worker.start()
    worker.join()
    assert found == [{"site": "fakecomm/worker.py:4"}]


# -- on real ranks ----------------------------------------------------------------------------

FAKECOMM = "import torch, torch.distributed as dist\n\ndef sync():\n    dist.barrier()\n"


def plain_then_through_a_library(rank: int, folder: str) -> None:
    sys.path.insert(0, folder)
    import fakecomm

    dist.all_reduce(torch.ones(1))  # the plain call
    if rank == 0:
        fakecomm.sync()  # the user's line into the library


def test_real_calls_plain_and_through_a_library(tmp_path: Path) -> None:
    folder = tmp_path / "site-packages"
    folder.mkdir()
    (folder / "fakecomm.py").write_text(FAKECOMM)
    result = pytest_ddp.run(plain_then_through_a_library, world_size=2, args=(str(folder),), timeout=30)
    assert result.outcome == "deadlock" and result.diagnosis is not None
    plain, barrier = result.ranks[0].collectives
    assert (plain.site.endswith(f"test_call_sites.py:{_line('# the plain call')}"), plain.caller) == (True, None)
    user = f"test_call_sites.py:{_line('# the user' + chr(39) + 's line into the library')}"
    assert barrier.site.endswith(user) and barrier.caller == "fakecomm.py:4"
    headline = result.diagnosis.text.splitlines()[0]
    # Rank 0 alone syncs, out of sight in the library, under its own branch: rank 0 is named.
    called = f"rank 0 alone called barrier #2 (tests/record/{user} via fakecomm.py:4), in a branch"
    assert headline.startswith(called)

"""The recorder, seen through real ranks: what each torch.distributed call leaves in the record;
and its numbering, on its own."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import pytest_ddp
from conftest import line_of
from pytest_ddp import recorder
from pytest_ddp.protocol import EventLog


def many_calls(rank: int) -> None:
    sub = dist.new_group([0, 1])
    t = torch.ones(2, 3, dtype=torch.float64)
    dist.all_reduce(t)                                  # WORLD #1
    dist.all_reduce(torch.ones(1), group=sub)           # group #1
    gathered = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})    # WORLD #2, once (its inner all_gathers are not recorded)
    dist.broadcast(torch.zeros(4), src=1)               # WORLD #3, root 1
    work = dist.all_reduce(torch.ones(1), async_op=True)  # WORLD #4, async
    work.wait()
    if rank == 0:
        dist.send(torch.ones(1), dst=1)                 # send #1 to 1
        dist.send(torch.ones(1), dst=1)                 # send #2 to 1
    else:
        dist.recv(torch.zeros(1), src=0)
        dist.recv(torch.zeros(1), src=0)


def test_each_call_is_recorded_once_with_its_details() -> None:
    result = pytest_ddp.run(many_calls, world_size=2, timeout=30)
    assert result.outcome == "passed", result.diagnosis and result.diagnosis.text
    calls = result.ranks[0].collectives
    summary = [(c.op, c.group == "WORLD", c.seq) for c in calls]
    assert summary == [
        ("new_group", True, 0),
        ("all_reduce", True, 1),
        ("all_reduce", False, 1),
        ("all_gather_object", True, 2),
        ("broadcast", True, 3),
        ("all_reduce", True, 4),
        ("send", True, 1),
        ("send", True, 2),
    ]
    first = calls[1]
    assert (first.shapes, first.dtypes, first.devices, first.group_ranks) == ([[2, 3]], ["float64"], ["cpu"], (0, 1))
    assert first.site == f"tests/test_recording.py:{line_of(Path(__file__), '# WORLD #1')}" and first.state == "ok"
    assert calls[2].group_ranks == (0, 1) and calls[2].group != "WORLD"
    gather = calls[3]
    assert gather.obj_type == "dict" and gather.obj_size and gather.obj_size > 10
    assert calls[4].root == 1
    assert calls[5].is_async
    assert (calls[6].peer, calls[7].peer) == (1, 1)
    assert [(c.op, c.seq, c.peer) for c in result.ranks[1].collectives[-2:]] == [("recv", 1, 0), ("recv", 2, 0)]
    assert result.collective_differences == []


def raises_inside(rank: int) -> None:
    dist.all_gather_object([None], lambda: rank, group=dist.new_group([rank]))


def test_a_call_that_raises_is_recorded_with_its_error() -> None:
    result = pytest_ddp.run(raises_inside, world_size=1, timeout=30)
    call = result.ranks[0].collectives[-1]
    assert (call.op, call.state) == ("all_gather_object", "raised")
    assert "pickle" in call.error and call.obj_size is None


def test_a_ret_written_by_another_thread_is_waited_for(tmp_path) -> None:
    # DDP's collectives get their ret from a callback in Gloo's thread, which
    # may run just after DDP's wait returned; the rank waits for it before it
    # says the test is done.
    numbers = recorder._Numbers()
    log = EventLog(str(tmp_path / "events"))
    index, generation = numbers.write_call(log, '"op":"all_reduce"', ("WORLD",))
    numbers.expect_late_ret(index)
    assert numbers.wait_for_late_rets(time.monotonic()) == [index]  # no ret yet
    gloo_thread = threading.Thread(target=numbers.write_late_ret, args=(log, index, generation, None))
    gloo_thread.start()
    assert numbers.wait_for_late_rets(time.monotonic() + 60) == []
    gloo_thread.join()
    assert [json.loads(line)["e"] for line in (tmp_path / "events").read_text().splitlines()] == ["call", "ret"]

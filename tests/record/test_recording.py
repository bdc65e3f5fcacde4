"""The recorder, seen through real ranks: what each torch.distributed call leaves in the record;
and its numbering, on its own."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pytest_ddp
from conftest import line_of
from pytest_ddp.common.event_log import EventLog, EventReader
from pytest_ddp.common.protocol import Event, RetEvent, WaitEvent, encode
from pytest_ddp.record import numbering, recorder


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
    world_1 = line_of(Path(__file__), "# WORLD #1")
    assert first.site == f"tests/record/test_recording.py:{world_1}" and first.state == "ok"
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


class HandMadeFuture:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def value(self) -> None:
        if self.error is not None:
            raise self.error


class HandMadeWork:
    """A Work as the recorder sees one: whether it completed, and its future."""

    def __init__(self, error: Exception | None = None) -> None:
        self.completed = False
        self.future = HandMadeFuture(error)

    def is_completed(self) -> bool:
        return self.completed

    def get_future(self) -> HandMadeFuture:
        return self.future


class SendWork(HandMadeWork):
    def get_future(self) -> HandMadeFuture:
        raise RuntimeError("Gloo's send work has no future")


class Lines:
    """An event log that keeps its lines, and says when one is written."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.written = threading.Event()

    def write_line(self, line: str) -> None:
        self.events.append(json.loads(line))
        self.written.set()

    def write(self, event: Event) -> None:
        self.write_line(encode(event).decode())


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> Lines:
    log = Lines()
    monkeypatch.setattr(numbering, "log", log)
    return log


def rets(lines: Lines) -> list[tuple[int, bool]]:
    return [(e["i"], e["ok"]) for e in lines.events if e["e"] == "ret"]


def test_an_asynchronous_calls_ret_is_written_when_its_wait_returns_or_its_work_completes(lines: Lines) -> None:
    pending = numbering.Pending()
    waited, completing, failing = HandMadeWork(), HandMadeWork(), HandMadeWork(RuntimeError("peer gone"))
    for index, work in enumerate((waited, completing, failing)):
        assert pending.add(index, work)
    assert pending.sweep() and rets(lines) == []  # none completed: each still running
    completing.completed = failing.completed = True
    assert pending.sweep()
    assert rets(lines) == [(1, True), (2, False)]
    assert "peer gone" in lines.events[-1]["err"]
    assert not pending.sweep(waited=0)  # its wait returned: done, whatever the work says
    assert rets(lines)[-1] == (0, True)


def test_the_wait_and_ret_lines_read_back_as_the_events_written(tmp_path: Path) -> None:
    """numbering's writers, the only ones of these lines: a wait, a ret, a failed one, and an MPI
    receive's that says which message it got (its source where known, and its tag)."""
    log = EventLog(str(tmp_path / "events"))
    numbering.write_wait(log, 0)
    numbering.write_ret(log, 0)
    numbering.write_ret(log, 1, RuntimeError("peer gone"), before_backend=True)
    numbering.write_ret(log, 2, source=3, tag=7)
    numbering.write_ret(log, 3, tag=5)
    log.close()
    events = EventReader(str(tmp_path / "events")).read_new()
    assert [type(event) for event in events] == [WaitEvent] + [RetEvent] * 4
    assert all(event.time > 0 for event in events)
    rets = [event for event in events if isinstance(event, RetEvent)]
    assert [(e.index, e.ok, e.error, e.before_backend, e.source, e.tag) for e in rets] == [
        (0, True, None, False, None, None),
        (1, False, "RuntimeError: peer gone", True, None, None),
        (2, True, None, False, 3, 7),
        (3, True, None, False, None, 5),
    ]


def test_work_without_a_future_is_not_left_pending(lines: Lines) -> None:
    pending = numbering.Pending()
    assert not pending.add(0, SendWork())  # the caller writes its ret at once
    assert pending.works == {}


def test_work_nobody_waits_for_gets_its_ret_from_the_looking_thread(lines: Lines) -> None:
    # DDP's reducer waits for its buckets in C++: no recorded wait, and maybe no later call.
    pending = numbering.Pending()
    pending.start_looking()
    work = HandMadeWork()
    work.completed = True
    pending.add(7, work)
    assert lines.written.wait(60)
    assert rets(lines) == [(7, True)]


def test_pending_work_at_the_end_of_the_test_is_waited_for_then_listed(
    lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    done_by_its_wait, never_done = HandMadeWork(), HandMadeWork()

    def wait(work: HandMadeWork, timeout: object) -> None:
        if work is never_done:
            raise RuntimeError("Timed out waiting 1000ms for the work")
        work.completed = True

    monkeypatch.setitem(recorder.originals, (dist.Work, "wait"), wait)
    recorder.start_test()
    numbering.pending.add(3, done_by_its_wait)
    numbering.pending.add(4, never_done)
    assert recorder.unfinished_work(60) == [{"i": 4, "err": "Timed out waiting 1000ms for the work"}]
    assert rets(lines) == [(3, True)]
    assert numbering.pending.works == {}

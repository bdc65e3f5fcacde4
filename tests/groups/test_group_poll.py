"""The controller's looks at a warm test, with nothing missed: a rank group's ``poll`` waits past a
rank that is done while others still run, and comes back at once for what the watchdog must judge
(every rank done, a failure, a death), also when the wake-up bytes were drained before; the event
reader reads a large log whole and a cut line once whole; each test's output of a rank comes back
alone, read from its files past an offset.

Real ranks (a RankGroup, as the controller drives it), real files; no mocks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import wait_for
from pytest_ddp.common.event_log import EventLog, EventReader
from pytest_ddp.common.protocol import Done, PhaseStart, RunItem, encode
from pytest_ddp.groups.group import GroupConfig, RankGroup
from pytest_ddp.groups.spawn import file_size, rank_files, read_from

RANK_TESTS = '''
import os, sys, pytest

FIFO = {fifo!r}

def wait_for_the_test():
    with open(FIFO) as f:  # blocks until the test opens it for writing
        f.read()

@pytest.mark.ddp(world_size=2)
def test_rank1_waits(rank):
    if rank == 1:
        wait_for_the_test()

@pytest.mark.ddp(world_size=2)
def test_rank1_fails_rank0_waits(rank):
    if rank == 0:
        wait_for_the_test()
    assert rank == 0, "rank 1 fails"

@pytest.mark.ddp(world_size=2)
def test_rank1_dies_rank0_waits(rank):
    if rank == 0:
        wait_for_the_test()
    else:
        os._exit(3)

@pytest.mark.ddp(world_size=2)
def test_both_pass(rank):
    pass

@pytest.mark.ddp(world_size=2)
def test_prints(rank):
    print("out", rank)
    print("err", rank, file=sys.stderr)
'''


@pytest.fixture
def group(tmp_path: Path):
    """A started 2-rank group that collected RANK_TESTS, and the FIFO its tests wait on."""
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    (tmp_path / "test_ranks.py").write_text(RANK_TESTS.format(fifo=str(fifo)))
    args = ["-q", "-p", "no:cacheprovider", "--capture=no", str(tmp_path / "test_ranks.py")]  # as a rank's
    config = GroupConfig(2, "gloo", True, pg_timeout=600, pytest_args=args, workdir_parent=str(tmp_path))
    group = RankGroup(config)
    group.start(deadline=time.monotonic() + 120)
    try:
        yield group, fifo
    finally:
        _release(fifo)
        group.kill()


def _release(fifo: Path) -> None:
    """Let a rank blocked opening the FIFO go on (without blocking here when none is)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader: nobody waits
        pass


def _begin(group: RankGroup, name: str) -> None:
    nodeid = next(item for item in group.config.items or group._items if item.endswith(f"::{name}"))
    group.begin(RunItem(nodeid))


def _done_in_log(group: RankGroup, rank: int) -> EventReader:
    """A reader of the rank's own event log, beside the group's, to see its Done without folding it."""
    return EventReader(str(rank_files(group.workdir, rank)["events"]))


@pytest.mark.timeout(120)
def test_a_rank_done_while_another_runs_is_waited_past_then_all_done_comes_at_once(group) -> None:
    group, fifo = group
    _begin(group, "test_rank1_waits")
    reader = _done_in_log(group, 0)
    seen: list[object] = []
    wait_for(lambda: seen.extend(reader.read_new()) or any(isinstance(e, Done) for e in seen), "rank 0's Done")
    wait = 0.3
    began = time.monotonic()
    group.poll(wait)
    assert time.monotonic() - began >= wait  # rank 0's Done alone is nothing to judge
    assert group.states[0].finished and not group.states[1].finished
    _release(fifo)
    group.poll(3600)  # the timeout mark fails it if it waits for the wait's end
    assert all(state.finished for state in group.states)
    assert [state.reports["call"]["outcome"] for state in group.states] == ["passed", "passed"]
    reader.close()


@pytest.mark.timeout(120)
def test_a_failure_while_another_rank_runs_comes_back_at_once(group) -> None:
    group, _ = group
    _begin(group, "test_rank1_fails_rank0_waits")
    while group.states[1].failed_at is None:  # each poll comes back on news to judge, or in an hour
        group.poll(3600)
    assert not group.states[0].finished
    assert group.states[1].reports["call"]["outcome"] == "failed"


@pytest.mark.timeout(120)
def test_a_death_while_another_rank_runs_comes_back_at_once(group) -> None:
    group, _ = group
    _begin(group, "test_rank1_dies_rank0_waits")
    while group.states[1].alive:
        group.poll(3600)
    assert group.states[1].exit_code == 3
    assert not group.states[0].finished


@pytest.mark.timeout(120)
def test_all_done_is_folded_in_at_once_when_the_wake_ups_were_drained_before(group) -> None:
    group, _ = group
    _begin(group, "test_both_pass")
    readers = [_done_in_log(group, rank) for rank in (0, 1)]
    seen: list[object] = []
    wait_for(
        lambda: seen.extend(e for r in readers for e in r.read_new()) or sum(isinstance(e, Done) for e in seen) == 2,
        "both ranks' Done",
    )
    assert group.alive  # reads the wake-up bytes, folds nothing
    group.poll(3600)  # nothing more will come: the timeout mark fails it if it waits
    assert all(state.finished for state in group.states)
    for reader in readers:
        reader.close()


def test_the_event_reader_reads_a_log_larger_than_one_read_whole_and_a_cut_line_once_whole(tmp_path) -> None:
    path = str(tmp_path / "events")
    reader = EventReader(path)
    assert reader.read_new() == []  # not created yet
    log = EventLog(path)
    events = [PhaseStart(f"phase {i:06d}" + "x" * 100) for i in range(2000)]  # over 200 KiB
    for event in events:
        log.write(event)
    assert reader.read_new() == events
    assert reader.read_new() == []
    line = PhaseStart("call")
    with open(path, "ab") as f:
        whole = encode(line)
        f.write(whole[:5])
        f.flush()
        assert reader.read_new() == []  # a line cut short waits for its end
        f.write(whole[5:])
    assert reader.read_new() == [line]
    log.close()
    reader.close()


@pytest.mark.timeout(120)
def test_each_tests_output_comes_back_alone(group) -> None:
    group, _ = group
    for _ in range(2):  # the second test's output alone: where the first one's ended was marked
        _begin(group, "test_prints")
        while not all(state.finished for state in group.states):
            group.poll(3600)
        group.current = None
        assert [group.test_output(rank) for rank in (0, 1)] == [
            {"stdout": f"out {rank}\n", "stderr": f"err {rank}\n"} for rank in (0, 1)
        ]


def test_a_ranks_file_is_read_from_an_offset_before_and_after_the_rank_made_it(tmp_path) -> None:
    path = tmp_path / "stdout"
    assert (file_size(path), read_from(path, 0)) == (0, "")  # not made yet
    data = b"x" * 100_000 + b"\xff tail"  # more than one read; a byte that is not UTF-8
    path.write_bytes(data[:10])
    assert (file_size(path), read_from(path, 0), read_from(path, 10)) == (10, "x" * 10, "")
    with open(path, "ab") as f:  # as the rank writes: appended
        f.write(data[10:])
    assert file_size(path) == len(data)
    assert read_from(path, 99_990) == "x" * 10 + "\ufffd tail"
    assert read_from(path, len(data) + 5) == ""  # an offset past its end

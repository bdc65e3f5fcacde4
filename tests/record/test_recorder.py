"""The recorder in real processes: Gloo groups over a FileStore, real calls, the event log read back.

Groups of one run in this process; two-rank runs are spawned, each rank a fresh
interpreter that installs the recorder, joins the group and runs one function
of this module.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from conftest import line_of
from pytest_ddp.common.event_log import EventLog, EventReader
from pytest_ddp.common.protocol import Done, TestStart
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.record import recorder

HERE = Path(__file__)


def site(text: str) -> str:
    """The call site the recorder should name for the line of this file holding ``text``."""
    return f"{os.path.relpath(HERE)}:{line_of(HERE, text)}"


def read_tests(folder: Path, rank: int) -> list[RankState]:
    """A rank's log so far, folded the way the controller folds it: one state per test."""
    states = [RankState(rank)]
    reader = EventReader(str(folder / f"rank{rank}.events"))
    events = reader.read_new()
    reader.close()
    for event in events:
        if isinstance(event, TestStart):
            states.append(RankState(rank))
        else:
            states[-1].apply(event)
    return states


def summary(calls: list[Call]) -> list[tuple[str, str, int]]:
    return [(c.op, c.group, c.seq) for c in calls]


# -- ranks in spawned processes -------------------------------------------------


def rank_main(rank: int, body: Callable[[int, EventLog], None], world_size: int, folder: str) -> None:
    log = EventLog(os.path.join(folder, f"rank{rank}.events"))
    recorder.install(log)
    recorder.start_test()
    store = dist.FileStore(os.path.join(folder, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    body(rank, log)
    log.write(Done())
    dist.destroy_process_group()


def spawn(body: Callable[[int, EventLog], None], folder: Path, join: bool = True) -> mp.ProcessContext | None:
    return mp.start_processes(
        rank_main, args=(body, 2, str(folder)), nprocs=2, join=join, start_method="spawn"
    )


def many_calls(rank: int, log: EventLog) -> None:
    sub = dist.new_group([0, 1], timeout=timedelta(seconds=30))
    dist.all_reduce(torch.ones(2, 3, dtype=torch.float64))  # WORLD 1
    dist.all_reduce(torch.ones(1), group=sub)  # sub 1
    gathered: list[object] = [None, None]
    dist.all_gather_object(gathered, {"rank": rank})  # WORLD 2
    dist.broadcast(torch.zeros(4), src=1)  # WORLD 3
    dist.broadcast(torch.zeros(4), group=sub, group_src=1)  # sub 2
    dist.all_reduce(torch.ones(1), async_op=True).wait()  # WORLD 4
    if rank == 0:
        dist.send(torch.ones(1), dst=1)
        dist.send(torch.ones(1), dst=1)
    else:
        dist.recv(torch.zeros(1), src=0)
        dist.recv(torch.zeros(1))  # any source
    peer = 1 - rank
    ops = [dist.P2POp(dist.isend, torch.ones(2), peer), dist.P2POp(dist.irecv, torch.zeros(2), peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    dist.all_reduce(torch.ones(1))  # WORLD 5
    if rank == 0:  # raises before communicating: rank 1 need not take part
        with pytest.raises((AttributeError, pickle.PicklingError)):
            dist.all_gather_object(gathered, lambda: rank)
    log.write(TestStart("the next test"))
    recorder.start_test()
    dist.barrier()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[list[RankState]]:
    """Both ranks' tests after ``many_calls``."""
    folder = tmp_path_factory.mktemp("two_ranks")
    spawn(many_calls, folder)
    return [read_tests(folder, rank) for rank in range(2)]


def test_each_call_is_recorded_once_in_its_group_sequence(two_ranks: list[list[RankState]]) -> None:
    first = two_ranks[0][0].calls
    world = [c for c in first if c.group == "WORLD" and c.is_collective]
    assert [(c.op, c.seq) for c in world] == [
        ("all_reduce", 1), ("all_gather_object", 2), ("broadcast", 3), ("all_reduce", 4),
        ("all_reduce", 5), ("all_gather_object", 6),
    ]  # all_gather_object's inner all_gathers are not recorded
    assert "all_gather" not in {c.op for c in first}
    subgroup = [c for c in first if c.group not in ("WORLD", "?")]
    assert summary(subgroup) == [("all_reduce", subgroup[0].group, 1), ("broadcast", subgroup[0].group, 2)]
    assert all(c.group_ranks == (0, 1) for c in subgroup)
    assert [c.index for c in first] == list(range(len(first)))
    assert all(c.state == "ok" for c in first[:-1])


def test_group_calls_are_in_no_sequence(two_ranks: list[list[RankState]]) -> None:
    calls = two_ranks[1][0].calls
    init, new = calls[0], calls[1]
    assert (init.op, init.seq, init.group) == ("init_process_group", 0, "WORLD")
    assert init.extra == {"rank": 1, "world_size": 2, "init_method": "store", "backend": "gloo", "timeout": 60.0}
    assert (new.op, new.seq, new.extra) == ("new_group", 0, {"ranks": [0, 1], "timeout": 30.0})
    assert init.site == site("dist.init_process_group(")
    assert new.site == site("sub = dist.new_group")


def test_tensors_roots_sites_and_async_flag(two_ranks: list[list[RankState]]) -> None:
    by_op = {}
    for call in two_ranks[0][0].calls:
        by_op.setdefault(call.op, []).append(call)
    first = by_op["all_reduce"][0]
    assert (first.shapes, first.dtypes, first.devices) == ([[2, 3]], ["float64"], ["cpu"])
    assert first.group_ranks == (0, 1) and first.site == site("dtype=torch.float64))  # WORLD 1")
    assert [b.root for b in by_op["broadcast"]] == [1, 1]  # a group_src is given as its global rank
    assert by_op["all_reduce"][2].is_async and not first.is_async


def test_object_calls_record_type_and_pickled_size(two_ranks: list[list[RankState]]) -> None:
    gather = next(c for c in two_ranks[1][0].calls if c.op == "all_gather_object")
    assert gather.obj_type == "dict" and gather.obj_size == len(pickle.dumps({"rank": 1}))
    assert gather.shapes == []


def test_unpicklable_object_raised_before_communicating(two_ranks: list[list[RankState]]) -> None:
    failed = two_ranks[0][0].calls[-1]
    assert (failed.op, failed.state) == ("all_gather_object", "raised")
    assert (failed.obj_type, failed.obj_size) == ("function", None)
    assert failed.error is not None and "pickle" in failed.error
    assert failed.site == site("dist.all_gather_object(gathered, lambda")
    assert two_ranks[1][0].calls[-1].op == "all_reduce"  # rank 1 never called it


def test_point_to_point_calls_count_per_direction_and_peer(two_ranks: list[list[RankState]]) -> None:
    def exchanges(calls: list[Call]) -> list[Call]:
        return [c for c in calls if c.kind.kind in ("p2p", "batch")]

    sends, recvs = exchanges(two_ranks[0][0].calls), exchanges(two_ranks[1][0].calls)
    # A batch on Gloo: the batch, then each of its sends and receives, numbered with the others.
    assert [(c.op, c.seq, c.peer) for c in sends] == [
        ("send", 1, 1), ("send", 2, 1), ("batch_isend_irecv", 1, None), ("isend", 3, 1), ("irecv", 1, 1)]
    assert [(c.op, c.seq, c.peer) for c in recvs] == [
        ("recv", 1, 0), ("recv", 1, None), ("batch_isend_irecv", 1, None), ("isend", 1, 0), ("irecv", 2, 0)]
    assert sends[2].shapes == [[2], [2]]
    # A batch goes to many peers at once: it pairs with no single call, and has no collective number.
    assert not sends[2].is_p2p and not sends[2].is_collective


def test_start_test_restarts_call_and_sequence_numbers(two_ranks: list[list[RankState]]) -> None:
    for tests in two_ranks:
        assert [(c.index, c.op, c.seq) for c in tests[1].calls[:1]] == [(0, "barrier", 1)]
        assert tests[1].finished


# -- DDP -----------------------------------------------------------------------


def ddp_rank_skips_backward(rank: int, log: EventLog) -> None:
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    assert dist.get_backend() == "gloo" and model.process_group is dist.group.WORLD
    model(torch.ones(3, 4)).sum().backward()  # a whole step
    loss = model(torch.ones(3, 4)).sum()
    if rank == 0:
        loss.backward()  # blocks: rank 1 never sends its gradients
    else:
        log.write(Done())
        time.sleep(120)  # alive, so rank 0 stays blocked rather than failing; the test kills it


def test_ddp_gradient_allreduce_is_recorded_and_shows_a_blocked_rank(tmp_path: Path) -> None:
    context = spawn(ddp_rank_skips_backward, tmp_path, join=False)
    assert context is not None
    try:
        deadline = time.monotonic() + 120
        while True:
            ranks = [read_tests(tmp_path, rank)[0] for rank in range(2)]
            blocked = ranks[0].current_call
            if ranks[1].finished and blocked is not None and blocked.op == "all_reduce":
                break
            assert time.monotonic() < deadline, [summary(r.calls) for r in ranks]
            assert all(p.is_alive() for p in context.processes)
            time.sleep(0.1)
    finally:
        for process in context.processes:
            process.kill()
            process.join()
    ddp = [c for c in ranks[0].calls if c.extra.get("via") == "backend"]
    assert {c.op for c in ddp} == {"all_gather", "broadcast", "all_reduce"}  # constructor, then buckets
    assert summary(ranks[0].calls[:-1]) == summary(ranks[1].calls)  # in step until rank 1 stopped
    world = [c for c in ranks[0].calls if c.is_collective]
    assert [c.seq for c in world] == list(range(1, len(world) + 1))  # DDP's calls in the group's count
    step = [c for c in ranks[1].calls if c.op == "all_reduce"]
    assert [(c.state, c.shapes, c.extra) for c in step] == [("ok", [[10]], {"via": "backend", "op": "SUM"})]
    assert (blocked.seq, blocked.shapes, blocked.state) == (ranks[1].calls[-1].seq + 1, [[10]], "running")
    assert blocked.site == site("loss.backward()  # blocks")


# -- a group of one, in this process -------------------------------------------


@pytest.fixture
def alone(tmp_path: Path) -> Iterator[Path]:
    """This process as a Gloo group of one, its calls recorded to ``tmp_path/rank0.events``."""
    log = EventLog(str(tmp_path / "rank0.events"))
    recorder.install(log)
    recorder.start_test()
    try:
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
        yield tmp_path
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        recorder.uninstall()
        log.close()


def test_a_failing_call_is_recorded_with_its_error(alone: Path) -> None:
    with pytest.raises(ValueError):
        dist.broadcast(torch.ones(1), src=0, group_src=0)  # both given: torch refuses
    call = read_tests(alone, 0)[0].calls[-1]
    assert (call.op, call.state, call.seq) == ("broadcast", "raised", 1)
    assert call.error is not None and call.error.startswith("ValueError: ")


def test_imported_names_and_both_modules_record(alone: Path) -> None:
    from torch.distributed import all_reduce

    all_reduce(torch.ones(1))
    c10d.all_reduce(torch.ones(1))
    assert summary(read_tests(alone, 0)[0].calls[1:]) == [("all_reduce", "WORLD", 1), ("all_reduce", "WORLD", 2)]


def test_c10d_calls_past_the_python_functions_are_recorded_in_the_group_sequence(alone: Path) -> None:
    world = dist.group.WORLD
    dist.all_reduce(torch.ones(1))
    dist._broadcast_coalesced(world, [torch.ones(3), torch.ones(2)], 1 << 20, 0)  # as DDP syncs buffers
    dist.all_reduce(torch.ones(1))
    assert dist.group.WORLD is world and dist.get_backend() == "gloo"
    deadline = time.monotonic() + 10
    while (calls := read_tests(alone, 0)[0].calls[1:])[1].state == "running":  # ret: once seen done
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [(c.op, c.seq, c.extra) for c in calls] == [
        ("all_reduce", 1, {"op": "SUM"}), ("broadcast", 2, {"via": "backend"}), ("all_reduce", 3, {"op": "SUM"}),
    ]
    assert (calls[1].shapes, calls[1].root, calls[1].state) == ([[5]], 0, "ok")
    assert calls[1].site == site("dist._broadcast_coalesced(world")


def test_install_is_idempotent_and_uninstall_restores_torch(tmp_path: Path) -> None:
    originals = (dist.all_reduce, c10d.all_reduce, dist.Work.wait)
    log = EventLog(str(tmp_path / "events"))
    recorder.install(log)
    try:
        wrapped = dist.all_reduce
        recorder.install(log)
        assert dist.all_reduce is wrapped is c10d.all_reduce and wrapped is not originals[0]
        assert dist.Work.wait is not originals[2]
    finally:
        recorder.uninstall()
        log.close()
    assert (dist.all_reduce, c10d.all_reduce, dist.Work.wait) == originals


def test_a_call_made_inside_a_library_names_the_users_line_that_led_there(alone: Path) -> None:
    """torchmetrics' compute() calls all_gather from its own file: the site is the test's line,
    the library's frame its caller, shown from site-packages."""
    library = alone / "site-packages" / "fakemetrics.py"
    library.parent.mkdir()
    library.write_text("import torch, torch.distributed as dist\n\ndef compute():\n    dist.barrier()\n")
    namespace: dict[str, object] = {}
    exec(compile(library.read_text(), str(library), "exec"), namespace)
    namespace["compute"]()  # the user's line
    dist.barrier()  # the test's own barrier
    library_call, own_call = read_tests(alone, 0)[0].calls[1:]
    assert library_call.site == site("namespace[\"compute\"]()  # the user's line")
    assert library_call.caller == "fakemetrics.py:4"
    assert (own_call.site, own_call.caller) == (site("dist.barrier()  # the test's own barrier"), None)

"""The faults that replace a call (skip, extra, change), each fired once on real ranks, in one inner
session, with what the diagnosis then says.  Declared and checked: tests/test_faults.py."""

from __future__ import annotations

import json

from conftest import HEADER
from pytest_ddp.report.writable import file_name

# -- on real ranks: one session, each fault fired once ------------------------------------

REPLACED = """
import torch
import torch.distributed as dist

from pytest_ddp import faults


@pytest.mark.ddp(world_size=2, faults=[faults.skip(rank=1, at="all_reduce", call=2)])
def test_skip(rank):
    for _ in range(2):
        dist.all_reduce(torch.ones(2))  # the skipped call


@pytest.mark.ddp(world_size=2, faults=[faults.skip(rank=1, at="all_reduce", call=2)])
def test_skip_in_a_loop(rank):
    t = torch.ones(2)
    for _ in range(2):
        dist.all_reduce(t)  # the call skipped in the second round
        dist.broadcast(t, src=0)


@pytest.mark.ddp(world_size=2, faults=[faults.extra(rank=0, at="all_reduce", call=1)])
def test_extra(rank):
    t = torch.ones(2)
    dist.all_reduce(t)  # the call made twice


@pytest.mark.ddp(world_size=2, faults=[faults.change(rank=1, at="all_reduce", shape=(3,))])
def test_shape(rank):
    dist.all_reduce(torch.ones(2))  # the call of another shape


@pytest.mark.ddp(world_size=2, faults=[faults.change(rank=1, at="all_reduce", dtype="float64")])
def test_dtype(rank):
    dist.all_reduce(torch.ones(2))  # the call of another dtype


@pytest.mark.ddp(world_size=2, faults=[faults.change(rank=0, at="all_reduce", op="broadcast")])
def test_op(rank):
    dist.all_reduce(torch.ones(2))  # the call made a broadcast


@pytest.mark.ddp(world_size=2, faults=[faults.change(rank=1, at="all_reduce", reduce_op="MAX")])
def test_reduce_op(rank):
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)  # the call that asks for the max
    assert t.tolist() == [3.0, 3.0]  # Gloo sums on both ranks, as bare torch does (measured)


@pytest.mark.ddp(world_size=2, faults=[faults.skip(rank=1, at="all_reduce", call=1)])
def test_skip_at_the_backend(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
"""


def test_each_replacing_fault_fired_on_real_ranks(ddp_pytester, tmp_path):
    result = ddp_pytester.run(REPLACED, f"--ddp-report-dir={tmp_path}", "-p", "no:randomly")
    # test_reduce_op's ranks pass (Gloo sums on both, as bare torch does), but their calls
    # disagree on the reduce op: the test fails, a mismatch.
    result.assert_outcomes(failed=8)
    reports = {
        name: json.loads((tmp_path / f"{file_name(f'test_it.py::test_{name}')}.json").read_text())
        for name in ("skip", "extra", "shape", "dtype", "op", "reduce_op", "skip_at_the_backend")
    }
    for name, fault in [("skip", "call skipped on rank 1 at all_reduce call 2"),
                        ("extra", "call made twice on rank 0 at all_reduce call 1"),
                        ("shape", "call changed to shape [3] on rank 1 at all_reduce call 1"),
                        ("dtype", "call changed to dtype float64 on rank 1 at all_reduce call 1"),
                        ("op", "call changed to op broadcast on rank 0 at all_reduce call 1"),
                        ("reduce_op", "call changed to reduce op MAX on rank 1 at all_reduce call 1")]:
        assert [i["text"] for i in reports[name]["injected"]] == [fault], name
    # Rank 1 returned without all_reduce #2; rank 0 made all_reduce #2 once more than rank 1.
    assert (reports["skip"]["kind"], reports["skip"]["culprits"]) == ("partial", [1])
    assert (reports["extra"]["kind"], reports["extra"]["culprits"]) == ("partial", [1])
    for name in ("shape", "dtype", "op", "reduce_op"):
        assert reports[name]["kind"] == "mismatch", (name, reports[name]["kind"])
    assert reports["skip_at_the_backend"]["culprits"] == [1]
    # Of 2 ranks, each in another call, and each call new after the one before: a tie, which the
    # test's code breaks (no way from the broadcast's line back to it makes no all_reduce).
    skipped = "        dist.all_reduce(t)  # the call skipped in the second round"
    line = HEADER.count("\n") + REPLACED.splitlines().index(skipped) + 1
    result.stdout.fnmatch_lines([
        f"*rank 1 likely departs from rank 0 on collective #3: *Likely rank 1: its broadcast #3"
        f" (test_it.py:{line + 1}) came right after its call from test_it.py:{line + 1},"
        f" and its code makes the call of test_it.py:{line} on every way*"
    ])
    result.stdout.fnmatch_lines(["*call skipped on rank 1 at all_reduce call 1: this all_reduce reached the backend*"])

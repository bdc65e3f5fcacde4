"""The faults that replace a call (skip, extra, change): declared and checked (pure), and each
fired once on real ranks, in one inner session, with what the diagnosis then says."""

from __future__ import annotations

import json

import pytest

from conftest import HEADER
from pytest_ddp import faults
from pytest_ddp.config.spec import SpecError, parse_faults
from pytest_ddp.report.writable import file_name

# -- declared and checked -------------------------------------------------------------


def test_replacing_faults_read_as_the_report_names_them():
    assert str(faults.skip(rank=1, at="all_reduce", call=2)) == "call skipped on rank 1 at all_reduce call 2"
    assert str(faults.extra(rank=0, at="barrier")) == "call made twice on rank 0 at barrier call 1"
    assert str(faults.change(rank=1, at="all_reduce", shape=[3, 2], dtype="float64")) == (
        "call changed to shape [3, 2], dtype float64 on rank 1 at all_reduce call 1"
    )
    assert str(faults.change(rank=1, at="all_reduce", op="broadcast")) == (
        "call changed to op broadcast on rank 1 at all_reduce call 1"
    )
    assert str(faults.change(rank=1, at="reduce", reduce_op="MAX")) == (
        "call changed to reduce op MAX on rank 1 at reduce call 1"
    )


def test_a_torch_dtype_is_kept_by_name_and_a_list_shape_as_a_tuple():
    torch = pytest.importorskip("torch")
    fault = faults.change(rank=0, at="all_reduce", shape=[2], dtype=torch.float64)
    assert (fault.shape, fault.dtype) == ((2,), "float64")
    assert parse_faults([fault], 2, True) == (fault,)  # checked: a valid change


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (faults.change(rank=1, at="all_reduce"), "change needs what to change: shape=, dtype=, op= or reduce_op="),
        (faults.change(rank=1, at="all_reduce", shape=(2, -1)), "shape=(2, -1) must be a tuple of ints >= 0"),
        (faults.change(rank=1, at="all_reduce", shape="3"), "shape='3' must be a tuple of ints >= 0"),
        (faults.change(rank=1, at="all_reduce", dtype="float"), "dtype='float' is not a torch dtype; one of bool"),
        (faults.change(rank=1, at="barrier", dtype="float64"), "change the call's tensor, and barrier"),
        (faults.change(rank=1, at="all_reduce", op="all_reduce"), "op='all_reduce' must be another collective: one of"),
        (faults.change(rank=1, at="all_reduce", op="send"), "op='send' must be another collective"),
        (faults.change(rank=1, at="all_gather", op="barrier"), "op= changes one of all_reduce, broadcast, reduce"),
        (faults.change(rank=1, at="all_reduce", reduce_op="sum"), "reduce_op='sum' must be one of SUM, AVG"),
        (faults.change(rank=1, at="broadcast", reduce_op="MAX"), "reduce_op= changes the reduce op of all_reduce"),
        (faults.skip(rank=1, at="new_group"), "skip replaces a call of a torch.distributed communication function"),
        (faults.extra(rank=1, at="mpi.Allreduce"), "extra replaces a call of a torch.distributed communication"),
        (faults.skip(rank=1, at="all_gather_into_tensor_coalesced"), "all_gather_into_tensor_coalesced is not one"),
        (faults.skip(rank=2, at="all_reduce"), "skip(rank=2, at='all_reduce', call=1): there is no rank 2"),
        ([faults.skip(1, "barrier"), faults.extra(1, "barrier")], "two faults on rank 1 at barrier call 1"),
        ([faults.kill(1, "barrier"), faults.skip(1, "barrier", call=2)], "can never fire: SIGKILL on rank 1"),
    ],
)
def test_bad_replacing_faults_say_what_is_wrong(declared, message):
    with pytest.raises(SpecError, match="^faults: .*" + _escaped(message)):
        parse_faults(declared if isinstance(declared, list) else [declared], 2, True)


def _escaped(text: str) -> str:
    return "".join("\\" + c if c in "()[]?*+.^$|{}" else c for c in text)


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

"""The reduce op is recorded and compared: ranks that pass different ones to one collective
disagree, though neither Gloo nor MPICH raises on it (measured: with one rank's MAX among 4
ranks' SUMs, Gloo's all_reduce returns 3 where the sum is 4, on every rank, with no error).

Recorded by every path a reducing collective takes: torch.distributed's functions (the default
op is SUM), the functional collectives (``"max"``), the c10d
operations DDP issues (a boxed ReduceOp), mpi4py's (the MPI.Op's name)."""

from __future__ import annotations

import torch.distributed as dist
from snapshots import R4, judge, ok, outline, rank, snap
from snapshots import done as mpi_done

from pytest_ddp.diagnose import mismatches
from pytest_ddp.diagnose.consistency import compare_sequences, difference_line
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.record.describe import reduction

# -- pure: naming, comparing, saying -------------------------------------------------------


def after_the_test(states: list[RankState]) -> Verdict | None:
    """What the runner asks once every rank passed but their sequences differ."""
    return mismatches.finished_mismatch("done", {s.rank: s for s in states})


def test_every_form_of_a_reduce_op_gets_torchs_name() -> None:
    assert reduction(dist.ReduceOp.MAX) == "MAX"
    assert reduction(dist.ReduceOp(dist.ReduceOp.MIN)) == "MIN"  # a ReduceOp made of one
    assert reduction("max") == "MAX"  # a functional collective's
    assert reduction(object()) == "object"  # something else: its type, never an error


def test_one_rank_of_four_that_reduced_with_another_op_is_the_culprit_after_the_test() -> None:
    states = [rank(r, ok("all_reduce", 1, ranks=R4, extra={"op": "MAX" if r == 2 else "SUM"}), finished=True)
              for r in R4]
    assert outline(judge(snap(*states))) == ("done", None, [], [])  # they passed: each call returned
    assert outline(after_the_test(states)) == ("done", "mismatch", [2], [0, 1, 3])


def test_mpi_ranks_that_pass_different_ops_to_an_allreduce_disagree() -> None:
    states = [rank(r, mpi_done("Allreduce", 1, extra={"op": "MPI_MAX" if r == 3 else "MPI_SUM"}), finished=True)
              for r in R4]
    assert outline(after_the_test(states)) == ("done", "mismatch", [3], [0, 1, 2])


def test_the_same_op_however_given_is_no_difference_and_the_difference_names_the_ops() -> None:
    alike = [rank(r, ok("all_reduce", 1, extra={"op": "SUM"}), finished=True) for r in (0, 1)]
    assert compare_sequences(alike) == [] and after_the_test(alike) is None
    differ = [rank(r, ok("all_reduce", 1, extra={"op": op}), finished=True) for r, op in ((0, "SUM"), (1, "MAX"))]
    [difference] = compare_sequences(differ)
    assert "op SUM" in difference_line(difference) and "op MAX" in difference_line(difference)


# -- real ranks: what each path records ------------------------------------------------------

RANKS = """
import pytest, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol

@pytest.mark.ddp(world_size=4)
def test_classic():
    t = torch.ones(3)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if dist.get_rank() == 2 else dist.ReduceOp.SUM)  # no error

@pytest.mark.ddp(world_size=4)
def test_functional():
    out = funcol.all_reduce(torch.ones(3), "max" if dist.get_rank() == 1 else "sum", dist.group.WORLD)
    out.tolist()

@pytest.mark.ddp(world_size=4)
def test_the_default_op_is_sum_and_ddp_reduces_with_it():
    t = torch.ones(3)
    dist.all_reduce(t) if dist.get_rank() % 2 else dist.all_reduce(t, op=dist.ReduceOp.SUM)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
"""


def test_each_path_records_its_reduce_op_and_a_rank_with_another_is_named(pytester) -> None:
    pytester.makepyfile(test_ranks=RANKS)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    # the headline names the rank that departed from the others (test_classic)
    assert (
        "rank 2 departs from ranks 0, 1, 3 on all_reduce #1: rank 2 all_reduce shapes [[3]] float32 op MAX,"
        " ranks 0, 1, 3 all_reduce shapes [[3]] float32 op SUM"
    ) in out
    assert "rank 1 all_reduce shapes [[3]] float32 op MAX" in out
    assert "op SUM" in out

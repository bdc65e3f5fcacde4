"""Faults at their edges: an exit code that is no exit status and a fault after a deadly one at the same
operation are refused naming the fault (exit code 256 as a test's error: tests/test_faults.py); a fault that
never fired fails its test saying why; a test whose every rank an injected fault ended fails, one a
survivor passed passes."""

from __future__ import annotations

import pytest

from pytest_ddp import faults
from pytest_ddp.common.protocol import Injected
from pytest_ddp.diagnose import watchdog, wording
from pytest_ddp.diagnose.state import RankState, Snapshot

pytest_plugins = ["pytester"]


# -- faults misused ------------------------------------------------------------------------


@pytest.mark.parametrize("code", [256, -1, True, 1.5, "1"])
def test_an_exit_code_that_is_not_an_exit_status_is_refused_naming_the_fault(code: object) -> None:
    with pytest.raises(faults.FaultError) as refused:
        faults.check(faults.exit(rank=1, at="all_reduce", code=code))  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"exit(rank=1, at='all_reduce', call=1): code={code!r} must be an int from 0 to 255 (an exit status)"
    )
    assert faults.check(faults.exit(rank=1, at="all_reduce", code=255)).code == 255
    assert faults.check(faults.exit(rank=1, at="all_reduce", code=0)).code == 0


def test_a_fault_after_a_deadly_one_at_the_same_operation_is_refused() -> None:
    with pytest.raises(
        faults.FaultError,
        match=r"hang on rank 1 at all_reduce call 3 can never fire: SIGKILL on rank 1 "
        r"at all_reduce call 2 ends the rank's process before it",
    ):
        faults.check_all([faults.kill(rank=1, at="all_reduce", call=2), faults.hang(rank=1, at="all_reduce", call=3)])
    # Another rank, or an earlier call, can fire.
    faults.check_all([faults.kill(rank=1, at="all_reduce", call=2), faults.hang(rank=0, at="all_reduce", call=3)])
    faults.check_all([faults.exit(rank=1, at="all_reduce", call=2), faults.delay(1, "all_reduce", 1, call=1)])


FAULTS_MISUSED = """
import pytest, torch
import torch.distributed as dist

import pytest_ddp
from pytest_ddp import faults


# Rank 1 is killed at its barrier, so its all_reduce (another operation) never comes.
@pytest.mark.ddp(
    world_size=2, faults=[faults.kill(rank=1, at="barrier"), faults.raise_(rank=1, at="all_reduce")]
)
def test_after_a_kill(rank):
    if rank == 1:
        dist.barrier()
        dist.all_reduce(torch.ones(1))


def reduce_twice(rank):
    for _ in range(2):
        dist.all_reduce(torch.ones(1))


def test_run_with_a_fault_that_never_fires():
    never = [faults.delay(rank=0, at="all_reduce", seconds=0, call=3)]
    result = pytest_ddp.run(reduce_twice, world_size=2, faults=never)
    assert result.outcome == "failed"
    assert result.diagnosis is not None
    assert result.diagnosis.text.startswith(
        "injected faults never fired: delay of 0 s on rank 0 at all_reduce call 3 [ddp failed]"
    ), result.diagnosis.text
"""


def test_a_fault_that_never_fired_fails_its_test_saying_why(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_misused=FAULTS_MISUSED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    # The headline is cut at 200 characters (tag kept); the whole lead is in the body.
    result.stdout.fnmatch_lines(
        [
            "injected faults never fired: raise RuntimeError(*) on rank 1 at all_reduce call 1 * [[]ddp failed*]",
            "the headline in full:",
            "*injected faults never fired: raise RuntimeError(*) on rank 1 at all_reduce call 1 "
            "(never reached: SIGKILL on rank 1 at barrier call 1 ended the rank first)*",
        ]
    )


# -- a test no rank ran to its end ---------------------------------------------------------


def ended(rank: int, action: str, exit_code: int) -> RankState:
    """A rank whose process an injected fault ended, before its test's end."""
    state = RankState(rank=rank, alive=False, exit_code=exit_code, phase="call", died_at=0.0)
    fault = faults.kill(rank, "all_reduce") if action == "kill" else faults.exit(rank, "all_reduce", code=exit_code)
    state.injected.append(Injected(str(fault), action, "all_reduce", 1, "t.py:5"))
    return state


def passed(rank: int) -> RankState:
    return RankState(rank=rank, phase="finished", finished_at=0.0)


def test_a_test_whose_every_rank_an_injected_fault_ended_fails() -> None:
    verdict = wording.worded(
        watchdog.judge(
            Snapshot(now=1.0, started=0.0, timeout=60, grace=2, ranks=[ended(0, "kill", -9), ended(1, "exit", 0)])
        ),
        [ended(0, "kill", -9), ended(1, "exit", 0)],
    )
    assert (verdict.status, verdict.kind, verdict.culprits) == ("done", "rank_exited", [0, 1])
    assert verdict.summary == (
        "no rank ran the test to its end: injected faults ended every rank: rank 0 died (killed by SIGKILL); "
        "rank 1 died (exit code 0)."
    )
    # A survivor that ran the test to its end: the test passes, as docs/faults.md says.
    survived = watchdog.judge(
        Snapshot(now=1.0, started=0.0, timeout=60, grace=2, ranks=[ended(0, "kill", -9), passed(1)])
    )
    assert (survived.status, survived.kind) == ("done", None)


ALL_KILLED = """
import pytest, torch
import torch.distributed as dist

import pytest_ddp
from pytest_ddp import faults

BOTH = [faults.kill(rank=0, at="all_reduce"), faults.kill(rank=1, at="all_reduce")]


@pytest.mark.ddp(world_size=2, faults=BOTH)
def test_every_rank_killed(rank):
    dist.all_reduce(torch.ones(1))


@pytest.mark.ddp(world_size=2, faults=[faults.kill(rank=1, at="barrier")])
def test_one_rank_killed_the_other_passes(rank):
    if rank == 1:
        dist.barrier()


def reduce(rank):
    dist.all_reduce(torch.ones(1))
    return rank


def only_rank_1_barriers(rank):
    if rank == 1:
        dist.barrier()
    return rank


def test_run():
    every = pytest_ddp.run(reduce, world_size=2, faults=BOTH)
    assert every.outcome == "failed"
    assert every.diagnosis.kind == "rank_exited"
    assert "no rank ran the test to its end: injected faults ended every rank" in every.diagnosis.text
    one = pytest_ddp.run(only_rank_1_barriers, world_size=2, faults=[faults.kill(rank=1, at="barrier")])
    assert one.outcome == "passed", one.diagnosis
    assert one.injected == ["SIGKILL on rank 1 at barrier call 1"]
"""


def test_a_test_no_rank_ran_to_its_end_fails_and_one_a_survivor_passed_passes(pytester: pytest.Pytester) -> None:
    """Before: a test whose both ranks were killed at their first all_reduce passed."""
    pytester.makepyfile(test_all_killed=ALL_KILLED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "no rank ran the test to its end: injected faults ended every rank: ranks 0, 1 died "
            "(killed by SIGKILL). [[]ddp failed, rank_exited]",
            "injected: SIGKILL on rank 0 at all_reduce call 1 (test_all_killed.py:*)",
            "injected: SIGKILL on rank 1 at all_reduce call 1 (test_all_killed.py:*)",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_all_killed.py::test_every_rank_killed*"])

"""Fault injection: faults checked and named (pure), the watchdog's policy on a rank killed on
purpose (hand-made states), and faults fired on real ranks, reported as injected.  The faults that
replace a call, fired: tests/test_replacing_faults.py."""

from __future__ import annotations

import json
import re

import pytest
from snapshots import NOW, R3, R4, call, killed, ok, rank, snap

import pytest_ddp
from pytest_ddp import faults
from pytest_ddp.common.protocol import Injected
from pytest_ddp.config.spec import RankSpec, SpecError, parse_faults, parse_mark
from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.groups.runner import not_fired
from pytest_ddp.report.failure import injected_lines
from pytest_ddp.report.writable import file_name

# -- declared and checked -------------------------------------------------------------


def test_faults_read_as_the_report_names_them():
    assert str(faults.kill(rank=1, at="all_reduce", call=3)) == "SIGKILL on rank 1 at all_reduce call 3"
    assert str(faults.exit(rank=0, at="barrier", code=2)) == "exit(2) on rank 0 at barrier call 1"
    assert str(faults.raise_(rank=0, at="barrier", exc=ValueError("boom"))) == (
        "raise ValueError('boom') on rank 0 at barrier call 1"
    )
    assert str(faults.delay(rank=2, at="init_process_group", seconds=3)) == (
        "delay of 3 s on rank 2 at init_process_group call 1"
    )
    assert str(faults.hang(rank=1, at="send", call=2)) == "hang on rank 1 at send call 2"
    assert str(faults.oom(rank=1, at="all_reduce", size=2**20)) == (
        "out of memory after 1048576 bytes on rank 1 at all_reduce call 1"
    )
    assert str(faults.disconnect(rank=1, at="all_reduce")) == (
        "connections to its peers broken on rank 1 at all_reduce call 1"
    )
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


def test_raise_without_an_exception_raises_a_runtime_error_naming_the_fault():
    fault = faults.raise_(rank=1, at="barrier", call=2, exc=KeyError)
    assert isinstance(fault.exc, KeyError) and "rank 1 at barrier call 2" in str(fault.exc)
    assert isinstance(faults.raise_(rank=0, at="barrier").exc, RuntimeError)


def test_a_torch_dtype_is_kept_by_name_and_a_list_shape_as_a_tuple():
    torch = pytest.importorskip("torch")
    fault = faults.change(rank=0, at="all_reduce", shape=[2], dtype=torch.float64)
    assert (fault.shape, fault.dtype) == ((2,), "float64")
    assert parse_faults([fault], 2, True) == (fault,)  # checked: a valid change


def test_only_kill_and_exit_end_the_rank():
    deadly = [f.action for f in (faults.kill(0, "barrier"), faults.exit(0, "barrier"), faults.hang(0, "barrier"),
                                 faults.oom(0, "barrier"), faults.disconnect(0, "barrier")) if f.deadly]
    assert deadly == ["kill", "exit"]


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (faults.kill(rank=4, at="all_reduce"), "kill(rank=4, at='all_reduce', call=1): there is no rank 4 in"),
        (faults.kill(rank=-1, at="all_reduce"), "rank must be an int >= 0"),
        (faults.kill(rank=1, at="allreduce"), "'allreduce' is not an operation pytest-ddp records; one of all_reduce"),
        (faults.kill(rank=1, at="all_reduce", call=0), "call must be an int >= 1 (the first call is 1)"),
        (faults.delay(rank=1, at="barrier", seconds=-1), "seconds=-1 must be a number >= 0"),
        (faults.oom(rank=1, at="barrier", size=0), "size=0 must be an int >= 1 (bytes) or None"),
        (faults.kill(rank=1, at="init_process_group"), "use init=False to inject a fault there"),
        ("kill rank 1", "'kill rank 1' is not a fault: make one with pytest_ddp.faults"),
        ([faults.kill(1, "barrier"), faults.hang(1, "barrier")], "two faults on rank 1 at barrier call 1"),
        # the faults that replace a call
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
        (faults.skip(rank=4, at="all_reduce"), "skip(rank=4, at='all_reduce', call=1): there is no rank 4"),
        ([faults.skip(1, "barrier"), faults.extra(1, "barrier")], "two faults on rank 1 at barrier call 1"),
        ([faults.kill(1, "barrier"), faults.skip(1, "barrier", call=2)], "can never fire: SIGKILL on rank 1"),
    ],
)
def test_bad_faults_say_what_is_wrong(declared, message):
    with pytest.raises(SpecError, match="^faults: .*" + re.escape(message)):
        parse_faults(declared if isinstance(declared, list) else [declared], 4, True)


def test_the_mark_takes_faults_checked_before_the_world_size_is_known():
    mark = parse_mark((), {"world_size": [2, 4], "faults": [faults.kill(rank=3, at="barrier")]})
    assert mark.faults == (faults.kill(rank=3, at="barrier"),)
    with pytest.raises(SpecError, match=r"faults: .* must be a list of faults"):
        parse_mark((), {"world_size": 2, "faults": 3})


def test_run_refuses_a_fault_on_a_rank_that_does_not_exist():
    with pytest.raises(ValueError, match=r"run\(\): faults: .*there is no rank 2 in world_size 2"):
        pytest_ddp.run(len, world_size=2, faults=[faults.kill(rank=2, at="barrier")])


# -- the watchdog and the after-test check, on hand-made states --------------------------


def test_peers_of_a_rank_killed_on_purpose_are_not_stopped_before_the_timeout():
    """Gloo wakes some survivors at once and the others at their own timeout: they may recover."""
    survivors = [rank(r, ok("all_reduce", 1, ranks=R4), call("all_reduce", 2, ranks=R4)) for r in (0, 2, 3)]
    dead = killed(1, ok("all_reduce", 1, ranks=R4))
    ranks = [survivors[0], dead, *survivors[1:]]
    assert watchdog.judge(snap(*ranks, timeout=60)).status == "wait"
    at_timeout = watchdog.judge(snap(*ranks, timeout=60, started=NOW - 60))
    assert (at_timeout.status, at_timeout.kind, at_timeout.culprits) == ("deadlock", "rank_exited", [1])


def test_an_unplanned_death_is_still_reported_at_once():
    dead = rank(1, ok("all_reduce", 1, ranks=R4), exit_code=-9)
    survivors = [rank(r, ok("all_reduce", 1, ranks=R4), call("all_reduce", 2, ranks=R4)) for r in (0, 2, 3)]
    verdict = watchdog.judge(snap(survivors[0], dead, *survivors[1:]))
    assert (verdict.status, verdict.culprits) == ("deadlock", [1])


def test_survivors_that_pass_pass_the_test_and_their_sequences_are_compared_alone():
    survivors = [rank(r, ok("all_reduce", 1), ok("all_reduce", 2), finished=True) for r in (0,)]
    dead = killed(1, ok("all_reduce", 1))
    assert watchdog.judge(snap(survivors[0], dead)).status == "done"
    assert watchdog.judge(snap(survivors[0], dead)).kind is None
    # A survivor that failed fails the test, and the killed rank is named first.
    failed = rank(0, ok("all_reduce", 1), call("all_reduce", 2, state="raised"), finished=True,
                  failed="RuntimeError: Connection closed by peer")
    verdict = watchdog.judge(snap(failed, killed(1, ok("all_reduce", 1))))
    assert (verdict.kind, verdict.culprits, verdict.waiting) == ("rank_exited", [1], [0])


def test_a_survivor_recovering_outside_any_collective_is_not_stopped_after_the_grace():
    recovering = rank(0, ok("all_reduce", 1), call("all_reduce", 2, state="raised"))
    verdict = watchdog.judge(snap(recovering, killed(1, ok("all_reduce", 1)), grace=0.1))
    assert verdict.status == "wait"


def test_a_peer_of_a_disconnected_rank_still_in_its_call_is_given_time_to_raise():
    """The disconnected rank and another peer raised first (seen on a loaded machine): without the
    settle time the last would be named waiting for them, which exited."""
    raised = [rank(r, call("all_reduce", 1, ranks=R3, state="raised"), finished=True, failed="Connection closed")
              for r in (1, 2)]
    raised[0].injected.append(Injected("broken", "disconnect", "all_reduce", 1))
    peer = rank(0, call("all_reduce", 1, ranks=R3))
    assert watchdog.Watch().verdict(snap(peer, *raised)) is None


def test_a_declared_fault_that_never_fired_is_named():
    spec = RankSpec(world_size=2, backend="gloo", timeout=10, grace=2,
                    faults=(faults.kill(1, "all_reduce", 3), faults.delay(0, "barrier", 1)))
    states = [RankState(0), killed(1, at="all_reduce", call_number=3)]
    assert not_fired(spec, states) == ["delay of 1 s on rank 0 at barrier call 1"]
    assert injected_lines(states) == ["injected: SIGKILL on rank 1 at all_reduce call 3 (t.py:5)", ""]
    assert injected_lines([RankState(0)]) == []


# -- on real ranks ---------------------------------------------------------------------


def test_faults_fire_only_in_their_test_and_are_reported(ddp_pytester, tmp_path):
    result = ddp_pytester.run(
        """
        from pytest_ddp import faults

        @pytest.mark.ddp(world_size=2, faults=[faults.raise_(rank=1, at="all_reduce", call=2, exc=ValueError)])
        def test_retried(rank):
            dist.all_reduce(torch.ones(1))
            try:
                dist.all_reduce(torch.ones(1))
            except ValueError:  # raised before taking part: the retry is rank 1's all_reduce #2
                dist.all_reduce(torch.ones(1))

        @pytest.mark.ddp(world_size=2)
        def test_same_group_no_fault(rank):
            for _ in range(3):
                dist.all_reduce(torch.ones(1))

        @pytest.mark.ddp(world_size=2, faults=[faults.hang(rank=0, at="barrier", call=2)], timeout=3)
        def test_hang(rank):
            dist.barrier()
            dist.barrier()
        """,
        f"--ddp-report-dir={tmp_path}",
    )
    result.assert_outcomes(passed=2, failed=1)  # the next test on the warm group has no fault
    result.stdout.fnmatch_lines(["injected: hang on rank 0 at barrier call 2 (test_it.py:*)"])
    report = json.loads((tmp_path / f"{file_name('test_it.py::test_hang')}.json").read_text())
    assert (report["kind"], report["culprits"]) == ("timeout", [0])
    assert [i["text"] for i in report["injected"]] == ["hang on rank 0 at barrier call 2"]


def test_a_bad_fault_is_the_error_of_its_test_naming_it_and_nothing_starts(ddp_pytester):
    result = ddp_pytester.run(
        """
        from pytest_ddp import faults

        @pytest.mark.ddp(world_size=2, faults=[faults.kill(rank=2, at="all_reduce")])
        def test_bad():
            pass

        @pytest.mark.ddp(world_size=2, faults=[faults.kill(rank=1, at="allreduce")])
        def test_typo():
            pass

        # Once accepted, and the rank exited 0 (an exit status is the code's low byte).
        @pytest.mark.ddp(world_size=2, faults=[faults.exit(rank=1, at="all_reduce", code=256)])
        def test_exit():
            pass
        """
    )
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_bad *",
        "faults: kill(rank=2, at='all_reduce', call=1): there is no rank 2 in world_size 2*",
        "*ERROR at setup of test_typo *",
        "faults: kill(rank=1, at='allreduce', call=1): 'allreduce' is not*(in @pytest.mark.ddp)",
        "*ERROR at setup of test_exit *",
        "faults: exit(rank=1, at='all_reduce', call=1): code=256 "
        "must be an int from 0 to 255 (an exit status) (in @pytest.mark.ddp)",
    ], consecutive=True)
    result.stdout.no_fnmatch_line("*rank group* started*")


def test_ranks_still_in_their_calls_after_a_disconnect_get_the_grace_not_only_the_settle_time():
    """Its peers raised first: without the settle time the disconnected rank would be named as
    waiting for them.  On a loaded machine it raises last, after the settle time: as for a rank
    killed on purpose, the verdict waits up to the grace for it (and no longer)."""
    peers = [rank(r, call("all_reduce", 1, ranks=R3, state="raised"), finished=True, failed="Connection closed")
             for r in (0, 2)]
    disconnected = rank(1, call("all_reduce", 1, ranks=R3))
    disconnected.injected.append(Injected("broken", "disconnect", "all_reduce", 1))
    watch = watchdog.Watch()
    assert watch.verdict(snap(peers[0], disconnected, peers[1], grace=2)) is None
    later = snap(peers[0], disconnected, peers[1], grace=2)
    later.now += watchdog.SETTLE
    assert watch.verdict(later) is None  # past the settle time, within the grace
    later.now += 2
    assert watch.verdict(later) is not None

"""The culprit's own line (diagnose/own_lines.py and the verdicts' words of it), and the call only
one rank's branch makes (code_ties.one_rank_call, one_rank_branch_tie), on hand-made rank states and
sources."""

from __future__ import annotations

from typing import Any

from snapshots import R3, R4, call, ok, outline, rank, snap, watched

from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.own_lines import raised_at
from pytest_ddp.diagnose.rank_words import how_it_failed, rank_doing
from pytest_ddp.diagnose.state import Call, RankState, Snapshot
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.diagnose.wording import worded


def entry(path: str, line: int) -> dict[str, Any]:
    where = {"path": path, "lineno": line, "message": ""}
    return {"type": "ReprEntry", "data": {"lines": [], "reprfileloc": where}}


def failed_report(*entries: dict[str, Any], location: str = "tests/t.py") -> dict[str, Any]:
    """A failed call report as pytest serializes it (``pytest_report_to_serializable``)."""
    crash = {"message": "KeyError: 'offset'"}
    longrepr = {"reprcrash": crash, "reprtraceback": {"reprentries": list(entries)}}
    return {"outcome": "failed", "data": {"location": [location, 3, "test_x"], "longrepr": longrepr}}


def test_a_raise_is_at_the_innermost_line_of_the_tests_file_in_its_traceback() -> None:
    library = entry("/venv/lib/python3.11/site-packages/torch/nn/module.py", 1700)
    reports = {"call": failed_report(entry("tests/t.py", 12), entry("tests/t.py", 7), library)}
    assert raised_at(reports) == "tests/t.py:7"


def test_a_traceback_written_natively_names_its_line_too() -> None:
    native = {"type": "ReprEntryNative", "data": {"lines": [
        'Traceback (most recent call last):\n', '  File "/src/tests/t.py", line 12, in test_x\n    f()\n',
        '  File "/src/tests/t.py", line 7, in f\n    raise KeyError\n', "KeyError\n",
    ]}}  # fmt: skip
    assert raised_at({"call": failed_report(native)}) == "/src/tests/t.py:7"


def test_a_report_without_a_traceback_in_the_tests_file_names_no_line() -> None:
    assert raised_at({"call": failed_report(entry("other.py", 3))}) is None
    assert raised_at({"setup": {"outcome": "failed", "data": {"longrepr": "fixture 'x' not found"}}}) is None
    assert raised_at({"call": {"outcome": "passed", "data": None}}) is None


def raised(r: int, *calls: Any, line: int = 7, finished: bool = True) -> RankState:
    state = rank(r, *calls, finished=finished, failed="KeyError: 'offset'")
    state.reports["call"] = failed_report(entry("tests/t.py", 12), entry("tests/t.py", line))
    return state


def test_the_rank_that_raised_is_said_with_the_line_it_raised_at() -> None:
    state = raised(1, ok("all_reduce", 1))
    assert how_it_failed(state) == "failed (KeyError: 'offset') at tests/t.py:7"
    waiting = rank(0, ok("all_reduce", 1), call("all_reduce", 2, site="tests/t.py:20"))
    verdict = worded(watchdog.judge(snap(waiting, state)), [waiting, state])
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0])
    assert verdict.summary.startswith("rank 1 failed (KeyError: 'offset') at tests/t.py:7; rank 0 waits in")


def test_ranks_that_failed_alike_lead_with_their_error_and_each_says_its_line_in_its_own() -> None:
    states = [raised(0, line=9), raised(1, line=11)]
    verdict = worded(watchdog.judge(snap(*states)), states)
    assert verdict.summary == "KeyError: 'offset' (ranks 0, 1)."
    assert rank_doing(states[1]) == "finished (failed); last call no collective yet; raised at tests/t.py:11"


EXITS = """
    def test_x(rank):
        for step in range(3):
            if rank == 1 and step == 1:
                os._exit(1)
            dist.all_reduce(torch.ones(4))
"""


def test_a_process_that_exited_between_calls_is_said_with_the_one_exit_its_code_reaches() -> None:
    waiting = rank(0, ok("all_reduce", 1, site="t.py:6"), call("all_reduce", 2, site="t.py:6"))
    gone = rank(1, ok("all_reduce", 1, site="t.py:6"), exit_code=1)
    verdict = watched(snap(waiting, gone), EXITS)
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0])
    assert verdict.summary.startswith("rank 1 died (exit code 1; its code's exit at t.py:5); rank 0 waits")


def test_a_process_killed_by_a_signal_or_whose_code_has_two_exits_is_said_without_one() -> None:
    waiting = rank(0, ok("all_reduce", 1, site="t.py:6"), call("all_reduce", 2, site="t.py:6"))
    killed = rank(1, ok("all_reduce", 1, site="t.py:6"), exit_code=-9)
    assert "its code's exit" not in watched(snap(waiting, killed), EXITS).summary
    second = "        if step > 2:\n            sys.exit(2)\n        dist.all_reduce"
    two = EXITS.replace("        dist.all_reduce", second)
    gone = rank(1, ok("all_reduce", 1, site="t.py:8"), exit_code=1)
    waiting = rank(0, ok("all_reduce", 1, site="t.py:8"), call("all_reduce", 2, site="t.py:8"))
    assert "its code's exit" not in watched(snap(waiting, gone), two).summary


ONE_RANK = """
    def test_x(rank):
        outputs = torch.full((3,), float(rank))
        if {condition}:
            value = metric.compute()
"""


def test_a_call_only_one_ranks_branch_makes_names_that_rank_at_a_tie() -> None:
    for condition in ("rank == 0", "trainer.is_global_zero", "dist.get_rank() == 0 and final"):
        waiting = rank(0, call("all_gather", 1, site="t.py:5"))
        verdict = watched(snap(waiting, rank(1, finished=True)), ONE_RANK.format(condition=condition))
        assert outline(verdict) == ("deadlock", "partial", [0], []), condition
        assert verdict.summary == (
            "rank 0 alone called all_gather #1 (t.py:5), in a branch of the code for one rank (t.py:4); "
            "rank 1 returned from its test without it."
        )


def test_a_branch_of_several_ranks_or_no_source_leaves_the_rank_that_returned_named() -> None:
    waiting = rank(0, call("all_gather", 1, site="t.py:5"))
    for condition in ("rank < 1", "rank != 1", "flag"):
        verdict = watched(snap(waiting, rank(1, finished=True)), ONE_RANK.format(condition=condition))
        assert outline(verdict) == ("deadlock", "partial", [1], [0]), condition
    assert watchdog.judge(snap(waiting, rank(1, finished=True))).culprits == [1]


def test_a_collective_by_name_or_backward_in_one_ranks_branch_names_that_rank_too() -> None:
    # Lightning#16541 (all_gather under is_global_zero), abacus-develop#2557 (an all-reduce under
    # rank 0), pytorch#101294 (summon_full_params on rank 0): the fix takes the call out of the branch.
    waiting = rank(0, call("all_gather", 1, site="t.py:5"))
    for made in ("dist.all_gather(gathered, outputs)", "loss.backward()"):
        source = ONE_RANK.format(condition="rank == 0").replace("metric.compute()", made)
        verdict = watched(snap(waiting, rank(1, finished=True)), source)
        assert outline(verdict) == ("deadlock", "partial", [0], []), made


KEPT = """
    def test_x(rank):
        progress = 0
        for step in range(4):
            if {condition}:
                progress += 1
            if progress {test}:
                gather(torch.tensor([float(rank)]))
"""


def test_a_call_under_a_test_of_a_value_only_its_rank_moves_names_that_rank() -> None:
    # transformers#31532: a progress bar shown on the main process only decides when to evaluate, so
    # only the main process gathers; the other returned without a fault of its own.
    waiting = rank(0, call("all_gather", 1, site="t.py:8"))
    for condition in ("state.is_main_process", "rank == 0"):
        verdict = watched(snap(waiting, rank(1, finished=True)), KEPT.format(condition=condition, test="== 2"))
        assert outline(verdict) == ("deadlock", "partial", [0], []), condition
        assert "in a branch of the code for one rank (t.py:7)" in verdict.summary


def test_a_value_moved_on_another_rank_or_on_every_rank_leaves_the_rank_that_returned_named() -> None:
    # progress == 0: rank 1 gathers at every step while rank 0, whose count moved, stopped: rank 0's
    # code departs, and it returned.
    one = rank(1, call("all_gather", 1, site="t.py:8"))
    verdict = watched(snap(rank(0, finished=True), one), KEPT.format(condition="rank == 0", test="== 0"))
    assert outline(verdict) == ("deadlock", "partial", [0], [1])
    waiting = rank(0, call("all_gather", 1, site="t.py:8"))
    for condition in ("rank < 2", "is_local_main_process", "flag"):
        verdict = watched(snap(waiting, rank(1, finished=True)), KEPT.format(condition=condition, test="== 2"))
        assert outline(verdict) == ("deadlock", "partial", [1], [0]), condition


LOGGED = """
    def log_dict(metrics):
        for name, value in metrics.items():
            dist.all_gather(out, value)


    def test_x(rank):
        res = {}
        if rank == 0:
            res = {"loss": loss}
        log_dict(res)
"""


def test_a_call_in_a_helpers_loop_over_a_value_kept_on_its_rank_names_that_rank() -> None:
    # Lightning#7129: the metrics reduced on rank 0 alone; logging them all-gathers each key.
    waiting = rank(0, call("all_gather", 1, site="t.py:4"))
    waiting.calls[-1].outer = ("t.py:11",)
    verdict = watched(snap(waiting, rank(1, finished=True)), LOGGED)
    assert outline(verdict) == ("deadlock", "partial", [0], [])
    assert "in a branch of the code for one rank (t.py:11)" in verdict.summary
    # kept on rank 1, which did not make the call: the rank that returned is named, as before
    verdict = watched(snap(waiting, rank(1, finished=True)), LOGGED.replace("rank == 0", "rank == 1"))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])


SUBGROUP = """
    def suspend_timeout():
        group = dist.new_group(backend="gloo")
        dist.barrier(group=group)


    def test_x(rank):
        ep_group = dist.new_group([0, 1])
        if {condition}:
            suspend_timeout()
        dist.barrier()
"""


def _subgroup(condition: str) -> Verdict:
    """Ranks 0, 1 in a new_group of every rank, made in a helper; rank 2 in the barrier after."""
    def made(r: int) -> list:
        ep = ok("new_group", 0, ranks=R3, extra={"ranks": [0, 1]}, site="t.py:8")
        if r == 2:
            return [ep, call("barrier", 1, ranks=R3, site="t.py:11")]
        mine = call("new_group", 0, ranks=R3, extra={"ranks": [0, 1, 2]}, site="t.py:3")
        mine.outer = ("t.py:10",)
        return [ep, mine]

    return watched(snap(*(rank(r, *made(r)) for r in range(3))), SUBGROUP.format(condition=condition))


def test_ranks_in_a_call_made_in_a_branch_they_alone_take_are_named() -> None:
    # llm-compressor#2869: a context that makes a new_group of every rank, entered by a subgroup.
    verdict = _subgroup("rank in (0, 1)")
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [2])
    assert verdict.summary.startswith("ranks 0, 1 depart: the ranks disagree on the order of collectives"), (
        verdict.summary)
    assert "Ranks 0, 1' calls are in a branch of the code for them alone (t.py:9)." in verdict.summary
    # a branch rank 2 takes too, or a test of no rank: nothing tells
    for condition in ("rank < 3", "flag"):
        assert outline(_subgroup(condition))[2] == [0, 1, 2], condition


STOPS = """
    def test_x(rank):
        for epoch in range(3):
            model(x).sum().backward()
            if {condition}:
                break
"""


def _step_less_snap(line: int = 4) -> Snapshot:
    """Rank 0 returned after two steps, rank 1 waits in the third's all_reduce, made at ``line``."""
    done = [ok("all_reduce", 1, site=f"t.py:{line}"), ok("all_reduce", 2, site=f"t.py:{line}")]
    one = rank(1, *done, call("all_reduce", 3, site=f"t.py:{line}"))
    return snap(rank(0, *done, finished=True), one)


def _step_less(condition: str) -> Verdict:
    return watched(_step_less_snap(), STOPS.format(condition=condition))


def test_a_rank_that_returned_by_a_break_in_its_own_branch_is_named_alone() -> None:
    # speechbrain#2051: the early stopper, updated on the main process only, stops the main process.
    verdict = _step_less("rank == 0 and epoch == 1")
    assert outline(verdict) == ("deadlock", "partial", [0], [1])
    assert verdict.summary.startswith(
        "rank 0 never called all_reduce #3 (returned from its test by t.py:6 in a branch for it alone)"
    ), verdict.summary


def test_a_rank_that_returned_by_a_break_under_a_test_of_a_value_that_differs_by_rank_is_named() -> None:
    # yolov5#4576: the stop flag is set on rank 0 alone, and the loop breaks on it; a test of the
    # rank that holds on rank 0 (and not on rank 1) is such a test too.
    for condition in ("stop", "rank != 1"):
        code = STOPS.replace("for epoch", "stop = False\n        for epoch").replace(
            "backward()\n", "backward()\n            if rank == 0:\n                stop = epoch == 1\n")
        verdict = watched(_step_less_snap(line=5), code.format(condition=condition))
        assert outline(verdict) == ("deadlock", "partial", [0], [1]), condition
        assert verdict.summary.startswith(
            "rank 0 never called all_reduce #3 (returned from its test by t.py:9 under a test of a value"
            " that differs between ranks (t.py:8))"
        ), verdict.summary


def test_a_break_in_no_ranks_branch_or_another_ranks_leaves_the_step_more_or_less_a_tie() -> None:
    # ``stop`` is alike on every rank here; rank 0 cannot take rank 1's branch, nor rank 0 one
    # whose test fails on it
    for condition in ("epoch == 1 and stop", "rank == 1 and epoch == 1", "rank > 0"):
        assert outline(_step_less(condition))[:3] == ("deadlock", "partial", [0, 1]), condition


def _parted(steps: int, zero: Call, one: Call) -> Snapshot:
    """Two ranks that made ``steps`` all_reduces at t.py:5 together, then parted: rank 0 into
    ``zero``, rank 1 into ``one``."""
    done = [ok("all_reduce", step, site="t.py:5") for step in range(1, steps + 1)]
    return snap(rank(0, *done, zero), rank(1, *done, one))


UNEVEN = """
    def test_x(rank, world_size):
        batches = data[rank::world_size]
        for batch in batches:
            model(batch).sum().backward()
        dist.barrier()
"""


def test_a_rank_a_step_further_in_a_loop_over_its_own_data_is_named() -> None:
    # pytorch#38174: uneven inputs; rank 1 holds a batch more and waits in its gradient all_reduce,
    # rank 0 ran out of batches and returned from its test (the barrier cut) or waits in the barrier.
    even = UNEVEN.replace("data[rank::world_size]", "data")
    verdict = watched(_step_less_snap(line=5), UNEVEN.replace("dist.barrier()", "pass"))
    assert outline(verdict) == ("deadlock", "partial", [1], [])
    assert verdict.summary.startswith(
        "rank 1 called all_reduce #3 (t.py:5), a step more in a loop over values that differ between ranks"
        " (t.py:4); rank 0 returned from its test without it."
    ), verdict.summary
    assert outline(watched(_step_less_snap(line=5), even.replace("dist.barrier()", "pass")))[2] == [0, 1]
    stayed = _parted(2, call("barrier", 3, site="t.py:6"), call("all_reduce", 3, site="t.py:5"))
    verdict = watched(stayed, UNEVEN)
    assert outline(verdict) == ("deadlock", "mismatch", [1], [0])
    assert ("Rank 1's call is in a loop over values that differ between ranks (t.py:4), which rank 0 made a"
            " call in and left: a step more on rank 1.") in verdict.summary
    assert outline(watched(stayed, even))[2] == [0, 1]
    # two ways out of its own the rank that returned may have taken: nothing tells a step more
    two_ways = UNEVEN.replace("dist.barrier()", "pass").replace(
        "backward()\n", "backward()\n            if batch.sum() > 9:\n                return\n"
        "            if batch.mean() > 3:\n                return\n")
    assert outline(watched(_step_less_snap(line=5), two_ways))[2] == [0, 1]


PATIENCE = """
    def test_x(rank):
        bad = 0
        for epoch in range(4):
            model(x).sum().backward()
            metric = [1.0, 0.9, 0.8][epoch] if rank == 0 else 1.0
            bad = 0 if metric < 0.95 else bad + 1
            if bad >= 1:
                break
        dist.barrier()
"""


def test_a_rank_that_broke_out_of_its_peers_loop_on_a_value_that_differs_by_rank_is_named() -> None:
    # transformers#17478: each process's own metric drives its early stopping; rank 1 stops, to the
    # final barrier, while rank 0 trains on.
    stopped = _parted(1, call("all_reduce", 2, site="t.py:5"), call("barrier", 2, site="t.py:10"))
    verdict = watched(stopped, PATIENCE)
    assert outline(verdict) == ("deadlock", "mismatch", [1], [0])
    assert ("Rank 1 left by t.py:9 under a test of a value that differs between ranks (t.py:8), before rank 0's"
            " call.") in verdict.summary
    alike = PATIENCE.replace(" if rank == 0 else 1.0", "")
    assert outline(watched(stopped, alike))[2] == [0, 1]


NEVER_INIT = """
    def test_x(rank):
        if rank == 1:
            return
        dist.init_process_group("gloo")
"""


def test_a_process_that_returned_before_init_by_its_own_branch_says_the_line() -> None:
    # pytorch#41665: the worker node failed at startup and never joined.
    waiting = rank(0, call("init_process_group", 1, site="t.py:5"))
    verdict = watched(snap(waiting, rank(1, finished=True)), NEVER_INIT)
    assert outline(verdict)[:3] == ("deadlock", "init", [1])
    assert verdict.summary.startswith(
        "process 1 returned from its test by t.py:4 in a branch for it alone without calling init_process_group"
    ), verdict.summary


SPLIT = """
    def run_script(world):
        if {condition}:
            return
        partition = world.Split(color=0, key=world.rank)


    def test_x(world):
        run_script(world)
        world.Barrier()
"""


def _left_before(condition: str) -> Verdict:
    """Rank 0 in the Split of run_script, rank 1 in the Barrier after it: both call #1 of the world."""
    zero = rank(0, call("all_gather", 1, site="t.py:5"))
    zero.calls[-1].outer = ("t.py:9",)
    one = rank(1, call("barrier", 1, site="t.py:10"))
    return watched(snap(zero, one), SPLIT.format(condition=condition))


def test_a_rank_that_left_the_function_of_its_peers_call_by_its_own_branch_is_named() -> None:
    # hoomd-blue#54: one rank's script ends before the communicator's Split every rank must make.
    verdict = _left_before("world.rank == 1")
    assert outline(verdict) == ("deadlock", "mismatch", [1], [0])
    assert verdict.summary.startswith("rank 1 departs from rank 0 on collective #1: "), verdict.summary
    assert "Rank 1 left by t.py:4 in a branch for it alone, before rank 0's call." in verdict.summary
    # a test of the rank true on rank 1 alone names it too; a flag alike on every rank is a tie
    assert outline(_left_before("world.rank > 0")) == ("deadlock", "mismatch", [1], [0])
    assert outline(_left_before("done"))[:3] == ("deadlock", "mismatch", [0, 1])


TIE = """
    def test_x(rank):
        dist.all_reduce(t)
        if {condition}:
            dist.all_gather(out, t)
        {after}dist.barrier()
"""


def _tie(condition: str, after: str = "") -> Verdict:
    """Rank 0 in the all_gather of the branch, rank 1 in the barrier: both call #2 of the group."""
    zero = rank(0, ok("all_reduce", 1, site="t.py:3"), call("all_gather", 2, site="t.py:5"))
    one = rank(1, ok("all_reduce", 1, site="t.py:3"), call("barrier", 2, site=f"t.py:{6 + bool(after)}"))
    return watched(snap(zero, one), TIE.format(condition=condition, after=after))


def test_a_tie_where_one_ranks_call_is_in_its_own_branch_names_that_rank() -> None:
    # accelerate#2785: gather_for_metrics under is_main_process meets the others' wait_for_everyone.
    for condition in ("rank == 0", "accelerator.is_main_process"):
        verdict = _tie(condition)
        assert outline(verdict) == ("deadlock", "mismatch", [0], [1]), condition
        assert verdict.summary.startswith("rank 0 departs from rank 1 on collective #2: "), verdict.summary
        assert "Rank 0's call is in a branch of the code for one rank (t.py:4)." in verdict.summary


def test_a_tie_whose_other_call_is_under_a_rank_test_too_stays_a_tie() -> None:
    # if rank == 0: all_gather / else: barrier: each side's code is its own.
    verdict = _tie("rank == 0", after="else:\n            ")
    assert outline(verdict)[:3] == ("deadlock", "mismatch", [0, 1])
    # A branch of several ranks (rank != 1) singles none out.
    assert outline(_tie("rank != 1"))[:3] == ("deadlock", "mismatch", [0, 1])


HELPER = """
    def save_checkpoint(name):
        dist.broadcast_object_list(name, src=0)


    def test_x(rank):
        for epoch in range(2):
            dist.all_reduce(t)
            if {condition}:
                save_checkpoint(epoch)
"""


def test_a_call_in_a_function_called_in_one_ranks_branch_names_that_rank() -> None:
    # speechbrain#2401: a checkpoint's broadcast_object_list, in a hook run on the main process only,
    # meets the other rank's gradient all_reduce; the branch is in the caller's frame, not the call's.
    zero = rank(0, ok("all_reduce", 1, site="t.py:8"), call("broadcast_object_list", 2, site="t.py:3"))
    zero.calls[-1].outer = ("t.py:10",)
    one = rank(1, ok("all_reduce", 1, site="t.py:8"), call("all_reduce", 2, site="t.py:8"))
    verdict = watched(snap(zero, one), HELPER.format(condition="rank == 0"))
    assert outline(verdict) == ("deadlock", "mismatch", [0], [1])
    assert "Rank 0's call is in a branch of the code for one rank (t.py:9)." in verdict.summary
    # Its peer's call under a test of the rank in the caller's frame: each side's code is its own.
    one.calls[-1].outer = ("t.py:10",)
    assert outline(watched(snap(zero, one), HELPER.format(condition="rank == 0")))[2] == [0, 1]
    # Called under a branch of several ranks: a tie, as before.
    one.calls[-1].outer = ()
    assert outline(watched(snap(zero, one), HELPER.format(condition="rank != 1")))[2] == [0, 1]


def test_a_call_more_says_which_of_its_calls_met_the_others_from_another_line() -> None:
    # transformers-bloom-inference#40: rank 0's barrier inside its download block met the others'
    # barrier after it; its own barrier after it then waits alone.
    zero = rank(0, ok("barrier", 1, ranks=R3, site="t.py:3"), call("barrier", 2, ranks=R3, site="t.py:4"))
    returned = [rank(r, ok("barrier", 1, ranks=R3, site="t.py:4"), finished=True) for r in (1, 2)]
    verdict = worded(watchdog.judge(snap(zero, *returned)), [zero, *returned])
    assert outline(verdict) == ("deadlock", "partial", [0], [])
    assert verdict.summary == (
        "rank 0 alone called barrier #2 (t.py:4); its barrier #1 (t.py:3) matched ranks 1, 2's from t.py:4; "
        "ranks 1, 2 returned from their test without it."
    )


RECEIVER = """
    def test_x(rank):
        if {condition}:
            dist.recv(t, src=0)
        dist.barrier()
"""


def test_an_unmatched_receive_in_one_ranks_branch_names_that_rank() -> None:
    # Megatron-Bridge#6025: the evaluation schedule run on the last stage only waits to receive from
    # a stage already in the barrier; hpc/mpifileutils#26 alike, with a third rank in the barrier.
    def pair() -> tuple[RankState, RankState]:
        return rank(0, call("barrier", 1, site="t.py:5")), rank(1, call("recv", 1, peer=0, site="t.py:4"))

    for condition in ("rank == 1", "rank == world_size - 1"):
        verdict = watched(snap(*pair()), RECEIVER.format(condition=condition))
        assert outline(verdict) == ("deadlock", "p2p_unmatched", [1], [0]), condition
        assert verdict.summary == (
            "no send matches rank 1's recv #1 from 0 (t.py:4): rank 0 waits in barrier #1 (t.py:5) for rank 1"
            " instead. Rank 1's call is in a branch of the code for one rank (t.py:3)."
        )
    in_barrier = [rank(r, call("barrier", 1, ranks=R3, site="t.py:5")) for r in (0, 2)]
    three = snap(*in_barrier, rank(1, call("recv", 1, peer=0, ranks=R3, site="t.py:4")))
    assert outline(watched(three, RECEIVER.format(condition="rank == 1")))[1:3] == ("p2p_unmatched", [1])
    # Under a branch of several ranks: a tie, as before.
    assert outline(watched(snap(*pair()), RECEIVER.format(condition="rank != 0")))[2] == [0, 1]


def test_four_ranks_half_of_which_call_keep_the_ranks_that_returned_named() -> None:
    waiting = [rank(r, call("all_reduce", 1, ranks=R4, site="t.py:5")) for r in (0, 1)]
    returned = [rank(r, finished=True) for r in (2, 3)]
    verdict = watched(snap(*waiting, *returned), ONE_RANK.format(condition="rank < 2"))
    assert verdict.culprits == [2, 3]


def test_a_rank_that_returned_says_which_line_its_call_matched_the_others_from() -> None:
    waiting = [
        rank(r, ok("barrier", 1, ranks=R4, site="t.py:3"), call("barrier", 2, ranks=R4, site="t.py:4"))
        for r in (0, 1, 2)
    ]
    skipped = rank(3, ok("barrier", 1, ranks=R4, site="t.py:4"), finished=True)
    verdict = worded(watchdog.judge(snap(*waiting, skipped)), [*waiting, skipped])
    assert outline(verdict) == ("deadlock", "partial", [3], [0, 1, 2])
    assert verdict.summary.startswith(
        "rank 3 never called barrier #2 (returned from its test); its barrier #1 (t.py:4) matched "
        "ranks 0-2's from t.py:3; ranks 0-2 wait in barrier #2 (t.py:4)"
    )


def test_a_rank_outside_any_call_is_said_at_the_line_its_stack_stood_at() -> None:
    running = rank(2)
    doing = "running (call), outside any collective, at t.py:81; last call no collective yet"
    assert rank_doing(running, "t.py:81") == doing
    assert rank_doing(rank(1, finished=True), "t.py:81") == "finished (passed); last call no collective yet"


def test_an_odd_rank_whose_collective_came_from_another_line_is_said_with_both_lines() -> None:
    odd = rank(0, call("all_reduce", 1, ranks=R3, shape=(), site="t.py:9"))
    others = [rank(r, call("all_reduce", 1, ranks=R3, site="t.py:5")) for r in (1, 2)]
    verdict = worded(watchdog.judge(snap(odd, *others)), [odd, *others])
    assert outline(verdict) == ("deadlock", "mismatch", [0], [1, 2])
    assert verdict.summary.endswith(" Rank 0's call came from t.py:9, the others' from t.py:5.")
    same = rank(0, call("all_reduce", 1, ranks=R3, shape=(), site="t.py:5"))
    assert "came from" not in worded(watchdog.judge(snap(same, *others)), [same, *others]).summary
    # Made in a function of the user's (QNLP#5: print_states' gather, called under rank 0's branch).
    odd.calls[0].outer = ("t.py:12", "t.py:20")
    verdict = worded(watchdog.judge(snap(odd, *others)), [odd, *others])
    assert verdict.summary.endswith(" Rank 0's call came from t.py:9 (called at t.py:12), the others' from t.py:5.")


def test_an_odd_rank_that_parted_ways_in_an_earlier_collective_is_said_with_that_call() -> None:
    """cpl-library#7: rank 0's wrapper makes a call, then the library's own, which the others'
    first call met; rank 0's second call meets their barrier."""
    odd = rank(0, ok("all_reduce", 1, ranks=R3, site="t.py:32"), call("all_reduce", 2, ranks=R3, site="t.py:28"))
    others = [rank(r, ok("all_reduce", 1, ranks=R3, site="t.py:28"),
                   call("barrier", 2, ranks=R3, shape=None, site="t.py:36")) for r in (1, 2)]
    verdict = worded(watchdog.judge(snap(odd, *others)), [odd, *others])
    assert outline(verdict) == ("deadlock", "mismatch", [0], [1, 2])
    assert verdict.summary.endswith(" Before, rank 0's all_reduce #1 (t.py:32) met ranks 1, 2's from t.py:28.")
    # parted ways first at the call they disagree on: nothing more to say
    odd.calls[0].site = "t.py:28"
    assert "Before," not in worded(watchdog.judge(snap(odd, *others)), [odd, *others]).summary
    # nor of a collective made after the one they disagree on (a verdict read after the test)
    zero = rank(0, ok("all_reduce", 1, ranks=R3, shape=(2,), site="t.py:10"),
                ok("all_reduce", 2, ranks=R3, site="t.py:30"), finished=True)
    rest = [rank(r, ok("all_reduce", 1, ranks=R3, site="t.py:10"), ok("all_reduce", 2, ranks=R3, site="t.py:28"),
                 finished=True, failed="AssertionError: wrong" if r == 1 else None) for r in (1, 2)]
    verdict = watchdog.judge(snap(zero, *rest))
    assert outline(verdict)[1:3] == ("mismatch", [0]) and "Before," not in verdict.summary

"""The watchdog's verdicts on hand-made snapshots: no processes, every kind."""

from __future__ import annotations

from typing import Any

from snapshots import NOW, R3, R4, call, judge, ok, outline, rank, snap

from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.consistency import compare_sequences as compare_data
from pytest_ddp.diagnose.consistency import difference_line
from pytest_ddp.diagnose.mismatches import new_group_members
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.diagnose.wording import describe_call, rank_list
from pytest_ddp.report.sequences import p2p_table


def compare_sequences(ranks: list[RankState]) -> list[str]:
    return [difference_line(d) for d in compare_data(ranks)]

def barrier(seq: int = 1, **kwargs: Any) -> Call:
    return call("barrier", seq, shape=None, **kwargs)


# -- waiting and passing --------------------------------------------------------


def test_waits_while_a_peer_is_still_on_its_way() -> None:
    verdict = judge(snap(rank(0, barrier()), rank(1)))
    assert verdict == Verdict("wait")


def test_a_collective_everyone_entered_is_just_in_progress() -> None:
    assert judge(snap(rank(0, call("all_reduce", 1)), rank(1, call("all_reduce", 1)))).status == "wait"


def test_all_finished_and_passed_is_done_without_kind() -> None:
    verdict = judge(snap(rank(0, ok("barrier", 1, shape=None), finished=True),
                         rank(1, ok("barrier", 1, shape=None), finished=True)))
    assert outline(verdict) == ("done", None, [], [])


def test_no_deadlock_on_a_subgroup_that_excludes_the_finished_rank() -> None:
    sub = call("all_reduce", 1, group="1", ranks=(0, 1))
    verdict = judge(snap(rank(0, sub), rank(1, ok("all_reduce", 1, group="1", ranks=(0, 1))), rank(2, finished=True)))
    assert verdict.status == "wait"


def test_batch_isend_irecv_is_not_waited_on_as_a_collective() -> None:
    verdict = judge(snap(rank(0, call("batch_isend_irecv", 1, shape=None)), rank(1, finished=True)))
    assert verdict.status == "wait"


def test_a_rank_issuing_asynchronous_work_is_not_blocked_in_it() -> None:
    # The recorder writes an irecv's call before torch returns its work: a rank
    # caught between the two waits for nobody yet, whatever its peer did.
    for pending in (call("irecv", 1, peer=0), call("all_reduce", 1, is_async=True)):
        verdict = judge(snap(rank(0, finished=True), rank(1, pending)))
        assert verdict.status == "wait", pending.op


def test_a_batch_isend_irecv_takes_no_collective_number() -> None:
    # The recorder counts batches apart (they are point-to-point): rank 1's all_reduce is #2.
    batched = [ok("all_reduce", 1), call("batch_isend_irecv", 1, state="ok", shape=None), ok("all_reduce", 2)]
    verdict = judge(snap(rank(0, ok("all_reduce", 1), call("all_reduce", 2)), rank(1, *batched, finished=True)))
    assert verdict.status == "wait"


def test_a_rank_out_of_the_test_is_never_blocked_whatever_its_log_says() -> None:
    # Rank 0's log lost the return of its all_reduce; its test is over all the same.
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=R3), finished=True), rank(1, finished=True), rank(2)))
    assert verdict.status == "wait"


# -- rank_exited and partial ----------------------------------------------------


def test_a_rank_that_failed_while_its_peer_waits_is_rank_exited() -> None:
    verdict = judge(snap(rank(0, barrier()), rank(1, finished=True, failed="ValueError: boom")))
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0])
    assert (verdict.collective, verdict.call) == ("barrier", "barrier #1")
    assert verdict.summary == "rank 1 failed (ValueError: boom); rank 0 waits in barrier #1 (t.py:11) for rank 1."


def test_a_call_that_raised_does_not_count_as_arrived() -> None:
    unpicklable = call("all_gather_object", 3, state="raised", shape=None,
                       error="TypeError: cannot pickle '_thread.lock' object")
    waiting = [rank(r, call("all_gather_object", 3, shape=None, ranks=R4)) for r in (1, 2, 3)]
    verdict = judge(snap(rank(0, unpicklable, finished=True, failed="TypeError: cannot pickle"), *waiting))
    assert outline(verdict) == ("deadlock", "rank_exited", [0], [1, 2, 3])
    assert verdict.summary == (
        "rank 0 raised TypeError: cannot pickle '_thread.lock' object in all_gather_object #3 (t.py:13); "
        "ranks 1-3 wait in all_gather_object #3 (t.py:13) for rank 0."
    )


def test_a_peer_that_raised_but_still_runs_is_waited_for_then_stopped() -> None:
    raised = call("all_reduce", 1, state="raised", error="RuntimeError: x")
    assert judge(snap(rank(0, call("all_reduce", 1)), rank(1, raised, failed="x", failed_at=NOW - 1))).status == "wait"
    verdict = judge(snap(rank(0, call("all_reduce", 1)), rank(1, raised, failed="x", failed_at=NOW - 3)))
    assert outline(verdict) == ("stopped", "rank_exited", [1], [0])


def test_a_dead_rank_is_rank_exited_with_its_signal() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1)), rank(1, exit_code=-6)))
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0])
    assert verdict.summary.startswith("rank 1 died (killed by SIGABRT); rank 0 waits in all_reduce #1")
    verdict = judge(snap(rank(0, call("all_reduce", 1)), rank(1, exit_code=1)))
    assert verdict.summary.startswith("rank 1 died (exit code 1);")


def test_a_rank_that_died_inside_the_collective_never_completes_it() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1)), rank(1, call("all_reduce", 1), exit_code=-9)))
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0])
    assert "rank 1 died (killed by SIGKILL) in all_reduce #1 (t.py:11)" in verdict.summary


def test_ranks_the_death_woke_with_an_error_are_not_culprits() -> None:
    closed = call("all_reduce", 1, ranks=R3, state="raised", error="RuntimeError: Connection closed by peer")
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=R3)), rank(1, closed, finished=True, failed="closed"),
                         rank(2, exit_code=1)))
    assert outline(verdict) == ("deadlock", "rank_exited", [2], [0])
    assert verdict.summary.startswith("rank 2 died (exit code 1); rank 1 raised RuntimeError: Connection closed")


def test_a_rank_that_raised_inside_and_died_on_its_own_is_a_culprit() -> None:
    # No other rank died: nothing broke the collective for rank 1, its error is its own.
    raised = call("all_reduce", 1, ranks=R3, state="raised", error="TypeError: bad")
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=R3)), rank(1, raised, exit_code=-6),
                         rank(2, finished=True)))
    assert outline(verdict) == ("deadlock", "rank_exited", [1, 2], [0])
    # Another rank died outside the collective: rank 1 is its victim even though it died too.
    raised = call("all_reduce", 1, ranks=R3, state="raised", error="RuntimeError: Connection closed by peer")
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=R3)), rank(1, raised, exit_code=-6), rank(2, exit_code=1)))
    assert outline(verdict) == ("deadlock", "rank_exited", [2], [0])


def test_only_ranks_0_and_1_calling_all_reduce_is_partial() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=R4)), rank(1, call("all_reduce", 1, ranks=R4)),
                         rank(2, finished=True), rank(3, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [2, 3], [0, 1])
    assert (verdict.collective, verdict.call) == ("all_reduce", "all_reduce #1")
    assert verdict.summary == (
        "ranks 2, 3 never called all_reduce #1 (returned from their test); "
        "ranks 0, 1 wait in all_reduce #1 (t.py:11) for ranks 2, 3."
    )


def test_one_rank_that_never_comes_is_enough_even_while_another_still_runs() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 2, ranks=R3)), rank(1), rank(2, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [2], [0])
    assert verdict.summary.startswith("rank 2 never called all_reduce #2 (returned from its test);")


def test_a_rank_waiting_on_a_doomed_rank_is_doomed_too() -> None:
    # Rank 1 waits in a barrier of group g for rank 0, which waits in recv #1 from 2 for rank 2, which is gone.
    verdict = judge(snap(rank(0, call("recv", 1, peer=2, ranks=R3)), rank(1, barrier(group="g", ranks=(0, 1))),
                         rank(2, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [2], [0, 1])
    assert verdict.call == "recv #1 from 2"
    assert verdict.summary.startswith("rank 2 never sent to rank 0 (returned from its test);")


def test_the_few_waiting_in_a_collective_most_returned_without_made_a_call_more() -> None:
    # Rank 2 takes one step more: it waits in all_reduce #4, which ranks 0, 1, 3 never call.
    verdict = judge(snap(rank(0, finished=True), rank(1, finished=True),
                         rank(2, call("all_reduce", 4, ranks=R4, site="t.py:9")), rank(3, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [2], [])
    assert verdict.call == "all_reduce #4"
    assert verdict.summary == (
        "rank 2 alone called all_reduce #4 (t.py:9); ranks 0, 1, 3 returned from their test without it."
    )


def test_as_many_returned_as_wait_names_those_that_returned() -> None:
    # Two against two, one against one: a step less on one side is a step more on the other.
    verdict = judge(snap(rank(0, call("all_reduce", 4, ranks=R4)), rank(1, call("all_reduce", 4, ranks=R4)),
                         rank(2, finished=True), rank(3, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [2, 3], [0, 1])
    verdict = judge(snap(rank(0, call("all_reduce", 4)), rank(1, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])


# -- mismatches -----------------------------------------------------------------


def test_different_ops_at_the_same_sequence_number_are_a_mismatch() -> None:
    """Two ranks, two operations: a tie, both named; no operation is taken for the norm."""
    verdict = judge(snap(rank(0, call("all_reduce", 1)), rank(1, call("broadcast", 1, root=0))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])
    assert (verdict.collective, verdict.call) == (None, None)
    assert verdict.summary == (
        "ranks 0, 1 disagree on collective #1: rank 0 all_reduce shapes [[4]] float32, "
        "rank 1 broadcast shapes [[4]] float32 root 0."
    )


def test_different_sizes_are_a_mismatch_naming_both() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, shape=(10,))), rank(1, call("all_reduce", 1, shape=(20,)))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])
    assert (verdict.collective, verdict.call) == ("all_reduce", "all_reduce #1")
    assert verdict.summary == (
        "ranks 0, 1 disagree on all_reduce #1: rank 0 all_reduce shapes [[10]] float32, "
        "rank 1 all_reduce shapes [[20]] float32."
    )


def test_in_a_tie_the_rank_whose_call_departs_from_its_lines_history_is_named_as_likely() -> None:
    # Three steps of [4, 8] from t.py:20 on both ranks; then rank 1 sends a smaller batch.
    history = [ok("all_reduce", seq, shape=(4, 8), site="t.py:20") for seq in (1, 2, 3)]
    verdict = judge(snap(rank(0, *history, call("all_reduce", 4, shape=(4, 8), site="t.py:20")),
                         rank(1, *[ok("all_reduce", seq, shape=(4, 8), site="t.py:20") for seq in (1, 2, 3)],
                              call("all_reduce", 4, shape=(3, 8), site="t.py:20"))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])  # still a tie: said as likely
    assert verdict.summary.startswith(  # the likely rank leads
        "rank 1 likely departs from rank 0 on all_reduce #4: rank 1 all_reduce shapes [[3, 8]] float32, rank 0"
    )
    assert verdict.summary.endswith(
        "Likely rank 1: every earlier call from t.py:20 was all_reduce shapes [[4, 8]] float32, "
        "and rank 1's is the one that departs from it."
    )


def test_in_a_tie_with_no_history_nothing_is_named_as_likely() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, shape=(10,))), rank(1, call("all_reduce", 1, shape=(20,)))))
    assert "Likely" not in verdict.summary
    # Both depart from what their lines made before: nothing tells them apart either.
    both = [ok("all_reduce", 1, shape=(4,), site="t.py:20")]
    verdict = judge(snap(rank(0, *both, call("all_reduce", 2, shape=(5,), site="t.py:20")),
                         rank(1, ok("all_reduce", 1, shape=(4,), site="t.py:20"),
                              call("all_reduce", 2, shape=(6,), site="t.py:20"))))
    assert verdict.kind == "mismatch" and "Likely" not in verdict.summary


def test_a_mismatch_is_seen_even_after_the_peer_died_inside_the_call() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, dtype="float64"), exit_code=-6), rank(1, call("all_reduce", 1))))
    assert (verdict.status, verdict.kind) == ("deadlock", "mismatch")


def test_a_mismatch_is_seen_where_the_rank_that_died_inside_it_is_the_only_one_left_in_it() -> None:
    """Gloo's size check aborted rank 0 inside all_gather #2; rank 1's #2 had returned (FSDP2, a
    loaded machine), and it waits in #3: the mismatch is named, not the death."""
    dead = rank(0, ok("all_gather", 1, shape=(10,)), call("all_gather", 2, shape=(5,)), exit_code=-6)
    returned = [ok("all_gather", 1, shape=(10,)), ok("all_gather", 2, shape=(10,))]
    live = rank(1, *returned, call("all_gather", 3, shape=(5,)))
    verdict = judge(snap(dead, live))
    assert (verdict.status, verdict.kind, verdict.call) == ("deadlock", "mismatch", "all_gather #2")


def test_same_bytes_in_another_shape_is_left_to_complete() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, shape=(2, 5))), rank(1, call("all_reduce", 1, shape=(10,)))))
    assert verdict.status == "wait"


def test_uneven_all_to_all_splits_are_not_a_mismatch() -> None:
    verdict = judge(snap(rank(0, call("all_to_all_single", 1, shape=(3,))),
                         rank(1, call("all_to_all_single", 1, shape=(5,)))))
    assert verdict.status == "wait"


def test_the_odd_call_is_the_culprit_named_by_collective() -> None:
    """Rank 0 alone calls a barrier the others do not: the culprit, and its operation."""
    verdict = judge(snap(rank(0, barrier(ranks=R3)), rank(1, call("all_reduce", 1, ranks=R3)),
                         rank(2, call("all_reduce", 1, ranks=R3))))
    assert outline(verdict) == ("deadlock", "mismatch", [0], [1, 2])
    assert (verdict.collective, verdict.call) == ("barrier", "barrier #1")


def test_the_majority_decides_who_mismatches() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=R3, dtype="float64")),
                         rank(1, call("all_reduce", 1, ranks=R3)), rank(2, call("all_reduce", 1, ranks=R3))))
    assert outline(verdict) == ("deadlock", "mismatch", [0], [1, 2])
    assert "rank 0 all_reduce shapes [[4]] float64, ranks 1, 2 all_reduce shapes [[4]] float32" in verdict.summary


def test_collectives_in_a_different_order_on_two_groups_are_a_mismatch() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, group="a")), rank(1, call("all_reduce", 1, group="b"))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])
    assert verdict.summary.startswith("the ranks disagree on the order of collectives: ")
    assert "rank 1 waits in all_reduce #1 on group b [0, 1] (t.py:11) for rank 0" in verdict.summary


# -- point to point -------------------------------------------------------------


def test_both_ranks_receiving_first_is_a_p2p_cycle() -> None:
    verdict = judge(snap(rank(0, call("recv", 1, peer=1, site="t.py:5")),
                         rank(1, call("recv", 1, peer=0, site="t.py:9"))))
    assert outline(verdict) == ("deadlock", "p2p_cycle", [0, 1], [])
    assert (verdict.collective, verdict.call) == ("recv", "recv #1 from 1")
    assert verdict.summary == (
        "a point-to-point cycle: rank 0 waits in recv #1 from 1 (t.py:5) and rank 1 waits in recv #1 from 0 (t.py:9)."
    )


def test_a_send_its_peer_never_receives_is_unmatched_not_a_cycle() -> None:
    # Rank 0 sends twice; rank 1 received once and went on to a barrier that waits for rank 0.
    verdict = judge(snap(rank(0, ok("send", 1, peer=1, site="t.py:7"), call("send", 2, peer=1, site="t.py:8")),
                         rank(1, ok("recv", 1, peer=0, site="t.py:10"), barrier(site="t.py:11"))))
    assert outline(verdict) == ("deadlock", "p2p_unmatched", [0, 1], [])
    assert verdict.call == "send #2 to 1"
    assert verdict.summary == (
        "no recv matches rank 0's send #2 to 1 (t.py:8): rank 1 waits in barrier #1 (t.py:11) for rank 0 instead."
    )


def test_the_report_lists_the_sends_and_receives_that_do_not_match() -> None:
    states = [rank(0, ok("send", 1, peer=1, site="t.py:7"), call("send", 2, peer=1, site="t.py:8"),
                   ok("send", 1, peer=1, group="g")),
              rank(1, ok("recv", 1, peer=0, site="t.py:10"), barrier(site="t.py:11"), ok("recv", 1, peer=0, group="g"))]
    assert p2p_table(states) == [
        "sends and receives that do not match:",
        "  rank 0 -> rank 1 on WORLD: 2 sends, 1 recv; rank 0 waits in send #2 to 1 (t.py:8)",
    ]  # group g's send and receive match: left out
    assert p2p_table([rank(0, ok("send", 1, peer=1)), rank(1, ok("recv", 1, peer=0))]) == []


def test_a_recv_its_peer_never_sends_to_is_unmatched() -> None:
    # Rank 1 waits to receive; rank 0 went on to an all_reduce without sending.
    verdict = judge(snap(rank(0, call("all_reduce", 1, site="t.py:5")),
                         rank(1, call("recv", 1, peer=0, site="t.py:9"))))
    assert outline(verdict) == ("deadlock", "p2p_unmatched", [0, 1], [])
    assert verdict.summary == (
        "no send matches rank 1's recv #1 from 0 (t.py:9): rank 0 waits in all_reduce #1 (t.py:5) for rank 1 "
        "instead."
    )


def test_a_send_larger_than_its_receives_buffer_names_the_sender() -> None:
    # pytorch#126732: stage 0 widened, its declared output not; Gloo's receive raises on the size.
    def pair(sent: int) -> Verdict:
        receive = call("recv", 1, peer=0, shape=(4,), state="raised", error="size", site="t.py:9")
        return judge(snap(rank(0, call("send", 1, peer=1, shape=(sent,), site="t.py:5")), rank(1, receive)))

    verdict = pair(8)
    assert outline(verdict) == ("deadlock", "mismatch", [0], [1])
    assert "Rank 0 sent 32 bytes where rank 1's receive holds 16" in verdict.summary
    # a shorter message: nothing tells whose size was meant
    assert outline(pair(2))[2] == [0, 1]
    # MPP-LLaVA#25: earlier sends from that line were the buffer's size; this one is longer
    earlier = ok("send", 1, peer=1, shape=(4,), site="t.py:5"), ok("recv", 1, peer=0, shape=(4,), site="t.py:9")
    longer = call("send", 2, peer=1, shape=(8,), site="t.py:5")
    receive = call("recv", 2, peer=0, shape=(4,), state="raised", error="size", site="t.py:9")
    verdict = judge(snap(rank(0, earlier[0], longer), rank(1, earlier[1], receive)))
    assert outline(verdict) == ("deadlock", "mismatch", [0], [1])


def test_a_rank_gloo_aborted_in_an_all_to_all_of_shapes_its_peers_do_not_share_is_a_mismatch() -> None:
    # dion#74: an empty (0, 8) shard among shards of a row each; Gloo aborts the rank on the sizes.
    def a2a(r: int, world: int, shape: tuple[int, ...], state: str = "running", **kwargs: Any) -> RankState:
        chunks = call("all_to_all", 1, ranks=tuple(range(world)), shape=shape, site="t.py:6", state=state)
        chunks.shapes = [list(shape)] * world
        return rank(r, chunks, **kwargs)

    def judged(signal_number: int, world: int = 4) -> Verdict:
        peers = [a2a(r, world, (1, 8)) for r in range(world - 1)]
        return judge(snap(*peers, a2a(world - 1, world, (0, 8), exit_code=-signal_number)))

    assert outline(judged(6)) == ("deadlock", "mismatch", [3], [0, 1, 2])
    # the peers went on: two passed, one raised as the death woke it
    went_on = [a2a(r, 4, (1, 8), state="ok", finished=True) for r in (0, 2)]
    woken = a2a(1, 4, (1, 8), state="raised", finished=True, failed="RuntimeError: Connection reset by peer")
    dead = a2a(3, 4, (0, 8), exit_code=-6)
    assert outline(judge(snap(*went_on, woken, dead)))[:3] == ("done", "mismatch", [3])
    assert outline(judged(9))[1:3] == ("rank_exited", [3])  # killed from outside: it only died
    assert outline(judged(6, world=2))[1] == "rank_exited"  # no majority of shapes: nothing tells


def _new_group(members: list[int], **extra: object) -> Call:
    return ok("new_group", 0, shape=None, ranks=R4, site="t.py:18", extra={"ranks": members, **extra})


def test_a_ranks_new_groups_are_read_anew_as_its_calls_come() -> None:
    # The watchdog reads them each time it looks: only the calls made since are scanned.
    state = rank(0, _new_group([0, 1]), ok("barrier", 1))
    assert len(state.new_groups()) == 1
    state.calls += [_new_group([0, 2]), call("barrier", 2)]
    assert [c.extra["ranks"] for c in state.new_groups()] == [[0, 1], [0, 2]]


def test_ranks_that_passed_new_group_other_members_are_named_once_one_is_blocked() -> None:
    # pytorch#130102: ranks 0 and 3 make new_group([0, 3]), ranks 1 and 2 new_group([1, 2]): torch
    # names both the same group; its barrier hangs (or passes by chance).
    def ranks(barrier: bool, **extra: object) -> list[RankState]:
        def one(r: int) -> RankState:
            members = [0, 3] if r in (0, 3) else [1, 2]
            if not barrier or r not in (0, 3):
                return rank(r, _new_group(members, **extra), finished=True)
            return rank(r, _new_group(members, **extra), call("barrier", 1, group="1", ranks=(0, 3), site="t.py:19"))

        return [one(r) for r in range(4)]

    verdict = judge(snap(*ranks(barrier=True)))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1, 2, 3], [])
    assert verdict.summary == (
        "ranks 0-3 disagree on the members of new_group #1 (t.py:18): ranks 0, 3 passed [0, 3]; ranks 1, 2 passed"
        " [1, 2]. Every rank's new_group #1 is one group to torch, named alike: each rank must pass the same ranks"
        " (use_local_synchronization=True: its members only)."
    )
    # Made by its members only (use_local_synchronization=True): each group is named by its ranks.
    assert judge(snap(*ranks(barrier=True, local=True))).status == "wait"
    # No rank blocked: nothing said while the test runs; once it passed by chance, the test fails.
    assert judge(snap(*ranks(barrier=False), rank(4))).status == "wait"
    passed = {s.rank: s for s in ranks(barrier=False)}
    assert outline(new_group_members("done", passed)) == ("done", "mismatch", [0, 1, 2, 3], [])
    alike = {r: rank(r, _new_group([0, 3]), _new_group([1, 2]), finished=True) for r in range(4)}
    assert new_group_members("done", alike) is None
    # a new_group that raised on its arguments (pytest.raises(ValueError)) made no group
    refused = call("new_group", 0, state="raised", shape=None, ranks=R4, extra={"ranks": [0, 99]})
    checked = {r: rank(r, *([refused] if r == 0 else []), _new_group([0, 3]), finished=True) for r in range(4)}
    assert new_group_members("done", checked) is None
    # One rank of three passed other members: it departs.
    three = [rank(r, _new_group([0, 1, 2] if r < 2 else [0, 1]), call("barrier", 1, ranks=R3)) for r in range(3)]
    assert outline(judge(snap(*three)))[1:3] == ("mismatch", [2])


def test_a_new_group_some_ranks_never_enter_is_certain_once_they_wait_elsewhere() -> None:
    # llm-compressor#2869: ranks 0 and 1 make a new_group of the whole world in a context only they
    # enter; rank 2 waits in the barrier after it.  torch's new_group waits for its members.
    def first() -> Call:
        return ok("new_group", 0, shape=None, ranks=R3, extra={"ranks": [0, 1]})

    def in_new_group(r: int, **extra: object) -> RankState:
        world = {"ranks": [0, 1, 2], **extra}
        return rank(r, first(), call("new_group", 0, shape=None, ranks=R3, site="t.py:3", extra=world))

    barrier = rank(2, first(), call("barrier", 1, ranks=R3, site="t.py:9"))
    verdict = judge(snap(in_new_group(0), in_new_group(1), barrier))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1, 2], [])  # no order of collectives tells who
    assert "rank 2 waits in barrier #1 (t.py:9) for ranks 0, 1" in verdict.summary
    # Rank 2 still running: it may yet come.
    assert judge(snap(in_new_group(0), in_new_group(1), rank(2, first()))).status == "wait"
    # Made by its members only (use_local_synchronization=True): it waits for nobody else.
    assert judge(snap(in_new_group(0, local=True), in_new_group(1, local=True), barrier)).status == "wait"
    # A new group of ranks 0, 1 only: torch waits for its members, not for rank 2 (no barrier by default).
    pair = {"ranks": [0, 1]}
    members = [rank(r, first(), call("new_group", 0, shape=None, ranks=R3, site="t.py:3", extra=pair)) for r in (0, 1)]
    assert judge(snap(*members, barrier)).status == "wait"


def test_a_send_or_recv_to_no_rank_of_its_group_is_unmatched_at_once() -> None:
    # ADIOS2#3345: the ring's rank 0 receives from rank - 1, which is -1; the last rank's send to it
    # waits behind it.  Gloo waits for rank -1's address until the group's timeout (measured).
    zero = rank(0, ok("send", 1, peer=1, ranks=R3, site="t.py:4"), call("recv", 1, peer=-1, ranks=R3, site="t.py:5"))
    one = rank(1, ok("recv", 1, peer=0, ranks=R3), ok("send", 1, peer=2, ranks=R3), finished=True)
    two = rank(2, ok("recv", 1, peer=1, ranks=R3), call("send", 1, peer=0, ranks=R3, site="t.py:8"))
    verdict = judge(snap(zero, one, two))
    assert outline(verdict) == ("deadlock", "p2p_unmatched", [0], [2])
    assert verdict.summary == (
        "rank 0 waits in recv #1 from -1 (t.py:5), a rank its group (ranks 0-2) does not have: no call can"
        " match it (Gloo waits for that rank until the group's timeout); rank 2 waits in send #1 to 0 (t.py:8)."
    )
    # A send to the world size, past the last rank, alike.
    past = rank(1, call("send", 1, peer=2, site="t.py:6"))
    assert outline(judge(snap(rank(0, call("barrier", 1)), past)))[1:3] == ("p2p_unmatched", [1])


def test_the_cycle_not_the_ranks_behind_it_decides_the_kind() -> None:
    # Ranks 0 and 1 disagree on the order of collectives on groups a and b; rank 2 waits for rank 0 to send.
    verdict = judge(snap(rank(0, call("all_reduce", 1, group="a")), rank(1, call("all_reduce", 1, group="b")),
                         rank(2, call("recv", 1, peer=0, ranks=R3))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [2])


def test_a_rank_waiting_behind_a_cycle_is_waiting_not_a_culprit() -> None:
    verdict = judge(snap(rank(0, call("recv", 1, peer=1, ranks=R3)), rank(1, call("recv", 1, peer=0, ranks=R3)),
                         rank(2, barrier(ranks=R3))))
    assert outline(verdict) == ("deadlock", "p2p_cycle", [0, 1], [2])
    assert verdict.call == "barrier #1"


def test_a_matching_send_unblocks_a_recv() -> None:
    assert judge(snap(rank(0, call("recv", 1, peer=1)), rank(1, call("send", 1, peer=0)))).status == "wait"


def test_the_kth_recv_pairs_with_the_kth_send() -> None:
    second = [ok("recv", 1, peer=1), call("recv", 2, peer=1)]
    assert judge(snap(rank(0, *second), rank(1, ok("send", 1, peer=0), ok("send", 2, peer=0)))).status == "wait"
    second = [ok("recv", 1, peer=1), call("recv", 2, peer=1)]
    verdict = judge(snap(rank(0, *second), rank(1, ok("send", 1, peer=0), finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])


def test_a_send_waits_for_its_receiver() -> None:
    verdict = judge(snap(rank(0, call("send", 1, peer=1)), rank(1, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])
    assert verdict.summary.startswith("rank 1 never received from rank 0 (returned from its test);")


def test_recv_from_any_source_pairs_with_any_send() -> None:
    assert judge(snap(rank(0, call("recv", 1, peer=None)), rank(1, call("send", 1, peer=0)))).status == "wait"


def test_recv_from_any_source_is_stuck_only_when_every_sender_is_gone() -> None:
    assert judge(snap(rank(0, call("recv", 1, peer=None, ranks=R3)), rank(1, finished=True), rank(2))).status == "wait"
    verdict = judge(snap(rank(0, call("recv", 1, peer=None, ranks=R3)), rank(1, finished=True), rank(2, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1, 2], [0])
    assert "rank 0 waits in recv #1 from any (t.py:11) for any of ranks 1, 2" in verdict.summary


def test_a_second_recv_from_any_source_needs_a_second_send() -> None:
    calls = [ok("recv", 1, peer=None), call("recv", 2, peer=None)]
    verdict = judge(snap(rank(0, *calls), rank(1, ok("send", 1, peer=0), finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])


def test_recv_from_any_source_after_an_irecv_is_never_certain() -> None:
    calls = [ok("irecv", 1, peer=None, is_async=True), call("recv", 2, peer=None)]
    assert judge(snap(rank(0, *calls), rank(1, ok("send", 1, peer=0), finished=True))).status == "wait"


# -- init -----------------------------------------------------------------------


def init(given: int, size: int = 2, state: str = "running", error: str | None = None, enter: float = NOW - 1) -> Call:
    return call("init_process_group", 0, shape=None, state=state, error=error, enter=enter, site="t.py:5",
                extra={"rank": given, "world_size": size, "init_method": "env://"})


def test_init_duplicate_rank_blames_the_process_that_took_another_rank() -> None:
    verdict = judge(snap(rank(0, init(0, 3)), rank(1, init(1, 3, enter=NOW - 1)), rank(2, init(1, 3, enter=NOW - 2))))
    assert outline(verdict) == ("deadlock", "init", [2], [0, 1])
    assert (verdict.collective, verdict.call) == ("init_process_group", "init_process_group")
    assert verdict.summary == (
        "process 2 passed rank 1, as process 1 did, to init_process_group; "
        "processes 0-2 wait in init_process_group (t.py:5)."
    )


def test_init_local_ranks_passed_as_ranks_on_two_nodes_blame_every_process_that_took_another_rank() -> None:
    """pytorch#23074: two nodes of two processes each pass their local rank, 0 and 1 are claimed
    twice: processes 2 and 3 are at fault, both."""
    inits = [rank(r, init(r % 2, 4, enter=NOW - 1 + r / 10)) for r in range(4)]
    verdict = judge(snap(*inits))
    assert outline(verdict) == ("deadlock", "init", [2, 3], [0, 1])
    assert verdict.summary.startswith(
        "process 2 passed rank 0, as process 0 did; process 3 passed rank 1, as process 1 did, to init_process_group;"
    )


def test_init_duplicate_rank_otherwise_blames_the_later_one() -> None:
    verdict = judge(snap(rank(0, init(1, enter=NOW - 1)), rank(1, init(1, enter=NOW - 2))))
    assert (verdict.kind, verdict.culprits) == ("init", [0])


def test_init_after_a_death_a_survivor_may_take_the_dead_process_rank_and_a_smaller_world() -> None:
    """docs/faults.md's elastic loop: process 1 was killed; the survivors join again in a world
    of 3, process 2 now rank 1.  Seen while they are still in init_process_group, that is no
    duplicate (process 1 holds no rank) and no world sizes that differ (its 4 is gone with it)."""
    dead = rank(1, ok("init_process_group", 0, shape=None, site="t.py:5",
                      extra={"rank": 1, "world_size": 4, "init_method": "env://"}), exit_code=-9)
    survivors = [rank(0, init(0, 3)), rank(2, init(1, 3)), rank(3, init(2, 3))]
    assert judge(snap(survivors[0], dead, *survivors[1:])).status == "wait"


def test_init_world_sizes_tied_after_a_death_match_the_live_processes() -> None:
    """Three live processes of four: 3 and 4 tied, the 3 that matches them wins."""
    dead = rank(1, ok("init_process_group", 0, shape=None, site="t.py:5",
                      extra={"rank": 1, "world_size": 4, "init_method": "env://"}), exit_code=-9)
    verdict = judge(snap(rank(0, init(0, size=3, enter=NOW - 2)), dead, rank(2, init(1, size=4)), rank(3)))
    assert (verdict.kind, verdict.culprits) == ("init", [2])


def test_init_rank_out_of_range() -> None:
    out = init(2, state="raised", error="RuntimeError: rank < size. 2 vs 2")
    verdict = judge(snap(rank(0, init(0)), rank(1, out, finished=True, failed="RuntimeError")))
    assert outline(verdict) == ("deadlock", "init", [1], [0])
    assert verdict.summary.startswith("process 1 passed rank 2, out of range for world_size 2, to init_process_group;")


def test_init_world_sizes_that_disagree_blame_the_minority() -> None:
    verdict = judge(snap(rank(0, init(0, size=3)), rank(1, init(1, size=4)), rank(2, init(2, size=3))))
    assert (verdict.kind, verdict.culprits) == ("init", [1])
    assert "processes 0, 2 passed 3, process 1 passed 4" in verdict.summary


def test_init_world_sizes_tied_blame_the_one_that_does_not_match_the_processes() -> None:
    verdict = judge(snap(rank(0, init(0, size=3, enter=NOW - 2)), rank(1, init(1, size=2))))
    assert (verdict.kind, verdict.culprits) == ("init", [0])


def test_init_that_raised_while_others_wait() -> None:
    broken = init(1, state="raised", error="DistNetworkError: EADDRINUSE")
    verdict = judge(snap(rank(0, init(0)), rank(1, broken, finished=True, failed="DistNetworkError")))
    assert (verdict.kind, verdict.culprits) == ("init", [1])
    assert "process 1 raised DistNetworkError: EADDRINUSE in init_process_group (t.py:5)" in verdict.summary


def test_init_duplicates_that_both_raised_are_judged_by_their_errors() -> None:
    first = init(1, 3, state="raised", error="RuntimeError: a")
    second = init(1, 3, state="raised", error="RuntimeError: b")
    verdict = judge(snap(rank(0, init(0, 3)), rank(1, first, finished=True), rank(2, second, finished=True)))
    assert (verdict.kind, verdict.culprits) == ("init", [1, 2])
    assert verdict.summary.startswith("process 1 raised RuntimeError: a in init_process_group (t.py:5); process 2")


def test_init_a_rank_that_never_arrives() -> None:
    verdict = judge(snap(rank(0, init(0)), rank(1, finished=True)))
    assert outline(verdict) == ("deadlock", "init", [1], [0])
    assert verdict.summary.startswith("process 1 returned from its test without calling init_process_group;")


def test_init_slow_starter_is_waited_for() -> None:
    assert judge(snap(rank(0, init(0)), rank(1))).status == "wait"


# -- grace, timeout -------------------------------------------------------------


def test_grace_then_stop_after_a_failure() -> None:
    assert judge(snap(rank(0), rank(1, finished=True, failed="ValueError: boom", failed_at=NOW - 1))).status == "wait"
    verdict = judge(snap(rank(0), rank(1, finished=True, failed="ValueError: boom", failed_at=NOW - 3)))
    assert outline(verdict) == ("stopped", "rank_exited", [1], [0])
    assert verdict.summary == "rank 1 failed (ValueError: boom); 2 s later rank 0 is running outside any collective."


def test_a_failed_rank_alone_in_its_teardown_is_left_to_the_timeout() -> None:
    verdict = judge(snap(rank(0, finished=True), rank(1, failed="ValueError: boom", failed_at=NOW - 30)))
    assert verdict.status == "wait"


def test_timeout_names_the_running_rank_others_wait_for() -> None:
    verdict = judge(snap(rank(0, barrier(site="t.py:7")), rank(1), timeout=5, started=NOW - 6))
    assert outline(verdict) == ("timeout", "timeout", [1], [0])
    assert (verdict.collective, verdict.call) == ("barrier", "barrier #1")
    assert verdict.summary == (
        "timed out after 5 s: rank 1 is running outside any collective; rank 0 waits in barrier #1 (t.py:7) for rank 1."
    )


def test_timeout_leaves_out_running_ranks_nobody_waits_for() -> None:
    sub = call("all_reduce", 1, group="g", ranks=(0, 1))
    verdict = judge(snap(rank(0, sub), rank(1), rank(2), timeout=5, started=NOW - 6))
    assert outline(verdict) == ("timeout", "timeout", [1], [0])


def test_timeout_without_anyone_awaited_blames_every_unfinished_rank() -> None:
    # Rank 2 joined and finished (as if its init had not needed the others): nobody is awaited.
    both_in_init = snap(rank(0, init(0, 3)), rank(1, init(1, 3)), rank(2, init(2, 3, state="ok"), finished=True),
                        timeout=5, started=NOW - 6)
    verdict = judge(both_in_init)
    assert outline(verdict) == ("timeout", "timeout", [0, 1], [0, 1])
    assert verdict.summary == "timed out after 5 s: ranks 0, 1 wait in init_process_group (t.py:5)."


def test_a_certain_deadlock_wins_over_the_timeout() -> None:
    verdict = judge(snap(rank(0, barrier()), rank(1, finished=True), timeout=5, started=NOW - 6))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])


# -- done with failures ---------------------------------------------------------


def test_finished_ranks_that_disagreed_on_a_collective_are_a_mismatch() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, shape=(10,)), exit_code=-6),
                         rank(1, call("all_reduce", 1, shape=(20,), state="raised", error="RuntimeError: reset"),
                              finished=True, failed="RuntimeError: reset")))
    assert outline(verdict) == ("done", "mismatch", [0, 1], [])


def test_a_dead_rank_after_the_test_is_rank_exited_with_the_ranks_it_woke() -> None:
    closed = call("all_reduce", 1, state="raised", error="RuntimeError: Connection closed by peer")
    verdict = judge(snap(rank(0, closed, finished=True, failed="RuntimeError"),
                         rank(1, call("all_reduce", 1), exit_code=1)))
    assert outline(verdict) == ("done", "rank_exited", [1], [0])
    assert verdict.summary == (
        "rank 1 died (exit code 1) in all_reduce #1 (t.py:11); "
        "then rank 0 raised RuntimeError: Connection closed by peer in all_reduce #1 (t.py:11)."
    )


def test_ordinary_failures_are_failed() -> None:
    verdict = judge(snap(rank(0, finished=True, failed="AssertionError: x"), rank(1, finished=True),
                         rank(2, finished=True, failed="AssertionError: x")))
    assert outline(verdict) == ("done", "failed", [0, 2], [])
    assert verdict.summary == "AssertionError: x (ranks 0, 2)."


def test_the_error_of_a_run_result_is_read_too() -> None:
    state = rank(0, finished=True)
    state.failed_at = NOW - 1
    state.reports["call"] = {"outcome": "failed", "data": {"exception": "KeyError: 'lr'", "traceback": "..."}}
    assert judge(snap(state, rank(1, finished=True))).summary == "KeyError: 'lr' (rank 0)."


# -- compare_sequences ------------------------------------------------------------


def test_sequences_that_agree() -> None:
    same = [rank(r, ok("all_reduce", 1), ok("barrier", 2, shape=None)) for r in (0, 1)]
    assert compare_sequences(same) == []


def test_sequences_that_differ_in_shape() -> None:
    ranks = [rank(0, ok("all_reduce", 1, shape=(2, 5))), rank(1, ok("all_reduce", 1, shape=(10,)))]
    assert compare_sequences(ranks) == [
        "group WORLD, collective #1: rank 0 all_reduce shapes [[2, 5]] float32 (t.py:11) "
        "vs rank 1 all_reduce shapes [[10]] float32 (t.py:11)"
    ]


def test_sequences_that_differ_in_count() -> None:
    ranks = [rank(0, ok("all_reduce", 1), ok("all_reduce", 2)), rank(1, ok("all_reduce", 1))]
    assert compare_sequences(ranks) == ["group WORLD: rank 0 made 2 collectives, rank 1 made 1 collective"]


def test_sequences_report_each_rank_s_first_difference_only() -> None:
    ranks = [rank(0, ok("all_reduce", 1), ok("broadcast", 2, root=0)),
             rank(1, ok("broadcast", 1, root=0), ok("all_reduce", 2))]
    differences = compare_sequences(ranks)
    assert len(differences) == 1 and differences[0].startswith("group WORLD, collective #1: rank 0 all_reduce")


def test_point_to_point_and_uneven_all_to_all_are_exempt() -> None:
    p2p = [rank(0, ok("send", 1, peer=1)), rank(1, ok("recv", 1, peer=0))]
    assert compare_sequences(p2p) == []
    uneven = [rank(0, ok("all_to_all_single", 1, shape=(3,))), rank(1, ok("all_to_all_single", 1, shape=(5,)))]
    assert compare_sequences(uneven) == []


def test_sequences_compare_only_the_members_of_a_group() -> None:
    sub = dict(group="g", ranks=(0, 1))
    ranks = [rank(0, ok("all_reduce", 1, **sub)), rank(1, ok("all_reduce", 1, **sub)), rank(2)]
    assert compare_sequences(ranks) == []
    ranks = [rank(0, ok("all_reduce", 1, **sub)), rank(1), rank(2)]
    assert compare_sequences(ranks) == ["group g: rank 0 made 1 collective, rank 1 made 0 collectives"]


# -- phrases ----------------------------------------------------------------------


def test_rank_list() -> None:
    assert rank_list([2]) == "rank 2"
    assert rank_list([0, 3]) == "ranks 0, 3"
    assert rank_list([3, 1, 2]) == "ranks 1-3"
    assert rank_list([0, 1, 2, 3, 6, 8, 9]) == "ranks 0-3, 6, 8, 9"
    assert rank_list([1, 2], noun="process") == "processes 1, 2"


def test_describe_call() -> None:
    assert describe_call(call("all_reduce", 3, site="test_x.py:12")) == "all_reduce #3 (test_x.py:12)"
    assert describe_call(init(0)) == "init_process_group (t.py:5)"


# -- monitored_barrier ----------------------------------------------------------

SLOW_RANK_1 = (
    "RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms\n Original exception: \n"
    "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation to complete"
)


def test_a_monitored_barrier_timeout_names_the_slow_rank_not_the_one_that_waited() -> None:
    """Rank 1 slept past rank 0's monitored_barrier timeout; torch's message names rank 1."""
    waited = call("monitored_barrier", 1, shape=None, state="raised", error=SLOW_RANK_1)
    verdict = judge(snap(rank(0, waited, finished=True, failed=SLOW_RANK_1, failed_at=NOW - 3), rank(1), grace=2,
                         started=NOW - 10))
    assert outline(verdict) == ("stopped", "timeout", [1], [0])
    assert (verdict.collective, verdict.call) == ("monitored_barrier", "monitored_barrier #1")
    assert verdict.summary == (
        "rank 0's monitored_barrier #1 (t.py:11) timed out: torch names rank 1 as not arriving in time."
    )


def test_a_monitored_barrier_timeout_once_every_rank_finished() -> None:
    late = call("monitored_barrier", 1, shape=None, state="raised", error="RuntimeError: Connection closed by peer")
    verdict = judge(snap(
        rank(0, call("monitored_barrier", 1, shape=None, state="raised", error=SLOW_RANK_1), finished=True,
             failed=SLOW_RANK_1),
        rank(1, late, finished=True, failed="RuntimeError: Connection closed by peer"),
    ))
    assert outline(verdict) == ("done", "timeout", [1], [0])
    assert "\n" not in verdict.summary
    assert verdict.summary.endswith(
        "rank 1 raised RuntimeError: Connection closed by peer in monitored_barrier #1 (t.py:11)."
    )


def _left_a_group_of(timeout: float, entered: float) -> Verdict | None:
    """Rank 0 gave up on barrier #1 of group 1 and returned; rank 1 entered it ``entered`` s ago.
    Group 1 is the test's first new_group, made with ``timeout`` seconds."""
    made = ok("new_group", 1, extra={"ranks": [0, 1], "timeout": timeout})
    zero = rank(0, made, call("barrier", 1, group="1", state="raised"), finished=True)
    one = rank(1, made, call("barrier", 1, group="1", enter=NOW - entered))
    return watchdog.Watch().verdict(snap(zero, one))


def test_a_call_a_short_group_timeout_will_raise_is_waited_for_not_called_a_deadlock() -> None:
    # torch's test_barrier_timeout_full_group: a barrier of a group of 0.5 s that its peer left
    # raises by itself, as the test expects; Gloo's timeout, not a hang.
    assert _left_a_group_of(0.5, entered=0.1) is None
    assert _left_a_group_of(0.5, entered=0.5 + watchdog.SETTLE / 2) is None  # past it, in the settle time
    late = _left_a_group_of(0.5, entered=0.5 + watchdog.SETTLE + 0.1)  # past both: it did not raise
    assert late is not None and outline(late)[:3] == ("deadlock", "partial", [0])
    # A timeout of minutes, as training code gives, is not waited for.
    minutes = _left_a_group_of(1800, entered=0.1)
    assert minutes is not None and outline(minutes)[:3] == ("deadlock", "partial", [0])

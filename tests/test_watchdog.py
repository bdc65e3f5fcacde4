"""The watchdog's verdicts on hand-made snapshots: no processes, every kind."""

from __future__ import annotations

from pytest_ddp.state import Call, RankState, Snapshot
from pytest_ddp.watchdog import compare_sequences, judge, rank_list

NOW = 1000.0


def call(op: str, seq: int, *, state: str = "running", group: str = "WORLD", ranks=(0, 1), shape=(4,),
         dtype: str = "float32", peer: int | None = None, root: int | None = None, error: str | None = None,
         extra: dict | None = None, index: int = 0, enter: float = NOW - 1) -> Call:
    c = Call(index=index, op=op, group=group, group_ranks=tuple(ranks), seq=seq, site=f"t.py:{10 + seq}",
             enter=enter, shapes=[list(shape)] if shape else [], dtypes=[dtype] if shape else [], peer=peer,
             root=root, extra=extra or {})
    if state != "running":
        c.exit = enter + 0.1
        c.error = error if state == "raised" else None
    return c


def rank(r: int, *calls: Call, finished: bool = False, failed: bool = False, alive: bool = True,
         exit_code: int | None = None) -> RankState:
    state = RankState(rank=r, phase="call")
    for i, c in enumerate(calls):
        c.index = i
        state.calls.append(c)
    if finished:
        state.phase, state.finished_at = "finished", NOW - 0.5
    if failed:
        state.failed_at = NOW - 0.5
        state.reports["call"] = {"outcome": "failed", "data": {"longrepr": {"reprcrash": {"message": "ValueError: boom"}}}}
    if not alive:
        state.mark_dead(exit_code if exit_code is not None else 1, NOW - 0.5)
    return state


def snap(*ranks: RankState, timeout: float = 60, grace: float = 2, started: float = NOW - 1) -> Snapshot:
    return Snapshot(now=NOW, started=started, timeout=timeout, grace=grace, ranks=list(ranks))


def test_waits_while_a_peer_is_still_on_its_way() -> None:
    assert judge(snap(rank(0, call("barrier", 1, shape=None)), rank(1))).status == "wait"


def test_all_finished_and_passed_is_done_without_kind() -> None:
    verdict = judge(snap(rank(0, call("barrier", 1, state="ok", shape=None), finished=True),
                         rank(1, call("barrier", 1, state="ok", shape=None), finished=True)))
    assert (verdict.status, verdict.kind) == ("done", None)


def test_a_rank_that_raised_while_its_peer_waits_is_rank_exited() -> None:
    verdict = judge(snap(rank(0, call("barrier", 1, shape=None)), rank(1, finished=True, failed=True)))
    assert (verdict.status, verdict.kind, verdict.culprits, verdict.waiting) == ("deadlock", "rank_exited", [1], [0])
    assert verdict.collective == "barrier" and verdict.call == "barrier #1"
    assert "rank 1 raised ValueError: boom" in verdict.summary


def test_a_call_that_raised_does_not_count_as_arrived() -> None:
    unpicklable = call("all_gather_object", 1, state="raised", shape=None, error="TypeError: cannot pickle")
    verdict = judge(snap(rank(0, unpicklable, finished=True, failed=True), rank(1, call("all_gather_object", 1, shape=None))))
    assert (verdict.kind, verdict.culprits) == ("rank_exited", [0])
    assert "rank 0 raised TypeError: cannot pickle in all_gather_object #1 (t.py:11)" in verdict.summary


def test_a_dead_rank_is_rank_exited() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1)), rank(1, alive=False, exit_code=-6)))
    assert (verdict.kind, verdict.culprits) == ("rank_exited", [1])
    assert "killed by SIGABRT" in verdict.summary


def test_ranks_that_returned_without_the_collective_are_partial() -> None:
    ranks4 = (0, 1, 2, 3)
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=ranks4)), rank(1, call("all_reduce", 1, ranks=ranks4)),
                         rank(2, finished=True), rank(3, finished=True)))
    assert (verdict.status, verdict.kind, verdict.culprits, verdict.waiting) == ("deadlock", "partial", [2, 3], [0, 1])
    assert verdict.summary.startswith("ranks 2, 3 returned from their test without calling all_reduce #1")


def test_no_deadlock_on_a_subgroup_that_excludes_the_finished_rank() -> None:
    sub = call("all_reduce", 1, group="1", ranks=(0, 1))
    verdict = judge(snap(rank(0, sub), rank(1, call("all_reduce", 1, group="1", ranks=(0, 1), state="ok")), rank(2, finished=True)))
    assert verdict.status == "wait"


def test_different_ops_at_the_same_sequence_number_are_a_mismatch() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1)), rank(1, call("broadcast", 1, root=0))))
    assert (verdict.status, verdict.kind, verdict.culprits, verdict.waiting) == ("deadlock", "mismatch", [1], [0])


def test_different_shapes_are_a_mismatch_naming_both() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, shape=(10,))), rank(1, call("all_reduce", 1, shape=(20,)))))
    assert verdict.kind == "mismatch"
    assert "rank 0 all_reduce shapes [[10]] float32, rank 1 all_reduce shapes [[20]] float32" in verdict.summary


def test_same_bytes_in_another_shape_is_left_to_complete() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, shape=(2, 5))), rank(1, call("all_reduce", 1, shape=(10,)))))
    assert verdict.status == "wait"


def test_majority_decides_who_mismatches() -> None:
    ranks3 = (0, 1, 2)
    verdict = judge(snap(rank(0, call("all_reduce", 1, ranks=ranks3, dtype="float64")),
                         rank(1, call("all_reduce", 1, ranks=ranks3)), rank(2, call("all_reduce", 1, ranks=ranks3))))
    assert verdict.culprits == [0]


def test_both_ranks_receiving_first_is_a_p2p_cycle() -> None:
    verdict = judge(snap(rank(0, call("recv", 1, peer=1)), rank(1, call("recv", 1, peer=0))))
    assert (verdict.status, verdict.kind, verdict.culprits) == ("deadlock", "p2p_cycle", [0, 1])


def test_a_matching_send_unblocks_a_recv() -> None:
    verdict = judge(snap(rank(0, call("recv", 1, peer=1)), rank(1, call("send", 1, peer=0))))
    assert verdict.status == "wait"


def test_recv_from_any_source_pairs_with_a_send() -> None:
    verdict = judge(snap(rank(0, call("recv", 1, peer=None)), rank(1, call("send", 1, peer=0))))
    assert verdict.status == "wait"


def test_recv_from_any_source_is_stuck_only_when_every_sender_is_gone() -> None:
    ranks3 = (0, 1, 2)
    any_recv = call("recv", 1, peer=None, ranks=ranks3)
    assert judge(snap(rank(0, any_recv), rank(1, finished=True), rank(2))).status == "wait"
    verdict = judge(snap(rank(0, call("recv", 1, peer=None, ranks=ranks3)), rank(1, finished=True), rank(2, finished=True)))
    assert (verdict.kind, verdict.culprits) == ("partial", [1, 2])


def test_collectives_in_a_different_order_on_two_groups_are_a_mismatch() -> None:
    on_a = call("all_reduce", 1, group="a", ranks=(0, 1))
    on_b = call("all_reduce", 1, group="b", ranks=(0, 1))
    verdict = judge(snap(rank(0, on_a), rank(1, on_b)))
    assert (verdict.status, verdict.kind) == ("deadlock", "mismatch")


def init(given: int, size: int = 2, state: str = "running", error: str | None = None, enter: float = NOW - 1) -> Call:
    return call("init_process_group", 0, shape=None, state=state, error=error, enter=enter,
                extra={"rank": given, "world_size": size})


def test_init_duplicate_rank() -> None:
    verdict = judge(snap(rank(0, init(0, enter=NOW - 2)), rank(1, init(0))))
    assert (verdict.kind, verdict.culprits) == ("init", [0, 1])
    assert "rank 0" in verdict.summary


def test_init_rank_out_of_range() -> None:
    verdict = judge(snap(rank(0, init(0)), rank(1, init(2, state="raised", error="RuntimeError: rank < size"), finished=True, failed=True)))
    assert (verdict.kind, verdict.culprits) == ("init", [1])
    assert "out of range" in verdict.summary


def test_init_world_sizes_that_disagree() -> None:
    verdict = judge(snap(rank(0, init(0, size=2)), rank(1, init(1, size=3)), rank(2, init(2, size=2))))
    assert (verdict.kind, verdict.culprits) == ("init", [1])


def test_init_a_rank_that_never_arrives() -> None:
    verdict = judge(snap(rank(0, init(0)), rank(1, finished=True)))
    assert (verdict.kind, verdict.culprits) == ("init", [1])
    assert "without calling init_process_group" in verdict.summary


def test_init_slow_starter_is_waited_for() -> None:
    assert judge(snap(rank(0, init(0)), rank(1))).status == "wait"


def test_grace_then_stop_after_a_failure() -> None:
    failed = rank(1, finished=True, failed=True)
    failed.failed_at = NOW - 1
    assert judge(snap(rank(0), failed, grace=2)).status == "wait"
    failed.failed_at = NOW - 3
    verdict = judge(snap(rank(0), failed, grace=2))
    assert (verdict.status, verdict.kind, verdict.culprits, verdict.waiting) == ("stopped", "rank_exited", [1], [0])


def test_timeout_names_the_running_rank_others_wait_for() -> None:
    verdict = judge(snap(rank(0, call("barrier", 1, shape=None)), rank(1), timeout=5, started=NOW - 6))
    assert (verdict.status, verdict.kind, verdict.culprits, verdict.waiting) == ("timeout", "timeout", [1], [0])
    assert verdict.summary.startswith("timed out after 5 s: rank 1 is running outside any collective")


def test_a_certain_deadlock_wins_over_the_timeout() -> None:
    verdict = judge(snap(rank(0, call("barrier", 1, shape=None)), rank(1, finished=True), timeout=5, started=NOW - 6))
    assert verdict.status == "deadlock"


def test_finished_ranks_with_a_mismatch_are_diagnosed_as_mismatch() -> None:
    verdict = judge(snap(rank(0, call("all_reduce", 1, shape=(10,)), alive=False, exit_code=-6),
                         rank(1, call("all_reduce", 1, shape=(20,), state="raised", error="RuntimeError: reset"), finished=True, failed=True)))
    assert (verdict.status, verdict.kind) == ("done", "mismatch")


def test_ordinary_failures_are_failed() -> None:
    verdict = judge(snap(rank(0, finished=True, failed=True), rank(1, finished=True)))
    assert (verdict.status, verdict.kind, verdict.culprits) == ("done", "failed", [0])


def test_compare_sequences() -> None:
    def ok(op: str, seq: int, shape=(4,)) -> Call:
        return call(op, seq, state="ok", shape=shape)

    same = [rank(0, ok("all_reduce", 1), ok("barrier", 2, shape=None)), rank(1, ok("all_reduce", 1), ok("barrier", 2, shape=None))]
    assert compare_sequences(same) == []
    shapes = [rank(0, ok("all_reduce", 1, shape=(2, 5))), rank(1, ok("all_reduce", 1, shape=(10,)))]
    assert compare_sequences(shapes) == [
        "group WORLD, collective #1: rank 0 all_reduce shapes [[2, 5]] float32 (t.py:11) vs rank 1 all_reduce shapes [[10]] float32 (t.py:11)"
    ]
    counts = [rank(0, ok("all_reduce", 1), ok("all_reduce", 2)), rank(1, ok("all_reduce", 1))]
    assert compare_sequences(counts) == ["group WORLD: rank 0 made 2 collectives, rank 1 made 1 collective"]
    p2p = [rank(0, call("send", 1, peer=1, state="ok")), rank(1, call("recv", 1, peer=0, state="ok"))]
    assert compare_sequences(p2p) == []


def test_rank_list() -> None:
    assert (rank_list([2]), rank_list([0, 3]), rank_list([3, 1, 2])) == ("rank 2", "ranks 0, 3", "ranks 1-3")

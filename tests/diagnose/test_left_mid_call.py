"""A rank that returned from its test without a collective its peers then raised in (it ended the
group under them): named as the cause, its peers' connection errors as the consequence.  Hand-made
snapshots: no processes."""

from __future__ import annotations

import dataclasses

from snapshots import NOW, R3, call, judge, ok, outline, rank, snap

from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.diagnose.verdicts import Failures, LeftMidCall, Verdict

RESET = ("RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error"
         " [127.0.0.1]:23424: Connection reset by peer. This is typically caused by a remote worker hanging"
         " or bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!")


def barrier(ranks: tuple[int, ...]) -> Call:
    return ok("barrier", 1, shape=None, ranks=ranks, site="t.py:6")


def woken(r: int, ranks: tuple[int, ...] = (0, 1), error: str = RESET) -> RankState:
    """In all_reduce #2 of t.py:8, a line new after the barrier, it raised."""
    raised = call("all_reduce", 2, ranks=ranks, state="raised", error=error, site="t.py:8")
    return rank(r, barrier(ranks), raised, finished=True, failed=error)


def left(r: int, ranks: tuple[int, ...] = (0, 1), destroy: bool = True) -> RankState:
    destroyed = ok("destroy_process_group", 0, shape=None, site="t.py:9")
    return rank(r, barrier(ranks), *([destroyed] if destroy else []), finished=True)


def test_the_rank_that_skipped_the_call_and_ended_the_group_is_named() -> None:
    verdict = judge(snap(woken(0), left(1)))
    assert outline(verdict) == ("done", "partial", [1], [0])
    assert (verdict.collective, verdict.call) == ("all_reduce", "all_reduce #2")
    assert isinstance(verdict.finding, LeftMidCall)
    assert verdict.summary == (
        "rank 1 never called all_reduce #2 and ended the group (destroy_process_group at t.py:9); then rank 0"
        " raised RuntimeError: Read error: Connection reset by peer in all_reduce #2 (t.py:8)."
    )


def test_a_rank_waiting_in_a_group_its_peer_ended_gets_the_grace_to_raise() -> None:
    """Rank 1 skipped the all_reduce and ended the group; rank 0, still in it, raises when Gloo
    sees the connection gone, which a loaded machine may take longer than the settle time to
    tell: the verdict waits for that raise (the grace), not naming rank 0's call a call more."""
    waiting = rank(0, barrier((0, 1)), call("all_reduce", 2, site="t.py:8"))
    watch = watchdog.Watch()
    assert watch.verdict(snap(waiting, left(1))) is None
    assert watch.verdict(dataclasses.replace(snap(waiting, left(1)), now=NOW + watchdog.SETTLE + 0.1)) is None
    assert watch.verdict(dataclasses.replace(snap(waiting, left(1)), now=NOW + 2.1)) is not None
    # no raise came: the rank that ended the group is named, whatever branch rank 0's call is in
    text = "def test_x(rank):\n    dist.barrier()\n    if rank == 0:\n        dist.all_reduce(t)\n"
    watch = watchdog.Watch(lambda file: text if file == "t.py" else None)
    in_branch = rank(0, barrier((0, 1)), call("all_reduce", 2, site="t.py:4"))
    assert watch.verdict(snap(in_branch, left(1))) is None
    verdict = watch.verdict(dataclasses.replace(snap(in_branch, left(1)), now=NOW + 2.1)) or Verdict("wait")
    assert verdict.culprits == [1]
    # a peer that returned without ending the group: nothing more to come, the verdict at once
    assert watchdog.Watch().verdict(snap(waiting, left(1, destroy=False))) is not None


def test_a_rank_that_returned_without_ending_the_group_is_named_too() -> None:
    """torch's MultiProcessTestCase ends the group after the test, unrecorded."""
    verdict = judge(snap(woken(0), left(1, destroy=False)))
    assert outline(verdict) == ("done", "partial", [1], [0])
    assert verdict.summary.startswith("rank 1 never called all_reduce #2 (returned from its test); then ")


def test_a_harness_exchange_after_the_test_is_on_a_group_of_its_own() -> None:
    """torch's MultiProcessTestCase: after the test each rank exchanges its outcome (recorded on
    group "harness"), and rank 1 ended the group when its test returned."""

    def exchange() -> Call:
        return ok("all_gather_object", 1, group="harness", shape=None, site="case.py:579")

    raised = woken(0)
    raised.calls.append(exchange())
    quitter = left(1, destroy=False)
    quitter.calls.append(exchange())
    verdict = judge(snap(raised, quitter))
    assert outline(verdict) == ("done", "partial", [1], [0])
    assert verdict.summary == (
        "rank 1 never called all_reduce #2 (returned from its test); then rank 0 raised"
        " RuntimeError: Read error: Connection reset by peer in all_reduce #2 (t.py:8)."
    )
    quitter.calls.insert(1, ok("destroy_process_group", 0, shape=None, site="<string>:1"))  # the harness's
    assert judge(snap(raised, quitter)).summary.startswith(
        "rank 1 never called all_reduce #2 and ended the group (destroy_process_group); then rank 0 raised"
    )
    again = woken(0)  # a call on the group after the one that raised: the rank went on with it
    again.calls.append(ok("all_reduce", 3, site="t.py:9"))
    assert judge(snap(again, left(1))).kind == "failed"


def test_every_peer_woken_is_named_once_behind_the_one_that_left() -> None:
    verdict = judge(snap(woken(0, R3), woken(1, R3), left(2, R3)))
    assert outline(verdict) == ("done", "partial", [2], [0, 1])
    assert "; then ranks 0, 1 raised RuntimeError: Read error: Connection reset by peer in all_reduce #2" in (
        verdict.summary
    )


def test_more_left_than_raised_the_few_made_a_call_more() -> None:
    verdict = judge(snap(woken(0, R3), left(1, R3), left(2, R3)))
    assert outline(verdict) == ("done", "failed", [0], [])
    assert isinstance(verdict.finding, Failures)


def test_a_tie_where_the_raised_call_came_as_before_names_both() -> None:
    """Two ranks round one loop: rank 0's all_reduce #3 followed #2 from the same line, as before;
    a step more on rank 0 or a step less on rank 1, nothing tells which."""
    loop = [ok("all_reduce", n, site="t.py:8") for n in (1, 2)]
    raised = call("all_reduce", 3, state="raised", error=RESET, site="t.py:8")
    runner = rank(0, *loop, raised, finished=True, failed=RESET)
    quitter = rank(1, *[ok("all_reduce", n, site="t.py:8") for n in (1, 2)], finished=True)
    verdict = judge(snap(runner, quitter))
    assert outline(verdict) == ("done", "partial", [0, 1], [])
    assert "nothing tells which" in verdict.summary
    assert verdict.call_at_fault([runner, quitter]) is raised


def test_an_error_of_the_call_itself_stays_the_failure() -> None:
    """A call that raised in its argument checks, before the backend had it, woke nobody."""
    bad = call("all_reduce", 2, state="raised", error="TypeError: not a tensor", site="t.py:8")
    bad.before_backend = True
    failing = rank(0, barrier((0, 1)), bad, finished=True, failed="TypeError: not a tensor")
    verdict = judge(snap(failing, left(1)))
    assert outline(verdict) == ("done", "failed", [0], [])


def test_a_rank_that_raised_its_own_error_then_ended_the_group_is_named_not_its_woken_peer() -> None:
    """torchtitan#1342: a trainer raised between two steps, and its ``finally:`` destroyed the group
    under its peer's all_reduce, which raised: the first is at fault, the second woken by it."""
    oom = "RuntimeError: CUDA out of memory"
    raiser = rank(1, barrier((0, 1)), ok("destroy_process_group", 0, shape=None, site="t.py:9"),
                  finished=True, failed=oom)
    peer = woken(0)
    ended = ok("destroy_process_group", 0, shape=None, site="t.py:9")  # its own finally: ran too
    ended.index = len(peer.calls)
    peer.calls.append(ended)
    verdict = judge(snap(peer, raiser))
    assert outline(verdict) == ("done", "rank_exited", [1], [0])
    assert (verdict.collective, verdict.call) == ("all_reduce", "all_reduce #2")
    assert verdict.summary.startswith("rank 1 failed (RuntimeError: CUDA out of memory)")
    assert verdict.summary.endswith("; then rank 0 failed (RuntimeError: Read error: Connection reset by peer).")


def test_ranks_that_each_raised_their_own_error_stay_failures() -> None:
    """Rank 0's all_reduce raised with rank 1 in it: nobody's leaving woke it."""
    entered = ok("all_reduce", 2, site="t.py:8")
    verdict = judge(snap(woken(0), rank(1, barrier((0, 1)), entered, finished=True, failed="ValueError: x")))
    assert outline(verdict) == ("done", "failed", [0, 1], [])


def test_a_peer_that_raised_before_the_rank_left_was_not_woken_by_it() -> None:
    """Rank 0's call raised (its own group timeout) before rank 1 failed and ended the group: the
    failures stand apart."""
    late = ok("destroy_process_group", 0, shape=None, site="t.py:9", enter=NOW - 0.5)
    raiser = rank(1, barrier((0, 1)), late, finished=True, failed="AssertionError: x")
    verdict = judge(snap(woken(0), raiser))
    assert outline(verdict) == ("done", "failed", [0, 1], [])


def test_an_error_of_its_own_that_reads_as_a_timeout_may_be_a_consequence_and_names_nobody_alone() -> None:
    """A store wait that timed out while its peer sat in a call more: not the rank's own fault."""
    ended = ok("destroy_process_group", 0, shape=None, site="t.py:9")
    waited = rank(1, barrier((0, 1)), ended, finished=True, failed="TimeoutError: timed out waiting for key")
    verdict = judge(snap(woken(0), waited))
    assert outline(verdict) == ("done", "failed", [0, 1], [])

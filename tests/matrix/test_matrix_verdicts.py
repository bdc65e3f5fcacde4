"""What the injected-fault matrix (docs/matrix.md) found wrong in the diagnosis and is fixed, on
hand-made states (pure): a killed rank's woken neighbours, groups taken in another order by one
rank of many, and a send whose receive takes a message of another size."""

from __future__ import annotations

from snapshots import NOW, R2, R4, call, judge, killed, ok, outline, rank, snap

from pytest_ddp.diagnose.verdicts import Disagreement, GraceOver
from pytest_ddp.diagnose.wording import worded


def test_ranks_woken_by_a_death_are_not_named_with_it_once_the_grace_is_over():
    """Rank 2 was killed on purpose as it entered all_reduce #3 (the watchdog then waits for the
    grace: its peers may recover); its ring neighbours 1 and 3 raised "Connection closed by
    peer"; rank 0 still waits.  Only rank 2 is at fault."""
    dead = killed(2, ok("all_reduce", 1, ranks=R4), ok("broadcast", 2, ranks=R4), call_number=2)
    woken = [rank(r, ok("all_reduce", 1, ranks=R4), ok("broadcast", 2, ranks=R4),
                  call("all_reduce", 3, ranks=R4, state="raised", error="RuntimeError: Connection closed by peer"),
                  finished=True, failed="RuntimeError: Connection closed by peer", failed_at=NOW - 3)
             for r in (1, 3)]
    waiting = rank(0, ok("all_reduce", 1, ranks=R4), ok("broadcast", 2, ranks=R4), call("all_reduce", 3, ranks=R4))
    verdict = judge(snap(waiting, woken[0], dead, woken[1]))
    assert outline(verdict) == ("stopped", "rank_exited", [2], [0, 1, 3])
    assert isinstance(verdict.finding, GraceOver) and verdict.finding.woken == [1, 3]
    assert worded(verdict, [waiting, woken[0], dead, woken[1]]).summary.startswith(
        "rank 2 died (killed by SIGKILL); then ranks 1, 3 raised"
    )


def test_a_rank_that_takes_two_groups_in_the_other_order_is_named_alone():
    """Ranks 0-2 wait in group 1's all_reduce #1 for rank 3, which waits in group 2's for them."""
    first = [rank(r, call("all_reduce", 1, group="1", ranks=R4)) for r in range(3)]
    other = rank(3, call("all_reduce", 1, group="2", ranks=R4))
    verdict = judge(snap(*first, other))
    assert outline(verdict) == ("deadlock", "mismatch", [3], [0, 1, 2])


def test_two_ranks_in_the_other_order_stay_a_tie():
    verdict = judge(snap(rank(0, call("all_reduce", 1, group="1")), rank(1, call("all_reduce", 1, group="2"))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])


def test_a_send_of_another_size_is_a_mismatch_naming_the_sender():
    """Rank 1 sends 5 floats where it always sent 4; rank 0's receive of 4 raised (Gloo).  The
    rank that raised is not the culprit: the two calls disagree, the sender's departs from its
    line's history, and its message is larger than the receive's buffer: it is named."""
    receiver = rank(0, ok("recv", 1, peer=1, site="t.py:8"),
                    call("recv", 2, peer=1, site="t.py:8", state="raised", error="RuntimeError: size mismatch"),
                    finished=True, failed="RuntimeError: size mismatch")
    sender = rank(1, ok("send", 1, peer=0, site="t.py:9"), call("send", 2, peer=0, site="t.py:9", shape=(5,)),
                  call("recv", 3, peer=0, site="t.py:10"))
    verdict = judge(snap(receiver, sender))
    assert (verdict.kind, verdict.culprits) == ("mismatch", [1])
    assert isinstance(verdict.finding, Disagreement) and list(verdict.finding.likely) == [1]
    # The headline leads with the rank: a terminal's width keeps it.
    assert worded(verdict, [receiver, sender]).summary.startswith(
        "rank 1 departs from rank 0 on the message of recv #2 from 1: rank 1 send shapes [[5]] float32"
    )


def test_a_send_and_receive_of_one_size_are_no_mismatch():
    receiver = rank(0, call("recv", 1, peer=1, state="raised"), finished=True, failed="RuntimeError: closed")
    sender = rank(1, call("send", 1, peer=0), exit_code=-9)
    assert judge(snap(receiver, sender)).kind == "rank_exited"
    assert R2 == (0, 1)


def test_a_rank_whose_call_comes_from_a_new_line_is_not_named_as_likely():
    """Rank 1's call comes from a line that made none before: another path (a Bcast for an
    Allreduce), or the next line of correct code while rank 0 makes a step more (the matrix's
    MPI ranks): nothing tells which, so it stays a tie."""
    steady = rank(0, ok("all_reduce", 1, site="t.py:11"), call("all_reduce", 2, site="t.py:11"))
    detour = rank(1, ok("all_reduce", 1, site="t.py:11"), call("broadcast", 2, site="t.py:20", root=0))
    verdict = judge(snap(steady, detour))
    assert (verdict.kind, verdict.culprits) == ("mismatch", [0, 1])
    assert isinstance(verdict.finding, Disagreement) and not verdict.finding.likely


def test_a_rank_that_raised_in_a_collective_its_peer_entered_with_another_size_is_a_mismatch():
    """MPICH raises "message truncated" on the rank that receives more than it asked for, while
    its peer, whose Allreduce sent 5 elements, went on: the two calls disagree."""
    truncated = rank(1, ok("all_reduce", 1), call("all_reduce", 2, state="raised", error="truncated"),
                     finished=True, failed="truncated")
    peer = rank(0, ok("all_reduce", 1), ok("all_reduce", 2, shape=(5,)), call("barrier", 3, shape=None))
    verdict = judge(snap(peer, truncated))
    assert (verdict.kind, verdict.culprits) == ("mismatch", [0, 1])


def test_a_rank_whose_receive_raised_as_its_peer_died_is_woken_by_it():
    """A ring of 4: rank 0 died; rank 1's receive from it raised; ranks 2 and 3 wait on rank 1's
    side of the ring.  Nobody waits for rank 0 itself, yet it is the culprit, rank 1 a victim."""
    dead = rank(0, ok("send", 1, peer=1), exit_code=-9)
    woken = rank(1, ok("recv", 1, peer=0), call("recv", 2, peer=0, state="raised", error="Connection closed by peer"),
                 finished=True, failed="RuntimeError: Connection closed by peer")
    ring = [rank(2, call("recv", 1, peer=1, ranks=R4)), rank(3, call("recv", 1, peer=2, ranks=R4))]
    verdict = judge(snap(dead, woken, *ring))
    assert (verdict.kind, verdict.culprits) == ("rank_exited", [0])
    assert verdict.summary.startswith("rank 0 died (killed by SIGKILL); rank 1 raised Connection closed by peer")


def test_calls_that_disagree_are_the_mismatch_when_the_grace_is_over_whoever_failed_first():
    """A functional all_reduce of [7, 4] against one of [6, 4]: Gloo's size check aborts rank 1;
    rank 0's call is asynchronous, so it runs on outside any collective until it is stopped."""
    aborted = rank(1, call("all_reduce", 1, shape=(6, 4), is_async=True), exit_code=-6, failed_at=NOW - 3)
    going_on = rank(0, call("all_reduce", 1, shape=(7, 4), is_async=True))
    verdict = judge(snap(going_on, aborted))
    assert (verdict.status, verdict.kind, verdict.culprits) == ("stopped", "mismatch", [0, 1])


def test_a_send_of_another_size_is_a_mismatch_though_the_receiver_died_before_the_sender_raised():
    """Gloo aborted rank 1 inside its receive of rank 0's 5 floats (it expected 4); rank 0, in
    its own receive from rank 1, has not raised yet.  The calls disagree, whatever raised first:
    the matrix's p2p-shape-w2-first named rank 1 for its death in some runs."""
    sender = rank(0, ok("send", 1, peer=1, site="t.py:91"), ok("recv", 1, peer=1, site="t.py:92"),
                  ok("send", 2, peer=1, site="t.py:91", shape=(5,)), call("recv", 2, peer=1, site="t.py:92"))
    receiver = rank(1, ok("recv", 1, peer=0, site="t.py:94"), ok("send", 1, peer=0, site="t.py:95"),
                    call("recv", 2, peer=0, site="t.py:94"), exit_code=-6)
    verdict = judge(snap(sender, receiver))
    assert (verdict.kind, verdict.culprits) == ("mismatch", [0])
    assert isinstance(verdict.finding, Disagreement) and list(verdict.finding.likely) == [0]

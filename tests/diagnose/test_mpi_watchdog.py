"""MPI's rules in the watchdog and the after-test check, on hand-made rank states: no processes.

The scenarios are those of the MPI seed article, as measured with MPICH (docs/scenarios.md, "MPI through
mpi4py"): a small standard send returns before its receive is posted, a large one blocks until then."""

from __future__ import annotations

from snapshots import NOW, R2, R4, done, judge, mpi, outline, rank, snap

from pytest_ddp.common.protocol import NULL_PEER
from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.consistency import unreceived_line, unreceived_messages

# -- the seed article's scenarios -------------------------------------------------------


def test_any_source_receive_with_small_sends_passes_but_two_messages_are_never_received() -> None:
    # Ranks 1-3 each Send 10 int64 to rank 0; rank 0 receives once, from any source, and gets rank 2's.
    senders = [rank(r, done("Send", 1, peer=0, tag=0, enter=NOW - 2 + r / 10), finished=True) for r in (1, 2, 3)]
    receiver = rank(0, done("Recv", 1, got=2), finished=True)
    assert outline(judge(snap(receiver, *senders))) == ("done", None, [], [])
    unreceived = unreceived_messages([receiver, *senders])
    assert [(m.rank, m.dest) for m in unreceived] == [(1, 0), (3, 0)]
    assert unreceived_line(unreceived[0]) == "rank 1: Send #1 to 0 (tag 0) (t.py:11): sent, never received"


def test_any_source_receive_whose_sender_is_not_known_takes_the_earliest_message() -> None:
    senders = [rank(r, done("Send", 1, peer=0, tag=0, enter=NOW - r), finished=True) for r in (1, 2, 3)]
    receiver = rank(0, done("Recv", 1), finished=True)  # its ret named no sender
    assert [m.rank for m in unreceived_messages([receiver, *senders])] == [1, 2]


def test_any_source_receive_with_large_sends_blames_the_receiver_that_returned() -> None:
    # 1,000,000 int64 each: the sends rank 0 never receives block for ever.
    states = [rank(0, done("Recv", 1, got=1), finished=True), rank(1, done("Send", 1, peer=0, tag=0), finished=True),
              rank(2, mpi("Send", 1, peer=0, tag=0)), rank(3, mpi("Send", 1, peer=0, tag=0))]
    verdict = judge(snap(*states))
    assert outline(verdict) == ("deadlock", "partial", [0], [2, 3])
    assert verdict.call == "Send #1 to 0 (tag 0)"
    assert verdict.summary == (
        "rank 0 never received from rank 2 (returned from its test); "
        "ranks 2, 3 wait in Send #1 to 0 (tag 0) (t.py:11)."
    )


def test_a_rank_inside_a_standard_send_gets_time_to_return_before_the_verdict() -> None:
    """A small message's Send returns without its receiver: a rank caught inside one may be
    about to return.  The deadlock is reported once it settled."""
    states = [rank(0, finished=True), rank(1, mpi("Send", 1, peer=0, tag=0))]
    watch = watchdog.Watch()
    assert watch.verdict(snap(*states)) is None
    later = snap(*states)
    later.now += watchdog.SETTLE
    verdict = watch.verdict(later)
    assert verdict is not None and outline(verdict) == ("deadlock", "partial", [0], [1])
    # A synchronous send cannot return alone: reported at once.
    assert watchdog.Watch().verdict(snap(rank(0, finished=True), rank(1, mpi("Ssend", 1, peer=0, tag=0)))) is not None


def test_a_raise_before_a_barrier_is_the_raisers_fault() -> None:
    barrier = [rank(r, mpi("Barrier", 1)) for r in (0, 2, 3)]
    verdict = judge(snap(rank(1, finished=True, failed="ValueError: boom"), *barrier))
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0, 2, 3])
    assert verdict.summary == "rank 1 failed (ValueError: boom); ranks 0, 2, 3 wait in Barrier #1 (t.py:11) for rank 1."


def test_half_the_world_in_allreduce_blames_the_ranks_that_returned() -> None:
    reducing = [rank(r, mpi("allreduce", 1, extra={"op": "SUM"})) for r in (0, 1)]
    verdict = judge(snap(*reducing, rank(2, finished=True), rank(3, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [2, 3], [0, 1])
    assert verdict.summary.startswith("ranks 2, 3 never called allreduce #1 (returned from their test);")


def test_mismatched_tags_with_large_messages_are_a_cycle_naming_both() -> None:
    verdict = judge(snap(rank(0, mpi("Send", 1, peer=1, tag=1, ranks=R2)),
                         rank(1, mpi("Recv", 1, peer=0, tag=2, ranks=R2))))
    assert outline(verdict) == ("deadlock", "p2p_cycle", [0, 1], [])
    assert verdict.summary == (
        "a point-to-point cycle: rank 0 waits in Send #1 to 1 (tag 1) (t.py:11) and rank 1 waits in "
        "Recv #1 from 0 (tag 2) (t.py:11)."
    )


def test_mismatched_tags_with_a_small_message_blame_the_sender_that_returned() -> None:
    verdict = judge(snap(rank(0, done("Send", 1, peer=1, tag=1, ranks=R2), finished=True),
                         rank(1, mpi("Recv", 1, peer=0, tag=2, ranks=R2))))
    assert outline(verdict) == ("deadlock", "partial", [0], [1])
    assert verdict.summary == (
        "rank 0 returned from its test; its Send #1 to 1 (tag 1) (t.py:11) matches no receive; "
        "rank 1 waits in Recv #1 from 0 (tag 2) (t.py:11)."
    )


def test_a_dead_rank_is_the_culprit_of_the_receive_waiting_for_it() -> None:
    verdict = judge(snap(rank(0, mpi("Recv", 1, peer=1, tag=0, ranks=R2)), rank(1, exit_code=-9)))
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0])
    assert verdict.summary == "rank 1 died (killed by SIGKILL); rank 0 waits in Recv #1 from 1 (tag 0) (t.py:11)."


def test_a_send_of_a_dead_rank_was_never_sent() -> None:
    # Rank 1 died inside its Send: its message will never come.
    dead = rank(1, mpi("Send", 1, peer=0, tag=0), exit_code=-9)
    verdict = judge(snap(rank(0, mpi("Recv", 1, peer=1, ranks=R2)), dead))
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [0])


# -- matching rules -----------------------------------------------------------------------


def test_a_receive_whose_message_was_sent_is_in_progress() -> None:
    for sent in (done("Send", 1, peer=1, tag=3, ranks=R2), mpi("Isend", 1, peer=1, tag=3, ranks=R2)):
        verdict = judge(snap(rank(0, sent, finished=True), rank(1, mpi("Recv", 1, peer=0, ranks=R2))))
        assert verdict.status == "wait", sent.op


def test_messages_from_one_sender_are_received_in_the_order_sent() -> None:
    # Rank 0 sent tag 1, then tag 2.  Rank 1's first receive (any tag) took tag 1: its receive of
    # tag 1 waits, its receive of tag 2 would not.  (The receives' lines are not the sends'.)
    sends = rank(0, done("Send", 1, peer=1, tag=1, ranks=R2), done("Send", 2, peer=1, tag=2, ranks=R2), finished=True)
    tag_1 = rank(1, done("Recv", 1, peer=0, ranks=R2, site="t.py:21"),
                 mpi("Recv", 2, peer=0, tag=1, ranks=R2, site="t.py:22"))
    assert outline(judge(snap(sends, tag_1))) == ("deadlock", "partial", [0], [1])
    tag_2 = rank(1, done("Recv", 1, peer=0, ranks=R2), mpi("Recv", 2, peer=0, tag=2, ranks=R2))
    assert judge(snap(sends, tag_2)).status == "wait"


def test_a_receive_of_one_tag_leaves_an_earlier_message_of_another() -> None:
    sends = rank(0, done("Send", 1, peer=1, tag=1, ranks=R2), done("Send", 2, peer=1, tag=2, ranks=R2), finished=True)
    receiver = rank(1, done("Recv", 1, peer=0, tag=2, ranks=R2), finished=True)
    assert [(m.call.tag, m.call.seq) for m in unreceived_messages([sends, receiver])] == [(1, 1)]


def test_an_earlier_irecv_takes_the_message_before_a_later_receive() -> None:
    receiver = rank(1, mpi("Irecv", 1, peer=0, tag=0, ranks=R2), mpi("Recv", 2, peer=0, tag=0, ranks=R2))
    verdict = judge(snap(rank(0, done("Send", 1, peer=1, tag=0, ranks=R2), finished=True), receiver))
    assert outline(verdict) == ("deadlock", "partial", [0], [1])
    assert verdict.call == "Recv #2 from 0 (tag 0)"


def test_a_rank_waiting_for_its_isend_waits_for_the_receiver() -> None:
    sender = rank(0, mpi("Isend", 1, peer=1, tag=0, ranks=R2))
    sender.waiting_on = 0
    verdict = judge(snap(sender, rank(1, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])
    # Once the receive is posted, the Isend only has to complete.
    sender = rank(0, mpi("Isend", 1, peer=1, tag=0, ranks=R2))
    sender.waiting_on = 0
    assert judge(snap(sender, rank(1, mpi("Recv", 1, peer=0, ranks=R2)))).status == "wait"


def test_a_synchronous_send_whose_receive_is_posted_is_in_progress() -> None:
    posted = rank(1, mpi("Irecv", 1, peer=0, tag=0, ranks=R2), finished=True)
    assert judge(snap(rank(0, mpi("Ssend", 1, peer=1, tag=0, ranks=R2)), posted)).status == "wait"


def test_an_any_source_receive_waits_for_any_member_that_can_still_send() -> None:
    receiver = rank(0, mpi("Recv", 1, ranks=R4))
    assert judge(snap(receiver, rank(1, finished=True), rank(2, finished=True), rank(3))).status == "wait"
    verdict = judge(snap(receiver, rank(1, finished=True), rank(2, finished=True), rank(3, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1, 2, 3], [0])
    assert verdict.summary.endswith("rank 0 waits in Recv #1 from any (any tag) (t.py:11) for any of ranks 1-3.")


def test_a_probe_sees_a_message_without_taking_it() -> None:
    sent = rank(0, done("Send", 1, peer=1, tag=0, ranks=R2), finished=True)
    probing = rank(1, done("Probe", 1, ranks=R2), done("Recv", 1, peer=0, ranks=R2), mpi("Probe", 2, ranks=R2))
    verdict = judge(snap(sent, probing))
    assert outline(verdict) == ("deadlock", "partial", [0], [1])  # the Recv took the only message
    assert judge(snap(sent, rank(1, mpi("Probe", 1, ranks=R2)))).status == "wait"


def test_sendrecv_needs_its_message_then_its_receiver() -> None:
    ring = {"recv_from": 1, "recv_tag": 0}
    both = [rank(0, mpi("Sendrecv", 1, peer=1, tag=0, ranks=R2, extra=ring)),
            rank(1, mpi("Sendrecv", 1, peer=0, tag=0, ranks=R2, extra={"recv_from": 0, "recv_tag": 0}))]
    assert judge(snap(*both)).status == "wait"
    verdict = judge(snap(rank(0, mpi("Sendrecv", 1, peer=1, tag=0, ranks=R2, extra=ring)), rank(1, finished=True)))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])
    assert verdict.call == "Sendrecv #1 to 1 (tag 0), from 1 (tag 0)"


def test_messages_on_another_communicator_do_not_match() -> None:
    sent = rank(0, done("Send", 1, peer=1, tag=0, group="1", ranks=R2), finished=True)
    verdict = judge(snap(sent, rank(1, mpi("Recv", 1, peer=0, tag=0, ranks=R2))))
    assert outline(verdict) == ("deadlock", "partial", [0], [1])
    assert [m.rank for m in unreceived_messages([sent, rank(1, finished=True)])] == [0]


def test_proc_null_needs_nobody() -> None:
    nobody = rank(0, mpi("Recv", 1, peer=NULL_PEER, ranks=R2))
    assert judge(snap(nobody, rank(1, finished=True))).status == "wait"
    assert nobody.calls[0].label == "Recv #1 from null (any tag)"
    assert unreceived_messages([rank(0, done("Send", 1, peer=NULL_PEER, tag=0), finished=True)]) == []


def test_collectives_on_a_split_communicator_wait_only_for_its_members() -> None:
    half = (0, 1)
    verdict = judge(snap(rank(0, mpi("Barrier", 1, group="1.0", ranks=half)),
                         rank(1, done("Barrier", 1, group="1.0", ranks=half)),
                         rank(2, finished=True), rank(3, finished=True)))
    assert verdict.status == "wait"
    verdict = judge(snap(rank(0, mpi("Barrier", 1, group="1.0", ranks=half)), rank(1, finished=True), rank(2)))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])
    assert verdict.call == "Barrier #1 on group 1.0 [0, 1]"


def test_a_receive_that_raised_took_no_message() -> None:
    sends = rank(0, done("Send", 1, peer=1, tag=0, ranks=R2), finished=True)
    receiver = rank(1, mpi("Recv", 1, peer=0, ranks=R2, state="raised"), finished=True, failed="error")
    assert [m.rank for m in unreceived_messages([sends, receiver])] == [0]


def test_a_receive_into_a_buffer_too_small_took_its_message() -> None:
    # MPI matches the message, then finds it longer than the buffer (MPI_ERR_TRUNCATE).
    sends = rank(0, done("Send", 1, peer=1, tag=0, ranks=R2), finished=True)
    error = "Exception: Message truncated, error stack: internal_Recv_c(339)"
    receiver = rank(1, mpi("Recv", 1, peer=0, ranks=R2, state="raised", error=error), finished=True, failed="truncated")
    assert unreceived_messages([sends, receiver]) == []

"""The majority's rules for a send or receive more (diagnose/majority.py), on hand-made rank
states of a ring (tests/matrix/families.py's p2p body): each rank sends to the next and
receives from the previous, three steps."""

from __future__ import annotations

import dataclasses

from snapshots import NOW, R4, call, judge, ok, outline, rank, snap

from pytest_ddp.common.protocol import Injected, Setting
from pytest_ddp.diagnose import code_ties, majority, watchdog
from pytest_ddp.diagnose.state import Call, RankState, Snapshot
from pytest_ddp.diagnose.verdicts import Cycle, Disagreement, Verdict
from pytest_ddp.diagnose.wording import worded

STEPS = 3


def ring(r: int, world: int, sends: int = STEPS, recvs: int = STEPS) -> list[Call]:
    """Rank r's calls, all returned: ``sends`` sends to the next rank, ``recvs`` receives from the previous."""
    after, before = (r + 1) % world, (r - 1) % world
    made = [ok("send", k, peer=after, ranks=tuple(range(world))) for k in range(1, sends + 1)]
    made += [ok("recv", k, peer=before, ranks=tuple(range(world))) for k in range(1, recvs + 1)]
    return made


def finished(r: int, world: int, **kwargs: int) -> RankState:
    return rank(r, *ring(r, world, **kwargs), finished=True)


def test_a_rank_that_sends_once_more_than_every_other_rank_is_named_not_the_peer_that_returned() -> None:
    world = 4
    waiting = rank(0, *ring(0, world), call("send", STEPS + 1, peer=1, ranks=(0, 1, 2, 3), site="t.py:9"))
    verdict = judge(snap(waiting, *(finished(r, world) for r in (1, 2, 3))))
    assert outline(verdict) == ("deadlock", "partial", [0], [])
    assert verdict.summary == (
        "rank 0 made a send more than most ranks: send #4 to 1 (t.py:9); "
        "rank 1 returned from its test without receiving it."
    )


def test_a_rank_that_receives_once_less_than_every_other_rank_is_still_named() -> None:
    # Rank 1 returned after 2 receives from rank 0; rank 0's 3rd send waits: rank 0 made as
    # many sends as every rank, rank 1 a receive less.
    world = 4
    waiting = rank(0, *ring(0, world, sends=STEPS - 1), call("send", STEPS, peer=1, ranks=(0, 1, 2, 3)))
    ranks = [finished(1, world, recvs=STEPS - 1), finished(2, world), finished(3, world)]
    assert outline(judge(snap(waiting, *ranks))) == ("deadlock", "partial", [1], [0])


def test_two_ranks_have_no_majority_and_the_rank_that_returned_is_named() -> None:
    waiting = rank(0, *ring(0, 2), call("send", STEPS + 1, peer=1))
    assert outline(judge(snap(waiting, finished(1, 2)))) == ("deadlock", "partial", [1], [0])


def test_a_send_more_whose_peer_also_received_less_than_most_is_not_decided_by_the_counts() -> None:
    # Rank 0 sent one more than most and rank 1 received one less: the counts accuse both.
    world = 4
    waiting = rank(0, *ring(0, world), call("send", STEPS + 1, peer=1, ranks=(0, 1, 2, 3)))
    ranks = [finished(1, world, recvs=STEPS - 1), finished(2, world), finished(3, world)]
    assert outline(judge(snap(waiting, *ranks)))[2] == [1]


def test_a_rank_behind_the_one_that_sent_more_waits_and_is_not_named() -> None:
    # Rank 0 sent twice at its 2nd send (an extra), so it received one less from rank 3 before
    # its 4th send blocked: rank 3's 3rd send to it waits behind.
    world = 4
    waiting = rank(0, *ring(0, world, recvs=STEPS - 1), call("send", STEPS + 1, peer=1, ranks=(0, 1, 2, 3)))
    behind = rank(3, *ring(3, world, sends=STEPS - 1), call("send", STEPS, peer=0, ranks=(0, 1, 2, 3)))
    verdict = judge(snap(waiting, finished(1, world), finished(2, world), behind))
    assert outline(verdict) == ("deadlock", "partial", [0], [3])


CLOSED = "RuntimeError: Connection closed by peer"


def raised(op: str, seq: int, peer: int, ranks: tuple[int, ...] = (0, 1, 2, 3)) -> Call:
    return call(op, seq, state="raised", peer=peer, ranks=ranks, error=CLOSED)


def test_the_rank_at_an_end_of_every_broken_exchange_is_named_not_the_peers_it_woke() -> None:
    # Rank 0 lost its connections (a disconnect): its send to 1 raised, and so did rank 1's
    # receive from it and rank 3's send to it; rank 2 waits for rank 1.
    r4 = (0, 1, 2, 3)
    states = [
        rank(0, ok("send", 1, peer=1, ranks=r4), ok("recv", 1, peer=3, ranks=r4), raised("send", 2, 1),
             finished=True, failed=CLOSED),
        rank(1, ok("recv", 1, peer=0, ranks=r4), ok("send", 1, peer=2, ranks=r4), raised("recv", 2, 0),
             finished=True, failed=CLOSED),
        rank(2, ok("recv", 1, peer=1, ranks=r4), ok("send", 1, peer=3, ranks=r4), call("recv", 2, peer=1, ranks=r4)),
        rank(3, ok("send", 1, peer=0, ranks=r4), ok("recv", 1, peer=2, ranks=r4), raised("send", 2, 0),
             finished=True, failed=CLOSED),
    ]
    verdict = judge(snap(*states))
    assert outline(verdict) == ("deadlock", "rank_exited", [0], [2])
    assert verdict.summary.startswith("rank 0 ")


def test_two_ends_of_one_broken_exchange_blame_each_other_and_no_center_is_named() -> None:
    states = [rank(0, raised("recv", 2, 1, (0, 1)), finished=True, failed=CLOSED),
              rank(1, raised("send", 2, 0, (0, 1)), finished=True, failed=CLOSED)]
    assert outline(judge(snap(*states)))[2] == [0, 1]


def test_a_stage_whose_earlier_send_to_the_dead_rank_raised_was_woken_by_the_death() -> None:
    # A pipeline: rank 2 killed; rank 1's isend to it raised and its next isend is in flight,
    # rank 3's irecv from it raised; rank 0 waits for rank 1. The grace is over.
    r4 = (0, 1, 2, 3)
    states = [
        rank(0, ok("isend", 1, peer=1, ranks=r4), call("irecv", 1, peer=1, ranks=r4)),
        rank(1, raised("isend", 1, 2), ok("irecv", 1, peer=0, ranks=r4), call("isend", 2, peer=2, ranks=r4),
             finished=True, failed=CLOSED),
        rank(2, ok("irecv", 1, peer=1, ranks=r4), exit_code=-9),
        rank(3, raised("irecv", 1, 2), finished=True, failed=CLOSED),
    ]
    verdict = judge(snap(*states, grace=0))
    assert verdict.kind == "rank_exited" and verdict.culprits == [2]


# -- two ranks: the path each took (majority.new_paths) ---------------------------------


def steps(*sites: tuple[str, str]) -> list[Call]:
    """Returned collectives, numbered in order: (op, line) each."""
    return [ok(op, seq, site=f"t.py:{line}", shape=None if op == "barrier" else (4,))
            for seq, (op, line) in enumerate(sites, 1)]


LOOP = [("all_reduce", "55"), ("broadcast", "56")] * 2  # two steps of a loop of two lines


def test_of_two_ranks_the_one_whose_call_came_in_an_order_never_taken_is_named_as_likely() -> None:
    # Both went round the loop twice; rank 1 then made an all_reduce more (55 right after 55).
    verdict = judge(snap(rank(0, *steps(*LOOP), call("all_reduce", 5, site="t.py:55")),
                         rank(1, *steps(*LOOP[:3]), call("all_reduce", 4, site="t.py:55"))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])  # still a tie: said as likely
    assert isinstance(verdict.finding, Disagreement) and list(verdict.finding.after) == [1]
    assert verdict.summary.endswith(
        "Likely rank 1: its all_reduce #4 (t.py:55) came right after a call from t.py:55, an order no rank's "
        "calls took before; the others' came in an order taken before."
    )


def test_a_loops_first_way_out_is_no_departure_a_step_less_is_a_step_more_on_the_other() -> None:
    # Rank 0 left the loop for the barrier (a line no call came from before); rank 1 went round
    # once more: a step less on rank 0 or a step more on rank 1, nothing tells.
    verdict = judge(snap(rank(0, *steps(*LOOP), call("barrier", 5, shape=None, site="t.py:58")),
                         rank(1, *steps(*LOOP), call("all_reduce", 5, site="t.py:55"))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])
    assert isinstance(verdict.finding, Disagreement) and not verdict.finding.after
    assert "Likely" not in verdict.summary


def test_where_both_orders_are_new_it_stays_a_tie() -> None:
    # The loop's way back (56 -> 55) is first taken by rank 1 as rank 0 skips its all_reduce.
    verdict = judge(snap(rank(0, *steps(*LOOP[:2]), call("broadcast", 3, site="t.py:56")),
                         rank(1, *steps(*LOOP[:2]), call("all_reduce", 3, site="t.py:55"))))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])
    assert "Likely" not in verdict.summary


# The code of the loop above, its all_reduce at t.py:55 and its broadcast at t.py:56.
LOOP_CODE = "\n" * 52 + "def step(grad):\n    for _ in range(3):\n        dist.all_reduce(grad)\n" \
    "        dist.broadcast(grad, src=0)\n    dist.barrier()\n"


def code(file: str) -> str | None:
    return LOOP_CODE if file == "t.py" else None


def test_where_both_orders_are_new_the_code_tells_which_rank_skipped_a_call() -> None:
    # As above: no path from t.py:56 to itself passes no all_reduce, and rank 0's calls took one.
    ranks = [rank(0, *steps(*LOOP[:2]), call("broadcast", 3, site="t.py:56")),
             rank(1, *steps(*LOOP[:2]), call("all_reduce", 3, site="t.py:55"))]
    verdict = code_ties.skipped_in_code(watchdog.judge(snap(*ranks)), {r.rank: r for r in ranks}, code)
    assert verdict is not None
    verdict = worded(verdict, ranks)
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])  # a tie, said as likely
    assert isinstance(verdict.finding, Disagreement) and list(verdict.finding.skipped) == [0]
    assert verdict.summary.endswith(
        "Likely rank 0: its broadcast #3 (t.py:56) came right after its call from t.py:56, and its code makes "
        "the call of t.py:55 on every way between the two; the others' code has a way."
    )
    # Its code unknown (a file the controller cannot read), or a call of its own line that may not be
    # made (under a condition): a tie as before.
    assert code_ties.skipped_in_code(watchdog.judge(snap(*ranks)), {r.rank: r for r in ranks}, lambda f: None) is None
    guarded = LOOP_CODE.replace("        dist.all_reduce(grad)", "        rank and dist.all_reduce(grad)")
    assert code_ties.skipped_in_code(watchdog.judge(snap(*ranks)), {r.rank: r for r in ranks},
                                    lambda f: guarded) is None
    # A library's function of the op's name made the all_reduce (it may skip it): no call of the line's own.
    for state in ranks:
        for c in state.calls:
            c.caller = "deepspeed/comm/comm.py:40" if c.op == "all_reduce" else None
    assert code_ties.skipped_in_code(watchdog.judge(snap(*ranks)), {r.rank: r for r in ranks}, code) is None


def test_the_watch_asks_the_code_where_a_two_rank_cycle_is_a_tie() -> None:
    """The ring of the test below at 2 ranks, rank 1 skipping its receive: both wait in a send,
    and rank 1's send came right after its send, where its code receives between."""
    source = "\n" * 89 + "def ring(rank, t):\n    for _ in range(3):\n        if rank % 2 == 0:\n" \
        "            dist.send(t, dst=1)\n            dist.recv(t, src=1)\n        else:\n" \
        "            dist.recv(t, src=0)\n            dist.send(t, dst=0)\n"
    r0 = [ok("send", 1, peer=1, site="t.py:93"), ok("recv", 1, peer=1, site="t.py:94"),
          call("send", 2, peer=1, site="t.py:93")]
    r1 = [ok("recv", 1, peer=0, site="t.py:96"), ok("send", 1, peer=0, site="t.py:97"),
          call("send", 2, peer=0, site="t.py:97")]
    ranks = [rank(0, *r0), rank(1, *r1)]
    verdict = watchdog.Watch(lambda f: source if f == "t.py" else None).verdict(snap(*ranks))
    assert verdict is not None and outline(verdict) == ("deadlock", "p2p_cycle", [0, 1], [])
    assert isinstance(verdict.finding, Cycle) and verdict.finding.skipped == {1: (r1[1], r1[2], ["t.py:96"])}
    unread = watchdog.Watch().verdict(snap(*ranks))  # no code: a tie, nothing said as likely
    assert unread is not None and isinstance(unread.finding, Cycle) and not unread.finding.skipped


def test_of_a_two_rank_p2p_cycle_the_rank_that_sent_twice_in_a_row_is_named_as_likely() -> None:
    """The matrix's ring at 2 ranks: rank 0 sends then receives, rank 1 the other way round;
    rank 0 then sends twice in a row (a send more, or a receive skipped): both ranks wait in a
    send, a cycle."""
    r0 = [ok("send", 1, peer=1, site="t.py:91"), ok("recv", 1, peer=1, site="t.py:92"),
          ok("send", 2, peer=1, site="t.py:91"), call("send", 3, peer=1, site="t.py:91")]
    r1 = [ok("recv", 1, peer=0, site="t.py:94"), ok("send", 1, peer=0, site="t.py:95"),
          ok("recv", 2, peer=0, site="t.py:94"), call("send", 2, peer=0, site="t.py:95")]
    verdict = judge(snap(rank(0, *r0), rank(1, *r1)))
    assert outline(verdict) == ("deadlock", "p2p_cycle", [0, 1], [])
    assert isinstance(verdict.finding, Cycle) and list(verdict.finding.after) == [0]
    assert verdict.summary.startswith("rank 0 likely departs: a point-to-point cycle: ")  # the likely rank leads
    assert verdict.summary.endswith(
        "Likely rank 0: its send #3 to 1 (t.py:91) came right after a call from t.py:91, an order no rank's "
        "calls took before; the others' came in an order taken before."
    )


def test_a_connection_that_broke_between_a_pipelines_first_two_stages_names_both_its_ends() -> None:
    """A pipeline of 4 (the matrix's pipelining-disconnect-w4-first): the connection between
    stages 0 and 1 broke; rank 1's receive from 0 raised "Connection closed by peer", and so did
    rank 0's isend to 1.  Gloo says the same on both ends: either may have lost it."""
    closed = "RuntimeError: Connection closed by peer"
    r4 = (0, 1, 2, 3)
    first = rank(0, ok("isend", 3, peer=1, ranks=r4), call("isend", 4, peer=1, ranks=r4, state="raised", error=closed),
                 finished=True, failed=closed)
    second = rank(1, ok("irecv", 3, peer=0, ranks=r4), call("irecv", 4, peer=0, ranks=r4, state="raised", error=closed),
                  finished=True, failed=closed)
    rest = [rank(2, ok("irecv", 3, peer=1, ranks=r4), call("irecv", 4, peer=1, ranks=r4)),
            rank(3, ok("irecv", 3, peer=2, ranks=r4), call("irecv", 4, peer=2, ranks=r4))]
    for waiting in rest:
        waiting.waiting_on = 1  # in its irecv #4's wait
    verdict = judge(snap(first, second, *rest))
    assert outline(verdict) == ("deadlock", "rank_exited", [0, 1], [2, 3])
    assert verdict.summary.endswith(
        "The connection between ranks 0 and 1 broke, and a call of each on it raised: either may have lost it."
    )
    first.apply(Injected("connections to its peers broken on rank 0 at isend call 4", "disconnect", "isend", 4))
    watch = watchdog.Watch()
    assert watch.verdict(snap(first, second, *rest)) is None  # the grace a cut gets
    later = dataclasses.replace(snap(first, second, *rest), now=NOW + 2.5)
    verdict = worded(watch.verdict(later) or Verdict("wait"), later.ranks)
    assert outline(verdict) == ("deadlock", "rank_exited", [0], [1, 2, 3])  # the test cut rank 0's end
    assert "either may have lost it" not in verdict.summary


def test_a_connection_that_broke_as_its_end_died_names_the_dead_end_alone() -> None:
    closed = "RuntimeError: Connection closed by peer"
    dead = rank(0, ok("send", 1, peer=1), call("send", 2, peer=1, state="raised", error=closed), exit_code=-9)
    woken = rank(1, ok("recv", 1, peer=0), call("recv", 2, peer=0, state="raised", error=closed),
                 finished=True, failed=closed)
    waiting = rank(2, call("recv", 1, peer=1, ranks=(0, 1, 2)))
    verdict = judge(snap(dead, woken, waiting))
    assert verdict.culprits == [0] and "either may have lost it" not in verdict.summary


def test_of_two_ranks_one_waiting_in_a_step_more_as_it_went_before_is_a_tie() -> None:
    """DDP's uneven inputs: rank 0 waits in a third step's all_reduce, from the line and after
    the call its steps always made; rank 1 returned after two.  A step more on rank 0 or a step
    less on rank 1: both are named."""
    steps_of = [ok("all_reduce", seq, site="t.py:126") for seq in (1, 2)]
    waiting = rank(0, *steps_of, call("all_reduce", 3, site="t.py:126"))
    returned = rank(1, *[ok("all_reduce", seq, site="t.py:126") for seq in (1, 2)], finished=True)
    verdict = judge(snap(waiting, returned))
    assert outline(verdict) == ("deadlock", "partial", [0, 1], [])
    assert verdict.summary.endswith(
        "rank 0 went on as it had (the call came after the one before it in an order of lines taken before): "
        "a step more on rank 0 or a step less on rank 1, nothing tells which."
    )


def test_of_two_ranks_one_waiting_in_a_call_from_a_new_line_names_the_rank_that_returned() -> None:
    """The barrier only rank 0 calls, after a step both made: rank 1 never called it."""
    waiting = rank(0, ok("all_reduce", 1, site="t.py:10"), call("barrier", 2, shape=None, site="t.py:12"))
    returned = rank(1, ok("all_reduce", 1, site="t.py:10"), finished=True)
    verdict = judge(snap(waiting, returned))
    assert outline(verdict) == ("deadlock", "partial", [1], [0])
    assert "nothing tells" not in verdict.summary


def test_of_four_ranks_one_waiting_in_a_send_its_peer_never_received_is_no_tie() -> None:
    """The matrix's ring (p2p-unmatched_send-w4-first): rank 0 returned without its 3rd receive
    from rank 3, whose 3rd send waits, come as its sends went before; but ranks 1 and 2 made 3
    of each, so rank 0 made a receive less (the majority), not rank 3 a send more."""
    r4 = (0, 1, 2, 3)

    def steps_of(r: int, first: str, second: str, lines: tuple[int, int], count: int) -> list[Call]:
        peers = {"send": (r + 1) % 4, "recv": (r - 1) % 4}
        return [ok(op, k, peer=peers[op], ranks=r4, site=f"t.py:{line}")
                for k in range(1, count + 1) for op, line in ((first, lines[0]), (second, lines[1]))]

    rank_0 = rank(0, *steps_of(0, "send", "recv", (91, 92), 2), ok("send", 3, peer=1, ranks=r4, site="t.py:91"),
                  finished=True)
    rank_1 = rank(1, *steps_of(1, "recv", "send", (94, 95), 3), finished=True)
    rank_3 = rank(3, *steps_of(3, "recv", "send", (94, 95), 2), ok("recv", 3, peer=2, ranks=r4, site="t.py:94"),
                  call("send", 3, peer=0, ranks=r4, site="t.py:95"))
    rank_2 = rank(2, *steps_of(2, "send", "recv", (91, 92), 3), finished=True)
    verdict = judge(snap(rank_0, rank_1, rank_2, rank_3))
    assert outline(verdict) == ("deadlock", "partial", [0], [3])


def test_a_ring_rank_whose_connections_broke_is_given_the_settle_time_to_raise_then_named() -> None:
    """The matrix's p2p-disconnect-w4-middle: rank 2's connections broke; ranks 1 and 3 raised
    on theirs to it, and rank 0 waits for rank 3.  While rank 2 is still in its send (it raises
    there next), the verdict settles, as for a rank finishing a collective; once it raised, it
    alone is named."""
    closed = "RuntimeError: Connection closed by peer"
    r4 = (0, 1, 2, 3)
    waiting = rank(0, ok("send", 1, peer=1, ranks=r4), call("recv", 1, peer=3, ranks=r4))
    woken = [rank(1, call("send", 1, peer=2, ranks=r4, state="raised", error=closed), finished=True, failed=closed),
             rank(3, call("recv", 1, peer=2, ranks=r4, state="raised", error=closed), finished=True, failed=closed)]
    center = rank(2, ok("send", 1, peer=3, ranks=r4), call("send", 2, peer=3, ranks=r4))  # waits for rank 3
    watch = watchdog.Watch()
    assert watch.verdict(snap(waiting, woken[0], center, woken[1])) is None  # settling
    after = Snapshot(now=NOW + watchdog.SETTLE, started=NOW - 1, timeout=60, grace=2,
                     ranks=[waiting, woken[0], center, woken[1]])
    assert watch.verdict(after) is not None  # no longer than the settle time
    raised = rank(2, ok("send", 1, peer=3, ranks=r4), call("send", 2, peer=3, ranks=r4, state="raised", error=closed),
                  finished=True, failed=closed)
    verdict = judge(snap(waiting, woken[0], raised, woken[1]))
    assert outline(verdict) == ("deadlock", "rank_exited", [2], [0])


def test_a_broken_connection_whose_other_end_is_still_in_its_send_names_both_ends() -> None:
    """The same pipeline, looked at before rank 0's next isend raised: it is still in isend #4's
    wait, to rank 1, whose receive from it raised."""
    closed = "RuntimeError: Connection closed by peer"
    r4 = (0, 1, 2, 3)
    first = rank(0, ok("isend", 3, peer=1, ranks=r4), call("isend", 4, peer=1, ranks=r4))
    first.waiting_on = 1
    second = rank(1, ok("irecv", 3, peer=0, ranks=r4), call("irecv", 4, peer=0, ranks=r4, state="raised", error=closed),
                  finished=True, failed=closed)
    rest = [rank(2, ok("irecv", 3, peer=1, ranks=r4), call("irecv", 4, peer=1, ranks=r4)),
            rank(3, ok("irecv", 3, peer=2, ranks=r4), call("irecv", 4, peer=2, ranks=r4))]
    for waiting in rest:
        waiting.waiting_on = 1
    verdict = judge(snap(first, second, *rest))
    assert outline(verdict) == ("deadlock", "rank_exited", [0, 1], [2, 3])
    # ... after the settle time (rank 0's peer left: it may be about to raise, or be dying), and
    # named alone once it died: rank 1 was woken by the death
    in_send = rank(0, ok("send", 3, peer=1, ranks=r4), call("send", 4, peer=1, ranks=r4))  # blocking: in a call
    assert outline(judge(snap(in_send, second, *rest)))[1:3] == ("rank_exited", [0, 1])
    assert watchdog.Watch().verdict(snap(in_send, second, *rest)) is None
    dead = rank(0, ok("send", 3, peer=1, ranks=r4), call("send", 4, peer=1, ranks=r4), exit_code=1)
    assert outline(judge(snap(dead, second, *rest)))[1:3] == ("rank_exited", [0])


def _mpi_ring(r: int, skip_send_at: int | None = None) -> list[Call]:
    """tests/matrix/families.py's MPI body with torch's calls, two steps: an all_reduce (t.py:267), a
    broadcast (268), then even ranks send (273) and receive (274), odd ones receive (276) and send
    (277), in a ring of 4; the rank skips its send in step ``skip_send_at``."""
    r4 = (0, 1, 2, 3)
    made: list[Call] = []
    for step in (1, 2):
        made += [ok("all_reduce", 2 * step - 1, ranks=r4, site="t.py:267"),
                 ok("broadcast", 2 * step, ranks=r4, site="t.py:268")]
        send_site = f"t.py:{273 + 4 * (r % 2)}"
        send = [] if step == skip_send_at else [ok("send", step, peer=(r + 1) % 4, ranks=r4, site=send_site)]
        recv = [ok("recv", step, peer=(r - 1) % 4, ranks=r4, site=f"t.py:{274 + 2 * (r % 2)}")]
        made += send + recv if r % 2 == 0 else recv + send
    return made


def test_of_a_p2p_cycle_of_three_the_one_rank_that_left_a_line_by_a_new_path_is_named_as_likely() -> None:
    """The matrix's mpi-unmatched_recv-w4-first: rank 0 skipped its 2nd send.  Rank 1 waits for it,
    rank 0 in the next all_reduce: a cycle of 0 and 1, rank 2 behind it in its receive from rank 1
    (and rank 3 in the all_reduce).  Only rank 0's calls
    ever went from the broadcast (268) straight to its receive (274)."""
    r4 = (0, 1, 2, 3)
    rank_0 = rank(0, *_mpi_ring(0, skip_send_at=2), call("all_reduce", 5, ranks=r4, site="t.py:267"))
    rank_1 = rank(1, *_mpi_ring(1)[:-2], call("recv", 2, peer=0, ranks=r4, site="t.py:276"))
    rank_2 = rank(2, *_mpi_ring(2)[:-1], call("recv", 2, peer=1, ranks=r4, site="t.py:274"))
    rank_3 = rank(3, *_mpi_ring(3), call("all_reduce", 5, ranks=r4, site="t.py:267"))
    verdict = judge(snap(rank_0, rank_1, rank_2, rank_3))
    assert outline(verdict) == ("deadlock", "p2p_unmatched", [0, 1], [2, 3])
    assert isinstance(verdict.finding, Cycle) and list(verdict.finding.after) == [0]
    assert verdict.summary.endswith(
        "Likely rank 0: its recv #2 from 3 (t.py:274) came right after a call from t.py:268, an order no rank's "
        "calls took before; the others' came in an order taken before."
    )


def test_of_a_p2p_cycle_where_two_ranks_left_a_line_by_new_paths_none_is_likely() -> None:
    """Ranks 0 and 3 both skipped their 2nd send (rank 0 went from 268 to 274, rank 3 from 276 back
    to 267, each a path no other call took): two departures, and nothing tells which hung the ring."""
    r4 = (0, 1, 2, 3)
    states = [
        rank(0, *_mpi_ring(0, skip_send_at=2)[:-1], call("recv", 2, peer=3, ranks=r4, site="t.py:274")),
        rank(1, *_mpi_ring(1)[:-2], call("recv", 2, peer=0, ranks=r4, site="t.py:276")),
        rank(2, *_mpi_ring(2)[:-1], call("recv", 2, peer=1, ranks=r4, site="t.py:274")),
        rank(3, *_mpi_ring(3, skip_send_at=2), call("all_reduce", 5, ranks=r4, site="t.py:267")),
    ]
    verdict = judge(snap(*states))
    assert outline(verdict)[:2] == ("deadlock", "p2p_unmatched")
    assert isinstance(verdict.finding, Cycle) and not verdict.finding.after
    assert "Likely" not in verdict.summary


def test_a_ranks_first_way_out_of_a_line_is_no_departure_even_where_no_other_call_took_it() -> None:
    """Rank 0 skipped its send in the first step: it left the broadcast (268) for its receive (274),
    a path no other call took, but the first time it left that line (a loop's first round does
    so too).  The same skip in the second step, after it had left 268 for its send, is named."""
    cycle = [0, 1, 2]
    first = {r: rank(r, *_mpi_ring(r, skip_send_at=1 if r == 0 else None)) for r in range(4)}
    assert majority.branched(first, cycle) == {}
    second = {r: rank(r, *_mpi_ring(r, skip_send_at=2 if r == 0 else None)) for r in range(4)}
    paths = {r: (a.site, b.site) for r, (a, b) in majority.branched(second, cycle).items()}
    assert paths == {0: ("t.py:268", "t.py:274")}


def test_a_second_way_out_of_a_line_that_another_rank_took_too_is_no_departure() -> None:
    """Rank 0 left its receive (274) once for the all_reduce (267) and then for a barrier at line
    280, a loop's end; rank 2, off the cycle, took that same way: no departure of rank 0's alone."""
    r4 = (0, 1, 2, 3)
    end = ok("barrier", 5, ranks=r4, site="t.py:280")
    states = {r: rank(r, *_mpi_ring(r), *([end] if r in (0, 2) else [])) for r in range(4)}
    assert majority.branched(states, [0, 1, 3]) == {}
    states[2] = rank(2, *_mpi_ring(2))  # rank 0's way alone: named
    assert list(majority.branched(states, [0, 1, 3])) == [0]


def test_a_rank_that_raised_after_a_collective_whose_shapes_differed_is_no_culprit_the_mismatch_is() -> None:
    """The matrix's dtensor-shape-w2-last: Gloo let a scatter of [2, 2] against [3, 2] through;
    rank 0 then raised in its own code, and rank 1 waits in the next scatter.  The calls that
    disagree are the cause, not the rank that tripped on them (a tie: 2 ranks)."""
    rank_0 = rank(0, ok("scatter", 1, shape=(2, 2), root=0, site="t.py:161"),
                  ok("all_gather_into_tensor", 2, shape=(2, 2), site="t.py:162"),
                  finished=True, failed="RuntimeError: shape '[4, 2]' is invalid for input of size 10")
    rank_1 = rank(1, ok("scatter", 1, shape=(3, 2), root=0, site="t.py:161"),
                  ok("all_gather_into_tensor", 2, shape=(3, 2), site="t.py:162"),
                  call("scatter", 3, shape=(3, 2), root=0, site="t.py:161"))
    verdict = judge(snap(rank_0, rank_1))
    assert outline(verdict) == ("deadlock", "mismatch", [0, 1], [])
    assert verdict.call == "scatter #1"


# -- values the ranks must give alike (majority.settings_differ) ------------------------------


def gave(state: RankState, *counts: int) -> RankState:
    """The rank's schedules, made at t.py:5, each with its microbatch count."""
    for count in counts:
        state.apply(Setting("their pipeline schedules' n_microbatches", count, "t.py:5"))
    return state


def verdict_of(snapshot: Snapshot) -> Verdict | None:
    """The watchdog's final verdict, worded."""
    verdict = watchdog.Watch().verdict(snapshot)
    return None if verdict is None else worded(verdict, snapshot.ranks)


def pipeline(counts: list[int], world: int = 4) -> list[RankState]:
    """A pipeline's stages: the last raised in its loss, the others wait to receive from their next."""
    ranks = tuple(range(world))
    stages = [rank(r, call("recv", 1, peer=r + 1, ranks=ranks)) for r in range(world - 1)]
    stages.append(rank(world - 1, finished=True, failed="RuntimeError: The size of tensor a (4) must match"))
    for stage, count in zip(stages, counts, strict=True):
        gave(stage, count)
    return stages


def test_the_stage_whose_microbatch_count_departs_is_named_not_the_stage_that_raised() -> None:
    verdict = verdict_of(snap(*pipeline([2, 4, 4, 4])))
    assert verdict is not None and outline(verdict) == ("deadlock", "mismatch", [0], [1, 2, 3])
    assert verdict.summary.startswith(
        "ranks 0-3 disagree on their pipeline schedules' n_microbatches: rank 0 gave 2 (t.py:5), ranks 1-3 gave 4"
        " (t.py:5). What came of it: rank 3 failed (RuntimeError: The size of tensor a (4) must match)"
    )


def test_two_stages_that_give_two_counts_are_both_named() -> None:
    verdict = verdict_of(snap(*pipeline([4, 2], world=2)))
    assert verdict is not None and outline(verdict) == ("deadlock", "mismatch", [0, 1], [])


def test_the_first_of_several_values_that_differs_decides() -> None:
    stages = pipeline([4, 4, 4, 4])
    gave(stages[0], 8)
    gave(stages[1], 8)
    gave(stages[2], 2)  # the third stage's second schedule departs; the last stage made one schedule
    assert outline(verdict_of(snap(*stages)) or Verdict("wait")) == ("deadlock", "rank_exited", [3], [0, 1, 2])
    gave(stages[3], 8)
    assert outline(verdict_of(snap(*stages)) or Verdict("wait")) == ("deadlock", "mismatch", [2], [0, 1, 3])


def test_values_alike_or_a_test_that_passed_leave_the_verdict_as_it_is() -> None:
    assert outline(verdict_of(snap(*pipeline([4, 4, 4, 4]))) or Verdict("wait"))[1] == "rank_exited"
    two_pipelines = pipeline([2, 2, 4, 4])  # ranks 0, 1 and ranks 2, 3: pipelines of their own
    for stage, group in zip(two_pipelines, ["1", "1", "2", "2"], strict=True):
        stage.settings[0].group = group
    assert outline(verdict_of(snap(*two_pipelines)) or Verdict("wait"))[1] == "rank_exited"
    passed = [gave(rank(r, finished=True), count) for r, count in enumerate([4, 2])]
    assert verdict_of(snap(*passed)) == Verdict("done")


def test_of_two_ends_of_a_connection_the_one_the_test_cut_on_purpose_is_named() -> None:
    # Both ends raised "Connection closed by peer"; the test had disconnected rank 1's network.
    def ends() -> list[RankState]:
        error = "RuntimeError: Connection closed by peer"
        zero = rank(0, ok("send", 1, peer=1), call("recv", 1, peer=1, state="raised", error=error),
                    finished=True, failed=error)
        one = rank(1, ok("recv", 1, peer=0), call("send", 1, peer=0, state="raised", error=error),
                   finished=True, failed=error)
        return [zero, one]

    assert outline(verdict_of(snap(*ends())) or Verdict("wait")) == ("done", "failed", [0, 1], [])
    cut = ends()
    cut[1].apply(Injected("disconnect on rank 1 at send call 1", "disconnect", "send", 1))
    verdict = verdict_of(snap(*cut))
    assert verdict is not None and outline(verdict) == ("done", "failed", [1], [0])
    assert verdict.summary == (
        "rank 1 raised RuntimeError: Connection closed by peer in send #1 to 0 (t.py:11); "
        "then rank 0 raised RuntimeError: Connection closed by peer in recv #1 from 1 (t.py:11)."
    )


def test_a_peer_that_died_of_the_cut_connection_first_is_not_named() -> None:
    # Gloo aborted rank 0 in its receive from rank 1, whose network the test cut; rank 1 raised after.
    error = "RuntimeError: Connection closed by peer"
    zero = rank(0, ok("send", 1, peer=1), call("recv", 1, peer=1), exit_code=-6)
    one = rank(1, ok("recv", 1, peer=0), call("send", 1, peer=0, state="raised", error=error),
               finished=True, failed=error)
    assert outline(verdict_of(snap(zero, one)) or Verdict("wait")) == ("done", "rank_exited", [0], [1])
    one.apply(Injected("disconnect on rank 1 at send call 1", "disconnect", "send", 1))
    assert outline(verdict_of(snap(zero, one)) or Verdict("wait")) == ("done", "rank_exited", [1], [0])
    zero.calls[-1].exit = NOW - 0.6  # aborted after its receive returned: its asynchronous work failed
    assert zero.died_in is None
    assert outline(verdict_of(snap(zero, one)) or Verdict("wait")) == ("done", "rank_exited", [1], [0])


def test_a_cut_rank_that_had_not_raised_yet_is_named_not_the_neighbour_it_woke() -> None:
    # The test cut rank 3's network; rank 0's receive from it raised first, and rank 3 is still
    # in its receive when the verdict comes (a loaded machine), once the grace it gets is over.
    r4 = (0, 1, 2, 3)
    states = [
        rank(0, ok("send", 1, peer=1, ranks=r4), raised("recv", 1, 3), finished=True, failed=CLOSED),
        rank(1, ok("recv", 1, peer=0, ranks=r4), call("recv", 2, peer=0, ranks=r4)),
        rank(2, call("recv", 1, peer=1, ranks=r4)),
        rank(3, call("recv", 1, peer=2, ranks=r4)),
    ]
    before = verdict_of(snap(*states))
    assert before is not None and outline(before) == ("deadlock", "rank_exited", [0], [1, 2, 3])
    states[3].apply(Injected("connections to its peers broken on rank 3 at recv call 1", "disconnect", "recv", 1))
    watch = watchdog.Watch()
    assert watch.verdict(snap(*states)) is None  # rank 3 may still raise: it gets the grace
    later = dataclasses.replace(snap(*states), now=NOW + 2.5)
    verdict = worded(watch.verdict(later) or Verdict("wait"), later.ranks)
    assert outline(verdict) == ("deadlock", "rank_exited", [3], [0, 1, 2])
    assert verdict.summary.startswith(
        "connections to its peers broken on rank 3 at recv call 1 (faults.disconnect)."
        " What came of it: rank 0 raised RuntimeError: Connection closed by peer in recv #1 from 3"
    )


def test_of_the_ranks_a_cut_woke_in_a_collective_the_cut_rank_alone_is_named() -> None:
    """Gloo's ring: the cut rank 1 and its neighbours 0 and 2 raised in all_reduce #2; rank 3 waits
    in it.  Ranks still in their calls where a connection was cut get the grace, not only the settle
    time: the cut rank may raise after the neighbours it woke (the matrix's
    classic-disconnect-w8-first, on a loaded machine, named its woken neighbour)."""
    r4 = (0, 1, 2, 3)

    def woke(r: int) -> RankState:
        return rank(r, ok("all_reduce", 1, ranks=r4), call("all_reduce", 2, state="raised", ranks=r4, error=CLOSED),
                    finished=True, failed=CLOSED)

    states = [woke(0), woke(1), woke(2), rank(3, ok("all_reduce", 1, ranks=r4), call("all_reduce", 2, ranks=r4))]
    assert outline(verdict_of(snap(*states)) or Verdict("wait")) == ("deadlock", "rank_exited", [0, 1, 2], [3])
    states[1].apply(Injected("connections to its peers broken on rank 1 at all_reduce call 2", "disconnect",
                             "all_reduce", 2))
    watch = watchdog.Watch()
    assert watch.verdict(snap(*states)) is None  # rank 3 may still raise: it gets the grace
    settled = dataclasses.replace(snap(*states), now=NOW + watchdog.SETTLE)
    assert watch.verdict(settled) is None  # past the settle time, within the grace
    later = dataclasses.replace(snap(*states), now=NOW + 2.5)
    verdict = worded(watch.verdict(later) or Verdict("wait"), later.ranks)
    assert outline(verdict) == ("deadlock", "rank_exited", [1], [3])
    assert verdict.summary.startswith("rank 1 raised RuntimeError: Connection closed by peer in all_reduce #2")
    # The woken neighbours' copies of one error are said once.
    assert "; ranks 0, 2 raised RuntimeError: Connection closed by peer in all_reduce #2" in verdict.summary


def test_a_tie_in_a_collective_waits_for_its_members_still_on_their_way_whose_calls_make_a_majority() -> None:
    """Ranks 0 and 1 entered all_reduce #2 with other dtypes while ranks 2 and 3 still run towards
    it (8 ranks on 2 cores: the matrix's dtensor-dtype-w8-last): the verdict waits past the settle
    time for them, up to the grace, and then names the one rank the majority leaves."""
    def entered(r: int, dtype: str = "float32") -> RankState:
        return rank(r, ok("all_reduce", 1, ranks=R4), call("all_reduce", 2, ranks=R4, dtype=dtype))

    on_the_way = [rank(r, ok("all_reduce", 1, ranks=R4)) for r in (2, 3)]
    watch = watchdog.Watch()
    assert watch.verdict(snap(entered(0), entered(1, "float64"), *on_the_way)) is None
    later = dataclasses.replace(snap(entered(0), entered(1, "float64"), *on_the_way), now=NOW + watchdog.SETTLE)
    assert watch.verdict(later) is None  # a tie the others may break: not yet
    arrived = dataclasses.replace(snap(*(entered(r, "float64" if r == 1 else "float32") for r in range(4))),
                                  now=NOW + watchdog.SETTLE + 0.1)
    verdict = watch.verdict(arrived)
    assert verdict is not None and outline(verdict) == ("deadlock", "mismatch", [1], [0, 2, 3])
    # Where they never come, the tie is told once the grace is over.
    never = dataclasses.replace(snap(entered(0), entered(1, "float64"), *on_the_way), now=NOW + 2.0)
    verdict = watch.verdict(never)
    assert verdict is not None and outline(verdict) == ("deadlock", "mismatch", [0, 1], [])
    # Members still leaving all_reduce #1 (which the two left) are on their way too; a member in
    # another group's collective is not.
    finishing = [rank(r, call("all_reduce", 1, ranks=R4)) for r in (2, 3)]
    assert watchdog.Watch().verdict(snap(entered(0), entered(1, "float64"), *finishing)) is None
    elsewhere = [rank(r, call("all_reduce", 1, group="2", ranks=(2, 3))) for r in (2, 3)]
    verdict = watchdog.Watch().verdict(snap(entered(0), entered(1, "float64"), *elsewhere))
    assert verdict is not None and outline(verdict)[:3] == ("deadlock", "mismatch", [0, 1])


def test_two_ranks_taking_two_groups_in_other_orders_wait_for_the_members_still_on_their_way() -> None:
    """The matrix's classic-cycle-w4-last under load: rank 0 waits in group 1, rank 3 in group 2,
    ranks 1 and 2 not there yet; as many on each side, until they come to group 1 too."""
    def waiting_in(r: int, group: str) -> RankState:
        return rank(r, call("all_reduce", 1, group=group, ranks=R4))

    watch = watchdog.Watch()
    early = snap(waiting_in(0, "1"), rank(1), rank(2), waiting_in(3, "2"))
    assert outline(watchdog.judge(early))[:3] == ("deadlock", "mismatch", [0, 3])  # the tie it was
    assert watch.verdict(early) is None
    assert watch.verdict(dataclasses.replace(early, now=NOW + watchdog.SETTLE)) is None
    arrived = dataclasses.replace(snap(*(waiting_in(r, "2" if r == 3 else "1") for r in range(4))),
                                  now=NOW + watchdog.SETTLE + 0.1)
    verdict = watch.verdict(arrived)
    assert verdict is not None and outline(verdict)[:3] == ("deadlock", "mismatch", [3])

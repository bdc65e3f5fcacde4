"""The majority's rules for a send or receive more (diagnose/majority.py), on hand-made rank
states of a ring (tests/matrix/families.py's p2p body): each rank sends to the next and
receives from the previous, three steps."""

from __future__ import annotations

from test_watchdog import call, judge, ok, outline, rank, snap

from pytest_ddp.diagnose.state import Call, RankState

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

"""init_process_group's faults that every rank agrees on (a world size, an address), judged on
hand-made snapshots: no processes."""

from __future__ import annotations

import dataclasses

from snapshots import NOW, call, judge, outline, rank, snap

from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.state import Call

STORE = "127.0.0.1:29500"


def init(given: int, size: int = 2, address: str | None = STORE, method: str = "env://") -> Call:
    extra = {"rank": given, "world_size": size, "init_method": method}
    if address is not None:
        extra["address"] = address
    return call("init_process_group", 0, shape=None, enter=NOW - 1, site="t.py:5", extra=extra)


def test_a_world_size_every_process_passed_larger_than_the_processes_names_them_all() -> None:
    verdict = judge(snap(rank(0, init(0, 3)), rank(1, init(1, 3))))
    assert outline(verdict) == ("deadlock", "init", [0, 1], [])
    assert verdict.summary == (
        "processes 0, 1 passed world_size 3 to init_process_group, where 2 processes run: rank 2 never comes;"
        " processes 0, 1 wait in init_process_group (t.py:5)."
    )
    four = judge(snap(rank(0, init(0, 4)), rank(1, init(1, 4))))
    assert "where 2 processes run: ranks 2, 3 never come;" in four.summary


def test_the_world_size_of_the_processes_that_run_is_waited_for() -> None:
    assert judge(snap(rank(0, init(0, 2)), rank(1, init(1, 2)))).status == "wait"
    # A process not yet in init_process_group may pass another size: nothing is certain.
    assert judge(snap(rank(0, init(0, 3)), rank(1, init(1, 3)), rank(2))).status == "wait"


def test_the_process_that_dialled_another_address_than_the_store_is_named() -> None:
    wrong = init(1, address="127.0.0.1:29507")
    verdict = judge(dataclasses.replace(snap(rank(0, init(0)), rank(1, wrong)), store=STORE))
    assert outline(verdict) == ("deadlock", "init", [1], [0])
    assert verdict.summary == (
        "process 1 dialled 127.0.0.1:29507 (MASTER_ADDR:MASTER_PORT), not the rank group's store at"
        " 127.0.0.1:29500, in init_process_group; processes 0, 1 wait in init_process_group (t.py:5)."
    )


def test_without_the_store_the_fewest_addresses_are_named_and_on_a_tie_those_that_missed_rank_0s() -> None:
    other = "10.0.0.1:29500"
    three = snap(rank(0, init(0, 3)), rank(1, init(1, 3, address=other, method=f"tcp://{other}")),
                 rank(2, init(2, 3)))
    verdict = judge(three)
    assert outline(verdict) == ("deadlock", "init", [1], [0, 2])
    assert verdict.summary.startswith(
        "process 1 dialled 10.0.0.1:29500 (init_method), where processes 0, 2 dialled 127.0.0.1:29500"
        " (MASTER_ADDR:MASTER_PORT), in init_process_group;"
    )
    # A tie: rank 0 serves the store where it dialled (pytorch#53395: each process its own free port).
    tie = judge(snap(rank(0, init(0, 3)), rank(1, init(1, 3, address=other)), rank(2, init(2, 3, address="b:1"))))
    assert outline(tie) == ("deadlock", "init", [1, 2], [0])
    assert tie.summary.startswith(
        "process 1 dialled 10.0.0.1:29500 (MASTER_ADDR:MASTER_PORT); process 2 dialled b:1 (MASTER_ADDR:MASTER_PORT),"
        " where process 0 dialled 127.0.0.1:29500 (MASTER_ADDR:MASTER_PORT) and, as rank 0, serves the"
        " rendezvous's store there, in init_process_group;"
    )
    # A tie with no process that passed rank 0 (it has not called yet): nothing tells.
    early = snap(rank(0, init(1, 3)), rank(1, init(2, 3, address=other)), rank(2))
    assert judge(early).status == "wait"


def test_processes_each_alone_in_their_world_may_dial_their_own_stores() -> None:
    alone = snap(rank(0, init(0, 1, address="127.0.0.1:1")), rank(1, init(0, 1, address="127.0.0.1:2")))
    assert judge(dataclasses.replace(alone, store=STORE)).status == "wait"


def test_a_rendezvous_of_the_tests_own_store_is_no_address() -> None:
    """A store passed to init_process_group dials nothing the recorder knows: no address, no fault."""
    verdict = judge(dataclasses.replace(
        snap(rank(0, init(0, address=None, method="store")), rank(1, init(1))), store=STORE,
    ))
    assert verdict.status == "wait"


def test_the_store_spelled_another_way_is_the_store() -> None:
    spelled = init(1, address="localhost:29500")
    assert judge(dataclasses.replace(snap(rank(0, init(0)), rank(1, spelled)), store=STORE)).status == "wait"


def test_an_address_every_process_dialled_that_none_of_their_hosts_has_names_them_all() -> None:
    """pytorch#49084: MASTER_ADDR set to an address that is not node 0's, on every node: nothing of
    the group can serve a store there.  The recorder says whether a process's host has the address
    (``elsewhere``)."""
    away = "192.0.2.1:29500"

    def dialling(given: int, elsewhere: bool | None = True) -> Call:
        made = init(given, address=away)
        made.extra["elsewhere"] = elsewhere
        return made

    verdict = judge(dataclasses.replace(snap(rank(0, dialling(0)), rank(1, dialling(1))), store=STORE))
    assert outline(verdict) == ("deadlock", "init", [0, 1], [])
    assert verdict.summary.startswith(
        "processes 0, 1 dialled 192.0.2.1:29500 (MASTER_ADDR:MASTER_PORT) in init_process_group, an address"
        " none of their hosts has, not the rank group's store at 127.0.0.1:29500: no process of the group"
        " serves one there;"
    )
    # a process not yet in init_process_group may dial the store
    assert judge(dataclasses.replace(snap(rank(0, dialling(0)), rank(1)), store=STORE)).status == "wait"
    # the address may still route back to a store here: the rendezvous gets the grace first
    for entered, final in ((NOW - 1, False), (NOW - 3, True)):
        early = [dialling(r) for r in (0, 1)]
        for made in early:
            made.enter = entered
        watched = watchdog.Watch().verdict(dataclasses.replace(snap(*map(rank, (0, 1), early)), store=STORE))
        assert (watched is not None) is final, entered
    # the address of one's host (or one the recorder could not tell), or the store's: nothing certain
    for elsewhere in (False, None):
        one = snap(rank(0, dialling(0, elsewhere)), rank(1, dialling(1)))
        assert judge(dataclasses.replace(one, store=STORE)).status == "wait", elsewhere
    assert judge(dataclasses.replace(snap(rank(0, dialling(0)), rank(1, dialling(1))), store=away)).status == "wait"

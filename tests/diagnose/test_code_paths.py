"""Whether code could go from one call's line to the next without a call between
(pytest_ddp/diagnose/code_paths.py), on hand-written sources; and which files the controller
reads for it (groups/runner.py)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from snapshots import lines_of

from pytest_ddp.diagnose.code_paths import Leave, calls_between, exits_after, leaves_in_own_branch
from pytest_ddp.groups import runner

LOOP = textwrap.dedent("""
    def step(grad):
        for _ in range(3):
            dist.all_reduce(grad)  # reduce
            dist.broadcast(grad, src=0)  # broadcast
        dist.barrier()  # barrier
""")
AT = lines_of(LOOP)
MADE = {AT["reduce"]: "all_reduce", AT["broadcast"]: "broadcast"}


def test_a_call_right_after_one_of_its_own_line_skipped_the_call_the_loop_makes_between() -> None:
    assert calls_between(LOOP, AT["broadcast"], AT["broadcast"], MADE) == [AT["reduce"]]


def test_the_loops_way_back_and_its_way_on_make_no_call_between() -> None:
    assert calls_between(LOOP, AT["broadcast"], AT["reduce"], MADE) == []
    assert calls_between(LOOP, AT["reduce"], AT["broadcast"], MADE) == []
    assert calls_between(LOOP, AT["broadcast"], AT["barrier"], MADE) == []


def test_a_call_under_a_condition_may_not_be_made() -> None:
    for guarded in ("if rank:\n            dist.all_reduce(grad)  # reduce",
                    "rank and dist.all_reduce(grad)  # reduce",
                    "dist.all_reduce(grad) if rank else None  # reduce",
                    "[dist.all_reduce(g) for g in grads]  # reduce"):
        source = LOOP.replace("dist.all_reduce(grad)  # reduce", guarded)
        at = lines_of(source)
        made = {at["reduce"]: "all_reduce", at["broadcast"]: "broadcast"}
        assert calls_between(source, at["broadcast"], at["broadcast"], made) == [], guarded


def test_a_line_whose_calls_a_library_made_is_no_call_of_its_own() -> None:
    # DDP's all_reduce comes from backward(), which need not make one (no_sync).
    source = LOOP.replace("dist.all_reduce(grad)", "model(grad).sum().backward()")
    assert calls_between(source, AT["broadcast"], AT["broadcast"], MADE) == []


def test_a_call_skipped_in_either_branch_of_a_ring_is_the_one_that_would_have_led_there() -> None:
    source = textwrap.dedent("""
        def ring(rank, t):
            for _ in range(3):
                if rank % 2 == 0:
                    dist.send(t, dst=1)  # send
                    dist.recv(t, src=1)  # recv
                else:
                    dist.recv(t, src=0)  # recv_first
                    dist.send(t, dst=0)  # send_after
    """)
    at = lines_of(source)
    made = {at["send"]: "send", at["recv"]: "recv", at["recv_first"]: "recv", at["send_after"]: "send"}
    assert calls_between(source, at["send_after"], at["send_after"], made) == [at["recv_first"]]
    assert calls_between(source, at["recv"], at["recv"], made) == [at["send"]]
    assert calls_between(source, at["recv"], at["send"], made) == []


def test_continue_and_a_call_that_raised_before_it_was_made_are_ways_round() -> None:
    """A statement that makes a call may raise before it (its arguments): where that is caught in
    the function, or the function is called again, the code goes on without the call."""
    def looping(*lines: str) -> str:
        return "def step(grad):\n    dist.barrier()  # barrier\n    for _ in range(3):\n" + "".join(
            f"        {line}\n" for line in lines)

    reduce, broadcast = "dist.all_reduce(grad)  # reduce", "dist.broadcast(grad, src=0)  # broadcast"
    continues = looping(broadcast, "if late:", "    continue", reduce)
    caught = looping("try:", f"    {reduce}", "except RuntimeError:", "    pass", broadcast)
    # ... but not where the broadcast comes after the all_reduce in the try: the exception skips it too.
    in_try = looping("try:", f"    {reduce}", f"    {broadcast}", "except RuntimeError:", "    pass")
    for source, way in [(continues, True), (continues.replace("continue", "pass"), False), (caught, True),
                        (in_try, False)]:
        at = lines_of(source)
        made = {at["reduce"]: "all_reduce", at["broadcast"]: "broadcast", at["barrier"]: "barrier"}
        between = calls_between(source, at["broadcast"], at["broadcast"], made)
        assert between is not None and (between == []) is way and (way or at["reduce"] in between), source


def test_a_break_leads_on_not_back_and_a_helpers_end_leads_to_its_start() -> None:
    breaks = LOOP.replace("dist.broadcast(grad, src=0)  # broadcast",
                          "dist.broadcast(grad, src=0)  # broadcast\n        if done:\n            break")
    at = lines_of(breaks)
    made = {at["reduce"]: "all_reduce", at["broadcast"]: "broadcast", at["barrier"]: "barrier"}
    assert calls_between(breaks, at["broadcast"], at["broadcast"], made) == [at["reduce"]]
    assert calls_between(breaks, at["broadcast"], at["barrier"], made) == []
    # A helper of one step, called in its caller's loop (or again after it raised).
    helper = "def step(grad):\n    dist.all_reduce(grad)  # reduce\n    dist.broadcast(grad, src=0)  # broadcast\n"
    at = lines_of(helper)
    made = {at["reduce"]: "all_reduce", at["broadcast"]: "broadcast"}
    assert calls_between(helper, at["broadcast"], at["broadcast"], made) == [at["reduce"]]
    assert calls_between(helper, at["broadcast"], at["reduce"], made) == []


def test_what_the_walk_does_not_follow_tells_nothing() -> None:
    generator = LOOP.replace("dist.barrier()", "yield grad")
    assert calls_between(generator, AT["broadcast"], AT["broadcast"], MADE) is None
    groups = LOOP.replace("    dist.barrier()  # barrier",
                          "    try:\n        pass\n    except* ValueError:\n        pass")
    assert calls_between(groups, AT["broadcast"], AT["broadcast"], MADE) is None  # except*
    two = "def a():\n    dist.all_reduce(g)  # reduce\n\ndef b():\n    dist.broadcast(g, 0)  # broadcast\n"
    at = lines_of(two)
    assert calls_between(two, at["broadcast"], at["reduce"], {at["reduce"]: "all_reduce"}) is None
    assert calls_between("dist.all_reduce(g)\ndist.broadcast(g, 0)\n", 2, 2, {1: "all_reduce"}) is None  # no function
    assert calls_between("def f(:\n", 1, 1, {}) is None
    assert calls_between(LOOP, 999, 999, MADE) is None


def test_the_controller_reads_a_sites_file_only_where_it_is_a_regular_file_of_bounded_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # sites are relative to the working folder, as the ranks'
    (tmp_path / "t.py").write_text("x = 1\n")
    (tmp_path / 'q"uote.py').write_text("y = 2\n")
    (tmp_path / "big.py").write_text("#" * (runner.SOURCE_LIMIT + 1))
    os.mkfifo(tmp_path / "fifo.py")  # opened for reading, it would block the controller
    read = runner._source_files()
    assert read("t.py") == "x = 1\n" and read(str(tmp_path / "t.py")) == "x = 1\n"
    assert read('q"uote.py') == "y = 2\n"  # as the site gives it (the event's JSON already decoded)
    assert [read(name) for name in ("fifo.py", "big.py", "missing.py", "", "nul\0.py")] == [None] * 5


EXITING = textwrap.dedent("""
    def test_x(rank):
        for step in range(3):
            if rank == 1 and step == 1:
                os._exit(1)  # exit
            dist.all_reduce(grad)  # reduce
        sys.exit(3)  # after
        dist.barrier()  # barrier
""")
EXIT = lines_of(EXITING)


def test_the_exits_reachable_from_a_call_before_the_next_call_are_found() -> None:
    made = {EXIT["reduce"]: "all_reduce", EXIT["barrier"]: "barrier"}
    assert exits_after(EXITING, EXIT["reduce"], made) == [EXIT["exit"], EXIT["after"]]
    # Past the barrier's call, only the function's end: it returned, no exit of the process.
    assert exits_after(EXITING, EXIT["barrier"], made) == []


STOPPING = textwrap.dedent("""
    def test_x(rank):
        for epoch in range(3):
            dist.all_reduce(grad)  # reduce
            if rank == 0 and epoch == 1:
                break  # stop
            if rank != 1:
                return  # several
            if flag:
                break  # any
            dist.broadcast(grad, 0)  # broadcast
            if rank == 2:
                return  # after a call
        dist.barrier()  # barrier
""")
STOP = lines_of(STOPPING)


def _lines(leaves: list[Leave] | None) -> list[tuple[int, int, bool]] | None:
    return None if leaves is None else [(leave.line, leave.test, leave.own) for leave in leaves]


def test_a_break_or_return_in_a_branch_for_the_rank_alone_is_how_it_left() -> None:
    made = {STOP["reduce"]: "all_reduce", STOP["broadcast"]: "broadcast", STOP["barrier"]: "barrier"}
    own = (STOP["stop"], STOP["stop"] - 1, True)
    # ``rank != 1`` holds on rank 0: a test of the rank, not rank 0's own branch, yet a way out
    several = (STOP["several"], STOP["several"] - 1, False)
    assert _lines(leaves_in_own_branch(STOPPING, STOP["reduce"], made, 0)) == [own, several]
    # a branch for another rank, or one the rank's test fails, is not its way; a test of a flag that
    # is alike on every rank is no way of one rank's; rank 2's return comes after a call
    assert _lines(leaves_in_own_branch(STOPPING, STOP["reduce"], made, 1)) == []
    assert _lines(leaves_in_own_branch(STOPPING, STOP["reduce"], made, 2)) == [several]
    after = (STOP["after a call"], STOP["after a call"] - 1, True)
    assert _lines(leaves_in_own_branch(STOPPING, STOP["broadcast"], made, 2)) == [after]
    assert leaves_in_own_branch("def f(:", 1, made, 0) is None
    # from the function's start, every way to rank 0's break passes the all_reduce first
    assert leaves_in_own_branch(STOPPING, STOP["barrier"], made, 0, from_entry=True) == []
    early = "def f(rank):\n    if rank == 1:\n        return\n    dist.barrier()\n"
    assert _lines(leaves_in_own_branch(early, 4, {4: "barrier"}, 1, from_entry=True)) == [(3, 2, True)]


PATIENCE = textwrap.dedent("""
    def test_x(rank):
        bad = 0
        for epoch in range(4):
            dist.all_reduce(grad)  # reduce
            metric = [1.0, 0.9][epoch] if rank == 0 else 1.0
            bad = 0 if metric < 0.95 else bad + 1
            if bad >= 1:
                break  # derived
            if flag:
                break  # alike
""")
PATIENT = lines_of(PATIENCE)


def test_a_leave_under_a_test_of_a_value_that_differs_between_ranks_is_a_way_out_of_any_rank() -> None:
    made = {PATIENT["reduce"]: "all_reduce"}
    derived = (PATIENT["derived"], PATIENT["derived"] - 1, False)
    assert _lines(leaves_in_own_branch(PATIENCE, PATIENT["reduce"], made, 1)) == [derived]
    assert _lines(leaves_in_own_branch(PATIENCE, PATIENT["reduce"], made, 0)) == [derived]


def test_a_step_counters_break_in_a_loop_over_values_that_differ_between_ranks_tells_nothing() -> None:
    # the loop ends by itself on the rank with fewer batches; its counter differs as the data do
    counted = textwrap.dedent("""
        def test_x(rank, world_size):
            step = 0
            for batch in data[rank::world_size]:
                dist.all_reduce(grad)  # reduce
                step += 1
                if step >= max_steps:
                    break
    """)
    at = lines_of(counted)
    assert leaves_in_own_branch(counted, at["reduce"], {at["reduce"]: "all_reduce"}, 0) is None

"""Which ranks the user's code runs a line on, and which of its values differ between ranks
(pytest_ddp/diagnose/rank_tests.py), on hand-written sources."""

from __future__ import annotations

import ast
import textwrap

from snapshots import lines_of

from pytest_ddp.diagnose.rank_tests import (
    branch_for_one_rank,
    branch_for_ranks,
    differs_by_rank,
    one_rank_branch,
    one_rank_value_passed,
    one_rank_value_test,
    uneven_loop,
)

BRANCHES = textwrap.dedent("""
    def test_x(rank, state):
        if rank == 0:
            if ready:
                metric.compute()  # zero
        while state.is_main_process and waiting:
            dist.barrier()  # main
        if rank < 2:
            dist.all_reduce(grad)  # half
        elif rank == 3:
            dist.broadcast(grad, src=3)  # elif
        else:
            dist.barrier()  # else
""")
BRANCH = lines_of(BRANCHES)


def test_a_branch_that_singles_out_one_rank_is_found_above_the_call_nested_or_not() -> None:
    assert one_rank_branch(BRANCHES, BRANCH["zero"]) == BRANCH["zero"] - 2
    assert one_rank_branch(BRANCHES, BRANCH["main"]) == BRANCH["main"] - 1
    assert one_rank_branch(BRANCHES, BRANCH["elif"]) == BRANCH["elif"] - 1


def test_a_branch_of_several_ranks_or_an_else_singles_out_none() -> None:
    assert one_rank_branch(BRANCHES, BRANCH["half"]) is None
    assert one_rank_branch(BRANCHES, BRANCH["else"]) is None
    assert one_rank_branch("def f(:", 1) is None


FLAG_CALLS = textwrap.dedent("""
    def test_x(trainer):
        if trainer.is_world_master():
            dist.all_gather(out, t)  # world
        if trainer.is_local_process_zero():
            dist.barrier()  # local
        if trainer.is_world_process_zero(now):
            dist.barrier()  # argument
""")


def test_a_flag_method_called_with_no_argument_singles_out_its_rank() -> None:
    """transformers' ``Trainer.is_world_master()`` (before 4.0: transformers#7365) is rank 0; a
    host's main process is one rank per host, which is none in particular."""
    tree = ast.parse(FLAG_CALLS)
    line = lines_of(FLAG_CALLS)
    assert branch_for_one_rank(tree, line["world"]) == (line["world"] - 1, 0)
    assert branch_for_one_rank(tree, line["local"]) == (line["local"] - 1, None)
    assert branch_for_one_rank(tree, line["argument"]) is None


VALUES = textwrap.dedent("""
    def test_x(rank):
        seen, both, mine = 0, 0, 0
        for step in range(4):
            if rank == 2 and step > 0:
                seen += 1
                both = 1
                mine = 1
            else:
                both = 2
            if 1 == step:
                mine = 3
            if seen > 1:
                while mine:
                    dist.all_gather(out, t)  # kept
            if both:
                dist.barrier()  # both
            if mine:
                dist.barrier()  # two ranks
""")
VALUE = lines_of(VALUES)


def test_a_test_of_a_value_set_in_one_ranks_branch_alone_names_the_test_and_that_rank() -> None:
    # the innermost such test: ``while mine``, inside ``if seen > 1``
    assert one_rank_value_test(VALUES, VALUE["kept"]) == (VALUE["kept"] - 1, 2)
    assert one_rank_value_test(VALUES, VALUE["both"]) is None  # set in the else too
    # set in rank 2's branch, and in a branch whose test names no rank, which tells no rank
    assert one_rank_value_test(VALUES, VALUE["two ranks"]) == (VALUE["two ranks"] - 1, 2)
    assert one_rank_value_test("def f(:", 1) is None
    two = "def f(rank):\n    if rank == 0:\n        x = 1\n    if rank == 1:\n        x = 2\n    if x:\n        g()\n"
    assert one_rank_value_test(two, 7) is None  # kept on rank 0 and on rank 1: no one rank
    chosen = "def f(rank):\n    x = total if rank == 1 else mine\n    if x < best:\n        g()\n"
    assert one_rank_value_test(chosen, 4) == (3, 1)
    # an input one rank has and the others lack (None): which departs, the code does not say
    for choice in ("batch[1] if rank == 0 else None", "None if rank == 1 else pixels"):
        lacking = f"def f(rank):\n    x1 = {choice}\n    if x1 is not None:\n        g(x1)\n"
        assert one_rank_value_test(lacking, 4) is None, choice


DIFFERING = textwrap.dedent("""
    def test_x(rank, world_size):
        stop, bad, done = False, 0, torch.zeros(1)
        shard = data[rank::world_size]
        batches = []
        for item in shard:
            batches.append(item)
        for batch in batches:  # uneven
            dist.all_reduce(grad)  # reduce
            if rank == 0:
                stop = stopper(batch)
            metric = 0.5 if rank == 0 else 1.0
            bad = bad + 1 if metric > 0.7 else 0
            dist.all_reduce(done)
            if stop:
                break  # kept
            if bad > 1:
                break  # derived
            if done.item():
                break  # agreed
        for step in range(3):  # even
            dist.barrier()  # barrier
""")
DIFF = lines_of(DIFFERING)


def test_a_value_that_differs_between_ranks_is_followed_through_assignments_loops_and_fills() -> None:
    tree = ast.parse(DIFFERING)
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    differs = differs_by_rank(function)
    assert {"shard", "item", "batches", "batch", "stop", "metric", "bad"} <= differs
    # passed to all_reduce: alike on every rank after it; never set from the rank: alike
    assert not {"done", "step", "grad"} & differs



def test_a_loop_over_a_value_that_differs_between_ranks_is_uneven() -> None:
    assert uneven_loop(DIFFERING, DIFF["reduce"]) == DIFF["uneven"]
    assert uneven_loop(DIFFERING, DIFF["barrier"]) is None
    assert uneven_loop("def f(:", 1) is None
    generate = "def f(rank):\n    n = [2, 3][rank]\n    while n:\n        n -= 1\n        model(x)\n"
    assert uneven_loop(generate, 5) == 3


PASSED = textwrap.dedent("""
    def log_dict(metrics, prefix=""):
        for name, value in metrics.items():
            dist.all_gather(out, value)  # gather


    def test_x(rank):
        res = {}
        if rank == 0:
            res = {"loss": loss}
        log_dict(res)  # passed
        log_dict({}, prefix=res)  # untested
        for key in res:
            dist.barrier()  # looped
""")
PASS = lines_of(PASSED)


def test_a_value_kept_on_one_rank_passed_to_what_a_helper_loops_over_names_that_rank() -> None:
    # Lightning#7129: the metrics reduced on rank 0 alone, each logged key all-gathered.
    assert one_rank_value_passed(PASSED, PASS["gather"], PASSED, PASS["passed"]) == (PASS["passed"], 0)
    # passed where the helper's loop does not read it, or a call of another function: nothing
    assert one_rank_value_passed(PASSED, PASS["gather"], PASSED, PASS["untested"]) is None
    assert one_rank_value_passed(PASSED, PASS["gather"], PASSED, PASS["looped"]) is None
    assert one_rank_value_passed("def f(:", 1, PASSED, PASS["passed"]) is None
    # a loop over a kept value in the function itself is such a test
    assert one_rank_value_test(PASSED, PASS["looped"]) == (PASS["looped"] - 1, 0)


def test_a_branch_those_ranks_alone_take_is_found_by_its_test_of_the_rank() -> None:
    code = "def f(rank):\n    if rank in (0, 1):\n        if ready:\n            g()\n"
    assert branch_for_ranks(code, 4, [0, 1], [2]) == 2
    assert branch_for_ranks(code, 4, [0], [1, 2]) is None  # rank 1 takes it too
    assert branch_for_ranks(code.replace("rank in (0, 1)", "rank != 2 and ready"), 4, [0, 1], [2]) == 2
    # a test that reads more than the rank may hold on rank 2 too: no answer
    assert branch_for_ranks(code.replace("rank in (0, 1)", "rank != 2 or ready"), 4, [0, 1], [2]) is None
    assert branch_for_ranks("def f(:", 1, [0], [1]) is None


def test_where_a_value_is_placed_or_a_module_is_called_with_the_rank_is_no_value_that_differs() -> None:
    code = textwrap.dedent("""
        def test_x(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            torch.cuda.set_device(rank)
            model = DDP(Net().to(rank), device_ids=[rank])
            shard = data[rank::world_size]
            batches = []
            batches.append(shard)
    """)
    function = ast.parse(code).body[0]
    assert isinstance(function, ast.FunctionDef)
    assert differs_by_rank(function) == {"shard", "batches"}


def test_a_value_broadcast_from_its_rank_or_set_anew_in_the_helper_is_kept_no_more() -> None:
    broadcast = textwrap.dedent("""
        def test_x(rank):
            obj = [None]
            if rank == 0:
                obj = [{"loss": 1}]
            dist.broadcast_object_list(obj, src=0)
            for key in obj[0]:
                dist.barrier()  # looped
    """)
    assert one_rank_value_test(broadcast, lines_of(broadcast)["looped"]) is None
    head = 'def log_dict(metrics, prefix=""):'
    reset = PASSED.replace(head, head + "\n    metrics = sync(metrics)")
    at = lines_of(reset)
    assert one_rank_value_passed(reset, at["gather"], reset, at["passed"]) is None
    starred = PASSED.replace("log_dict(res)  # passed", "log_dict(*parts, res)  # passed")
    at = lines_of(starred)
    assert one_rank_value_passed(starred, at["gather"], starred, at["passed"]) is None


def test_an_expression_nested_too_deep_answers_nothing_and_raises_nothing() -> None:
    def deep(terms: int) -> str:
        return "def f(rank):\n    x = " + " + ".join(["rank"] * terms) + "\n    for i in x:\n        g()\n"

    assert uneven_loop(deep(2_000), 4) == 3  # deep, yet parsed: walked without recursion
    for terms in (3_000, 30_000):  # past what the parser takes: no answer
        assert uneven_loop(deep(terms), 4) is None
        assert one_rank_value_test(deep(terms), 4) is None

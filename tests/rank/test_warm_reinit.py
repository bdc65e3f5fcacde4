"""Warm ranks outlive their process group: a test that ends the default group, or makes and ends
its own, leaves its ranks to the next test, which gets a fresh group on a fresh store.

Ground truth (pytest_ddp/rank/default_group.py's docstring): a second ``init_process_group`` on the
store an earlier group used fails in Gloo's connectFullMesh, so reuse needs the fresh store.
"""

from __future__ import annotations

import time

import pytest
from torch.distributed import TCPStore

from conftest import line_of
from pytest_ddp.common.ops import DESTROY, INIT
from pytest_ddp.common.protocol import CallEvent, Done, RetEvent
from pytest_ddp.config.spec import RankSpec
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.groups.runner import TestRun, group_is_reusable
from pytest_ddp.groups.spawn import GroupStore

# The same ranks serve every test of these modules: each test asserts it, and the summary line
# says how many groups were started.
SAME_RANKS = """
        pids = {}

        def same_ranks(rank, name):
            pids.setdefault(rank, os.getpid())
            assert pids[rank] == os.getpid(), name
"""


def test_a_test_that_destroys_the_default_group_leaves_warm_ranks_with_a_fresh_group(ddp_pytester) -> None:
    result = ddp_pytester.run(
        SAME_RANKS
        + """
        from torch.distributed.distributed_c10d import _get_default_store, _world

        ended = []

        @pytest.mark.ddp(world_size=2)
        def test_destroys(rank):
            same_ranks(rank, "destroys")
            sub = dist.new_group([0, 1])
            dist.all_reduce(torch.ones(1), group=sub)
            _get_default_store().set("left-by-the-first-test", "x")
            ended.append(dist.group.WORLD)
            dist.destroy_process_group()
            assert not dist.is_initialized()  # the test's own destroy happened for real

        @pytest.mark.ddp(world_size=2)
        def test_after(rank):
            same_ranks(rank, "after")
            world = dist.group.WORLD
            assert world is not ended[0]
            assert not _get_default_store().check(["left-by-the-first-test"])  # a fresh store
            assert world.group_name == "0" and _world.group_count == 1  # no subgroups left
            assert world._get_sequence_number_for_group() == 0
            t = torch.ones(1) * (rank + 1)
            dist.all_reduce(t)
            assert t.item() == 3
            sub = dist.new_group([0, 1])
            dist.all_reduce(t, group=sub)
            assert sub.group_name == "1"
        """,
        "-v",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*ddp: 2 tests on 1 rank group started*"])


def test_init_false_tests_that_make_and_end_their_own_group_share_warm_ranks(ddp_pytester) -> None:
    result = ddp_pytester.run(
        SAME_RANKS
        + """
        @pytest.mark.ddp(world_size=2, init=False)
        @pytest.mark.parametrize("i", range(3))
        def test_own_group(rank, i):
            same_ranks(rank, i)
            dist.init_process_group("gloo")  # env://: the store in MASTER_PORT
            t = torch.ones(1) * (i + 1)
            dist.all_reduce(t)
            assert t.item() == 2 * (i + 1)
            dist.destroy_process_group()
        """,
        "-v",
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*ddp: 3 tests on 1 rank group started*"])


def test_a_group_ended_on_one_rank_and_replaced_by_the_tests_own_is_joined_afresh(ddp_pytester) -> None:
    result = ddp_pytester.run(
        SAME_RANKS
        + """
        own = []

        @pytest.mark.ddp(world_size=2)
        def test_replaces_on_rank_0(rank, tmp_path_factory):
            same_ranks(rank, "replaces")
            if rank == 0:
                dist.destroy_process_group()
                store = dist.HashStore()
                dist.init_process_group("gloo", store=store, rank=0, world_size=1)
                own.append(dist.group.WORLD)

        @pytest.mark.ddp(world_size=2)
        def test_after(rank):
            same_ranks(rank, "after")
            assert dist.group.WORLD not in own
            assert dist.get_world_size() == 2
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2
        """,
        "-v",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*ddp: 2 tests on 1 rank group started*"])


def test_a_hang_after_a_fresh_group_is_reported_with_the_fresh_groups_sequence(ddp_pytester) -> None:
    path = ddp_pytester.write(
        """
        @pytest.mark.ddp(world_size=2)
        def test_destroys():
            dist.all_reduce(torch.ones(1))
            dist.destroy_process_group()

        @pytest.mark.ddp(world_size=2, timeout=5)
        def test_hangs(rank):
            if rank == 1:
                dist.all_reduce(torch.zeros(1))
        """
    )
    result = ddp_pytester.pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            f"*rank 1*all_reduce #1 (test_it.py:{line_of(path, 'torch.zeros(1)')})*",
            "*ddp: 2 tests on 1 rank group started*",
        ]
    )


def test_a_group_an_init_false_test_left_is_ended_before_the_next_test(ddp_pytester) -> None:
    result = ddp_pytester.run(
        SAME_RANKS
        + """
        @pytest.mark.ddp(world_size=2, init=False)
        @pytest.mark.parametrize("i", range(2))
        def test_leaves_its_group(rank, i):
            same_ranks(rank, i)
            assert not dist.is_initialized()  # as in a fresh process
            dist.init_process_group("gloo")
            dist.barrier()
        """,
        "-v",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*ddp: 2 tests on 1 rank group started*"])


def test_a_module_fixtures_group_stays_for_its_tests_and_its_store_is_renewed_after_it(ddp_pytester) -> None:
    ddp_pytester.pytester.makepyfile(
        conftest="""
        pids = {}
        """
    )
    for name in ("test_a", "test_b"):
        ddp_pytester.write(
            """
            import conftest

            def same_ranks(rank):
                assert conftest.pids.setdefault(rank, os.getpid()) == os.getpid()

            @pytest.fixture(scope="module")
            def module_group():
                dist.init_process_group("gloo")
                yield dist.group.WORLD
                dist.destroy_process_group()

            @pytest.mark.ddp(world_size=2, init=False)
            @pytest.mark.parametrize("i", range(2))
            def test_uses_it(module_group, rank, i):
                same_ranks(rank)
                assert dist.group.WORLD is module_group
                sub = dist.new_group([0, 1])  # on the module's store
                dist.all_reduce(torch.ones(1), group=sub)
            """,
            name=name,
        )
    result = ddp_pytester.pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*ddp: 4 tests on 1 rank group started*"])


# -- the controller's decisions, on hand-made rank states --------------------------


def _states(calls: list[tuple[str, str | None]] = (), intact: bool = True, alive: bool = False) -> list[RankState]:
    """Two ranks that made ``calls`` ((op, init_method)) and ended the test so."""
    states = []
    for rank in (0, 1):
        state = RankState(rank=rank)
        for index, (op, method) in enumerate(calls):
            state.apply(CallEvent(index, op, extra={} if method is None else {"init_method": method}))
            state.apply(RetEvent(index))
        state.apply(Done(group_intact=intact, group_alive=alive))
        states.append(state)
    return states


class _Alive:
    alive = True


@pytest.mark.parametrize(
    "states", [_states([(DESTROY, None)], intact=False), _states([(DESTROY, None), (INIT, "env://")], alive=True)]
)
def test_a_gloo_group_whose_default_group_was_ended_or_replaced_stays_warm(states: list[RankState]) -> None:
    spec = RankSpec(world_size=2, backend="gloo", timeout=60.0, grace=2.0)
    run = TestRun("t", spec, states, Verdict("done"), 0.1, time.time())
    assert group_is_reusable(run, _Alive())  # type: ignore[arg-type]


def test_the_store_is_renewed_after_a_rendezvous_on_it_once_no_default_group_is_left() -> None:
    store = GroupStore("127.0.0.1", 2, 60.0)
    try:
        assert not store.spent(_states())
        assert not store.spent(_states([(INIT, "store"), (INIT, "file:///tmp/x")], alive=True))
        assert store.spent(_states(intact=False))  # a group ended or replaced, or a test's own left
        # A fixture's group, made by a rendezvous on the store: kept while it lives, which may use the store.
        assert not store.spent(_states([(INIT, "env://")], alive=True))
        assert not store.spent(_states(alive=True))
        assert store.spent(_states())  # it was ended
        TCPStore("127.0.0.1", store.port, is_master=False).set("left", "x")
        port = store.renew()
        assert not TCPStore("127.0.0.1", port, is_master=False).check(["left"])
        assert not store.spent(_states())
    finally:
        store.close()

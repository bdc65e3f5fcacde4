"""Warm rank groups: reused across tests like one pytest process, replaced after a hang."""

from __future__ import annotations

import pytest

from conftest import line_of, live_pids


def test_module_fixture_runs_once_per_rank_and_per_test_state_stays_per_test(
    ddp_pytester, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("LOG_DIR", str(tmp_path))
    result = ddp_pytester.run(
        """
        @pytest.fixture(scope="module")
        def shared(rank):
            with open(os.path.join(os.environ["LOG_DIR"], f"setup{rank}"), "a") as f:
                f.write("x")
            yield
            with open(os.path.join(os.environ["LOG_DIR"], f"teardown{rank}"), "a") as f:
                f.write("x")

        seen_tmp = []

        @pytest.mark.ddp(world_size=2)
        @pytest.mark.parametrize("i", range(3))
        def test_uses_shared(shared, i, tmp_path, monkeypatch):
            assert "PER_TEST" not in os.environ
            monkeypatch.setenv("PER_TEST", str(i))
            assert tmp_path not in seen_tmp
            seen_tmp.append(tmp_path)
            dist.barrier()
        """
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*ddp: 3 tests on 1 rank group started*"])
    for rank in (0, 1):
        assert (tmp_path / f"setup{rank}").read_text() == "x"
        assert (tmp_path / f"teardown{rank}").read_text() == "x"


def test_hang_costs_one_test_and_the_next_gets_fresh_ranks(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_before():
            dist.barrier()

        @pytest.mark.ddp(world_size=2, timeout=3)
        def test_hangs(rank):
            if rank == 0:
                time.sleep(3600)
            dist.barrier()

        @pytest.mark.ddp(world_size=2)
        def test_after():
            dist.barrier()
        """,
        "-v",
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_before PASSED*", "*test_hangs FAILED*", "*test_after PASSED*",
            "*3 tests on 2 rank groups started*",
        ]
    )


def test_isolated_tests_and_world_sizes_get_their_own_groups(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        pids = set()

        @pytest.mark.ddp(world_size=2)
        def test_a():
            pids.add(os.getpid())

        @pytest.mark.ddp(world_size=2, isolated=True)
        def test_isolated():
            pass

        @pytest.mark.ddp(world_size=1)
        def test_other_size():
            pass

        @pytest.mark.ddp(world_size=2)
        def test_b():
            assert os.getpid() in pids  # the warm group of test_a
        """
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*4 tests on 3 rank groups started*"])


def test_a_test_that_destroys_the_group_does_not_poison_the_next(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_destroys():
            dist.destroy_process_group()

        @pytest.mark.ddp(world_size=2)
        def test_after():
            dist.barrier()
        """
    )
    result.assert_outcomes(passed=2)
    # The same ranks, with a fresh group (tests/rank/test_warm_reinit.py).
    result.stdout.fnmatch_lines(["*2 tests on 1 rank group started*"])


def test_work_left_in_flight_or_groups_of_other_members_fail_the_test_and_the_next_gets_fresh_ranks(
    ddp_pytester,
) -> None:
    path = ddp_pytester.write(
        """
        @pytest.mark.ddp(world_size=2)
        def test_leaves_a_receive(rank):
            if rank == 1:
                dist.irecv(torch.zeros(1), src=0)  # nobody sends

        @pytest.mark.ddp(world_size=2)
        def test_after():
            dist.barrier()

        @pytest.mark.ddp(world_size=2)
        def test_groups_of_other_members_meet_by_chance(rank):
            dist.new_group([rank])  # pytorch#130102: each rank must pass the same ranks
        """
    )
    result = ddp_pytester.pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "asynchronous work left in flight [[]ddp failed*]",
            f"*rank 1: irecv #1 from 0 (test_it.py:{line_of(path, 'dist.irecv')}): *",
            "ranks 0, 1 disagree on the members of new_group #1 (test_it.py:*): rank 0 passed [[]0]; rank 1*",
            "*3 tests on 2 rank groups started*",
        ]
    )


def test_asynchronous_work_that_completed_keeps_the_group(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_never_waits(rank):
            dist.all_reduce(torch.ones(1), async_op=True)
            if rank == 0:
                dist.isend(torch.ones(1), dst=1)
            else:
                dist.recv(torch.zeros(1), src=0)

        @pytest.mark.ddp(world_size=2)
        def test_after():
            dist.barrier()
        """
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*2 tests on 1 rank group started*"])


def test_a_collective_that_raised_in_its_argument_checks_keeps_the_group_one_that_timed_out_does_not(
    ddp_pytester,
) -> None:
    """torch's own tests make collectives raise on purpose.  One that raised before Gloo was handed
    it (a reduce op complex numbers do not have, an empty output list) left the group as it was;
    one that Gloo took and that timed out there did not: the next test gets fresh ranks (torch's
    test_barrier_timeout_full_group, written shorter)."""
    result = ddp_pytester.run(
        """
        import datetime

        @pytest.mark.ddp(world_size=2)
        def test_argument_checks():
            with pytest.raises(ValueError, match="complex"):
                dist.all_reduce(torch.ones(2, dtype=torch.cfloat), op=dist.ReduceOp.MAX)
            with pytest.raises(ValueError, match="at least 1"):
                dist.scatter_object_list([], [1, 2], src=0)

        @pytest.mark.ddp(world_size=2)
        def test_on_the_same_group():
            dist.barrier()

        @pytest.mark.ddp(world_size=2)
        def test_timed_out_in_gloo(rank, ddp_shared_path):
            hasty = dist.new_group(timeout=datetime.timedelta(seconds=0.5))
            gave_up = ddp_shared_path / "rank0-gave-up"
            while rank == 1 and not gave_up.exists():  # the fault: rank 1 comes once rank 0 gave up
                time.sleep(0.01)
            with pytest.raises(RuntimeError):
                dist.barrier(group=hasty)
            gave_up.touch()

        @pytest.mark.ddp(world_size=2)
        def test_after():
            dist.barrier()
        """
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*4 tests on 2 rank groups started*"])


def test_after_a_failure_the_next_test_is_not_started_ahead(ddp_pytester, tmp_path, monkeypatch) -> None:
    # The next test goes to the ranks before the controller reports a passing
    # one; never after a failure, which may end the session (-x).
    monkeypatch.setenv("LOG_DIR", str(tmp_path))
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_passes():
            dist.barrier()

        @pytest.mark.ddp(world_size=2)
        def test_fails():
            assert False

        @pytest.mark.ddp(world_size=2)
        def test_never_runs(rank):
            open(os.path.join(os.environ["LOG_DIR"], f"ran{rank}"), "w").close()
        """,
        "-x",
    )
    result.assert_outcomes(passed=1, failed=1)
    assert list(tmp_path.iterdir()) == []


def test_a_test_started_ahead_that_the_session_never_reports_leaves_no_rank(
    ddp_pytester, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("LOG_DIR", str(tmp_path))
    ddp_pytester.pytester.makeconftest(
        """
        import os

        def pytest_runtest_logreport(report):
            in_controller = "RANK" not in os.environ
            if in_controller and report.when == "call" and report.passed:
                raise KeyboardInterrupt  # Ctrl-C while the next test already runs on the ranks
        """
    )
    ddp_pytester.write(
        """
        @pytest.mark.ddp(world_size=2)
        def test_passes(rank):
            with open(os.path.join(os.environ["LOG_DIR"], f"{rank}.pid"), "w") as f:
                f.write(str(os.getpid()))

        @pytest.mark.ddp(world_size=2)
        def test_started_ahead():
            time.sleep(3600)  # on the same ranks
        """
    )
    result = ddp_pytester.pytester.runpytest_inprocess("-p", "no:cacheprovider", no_reraise_ctrlc=True)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    ranks = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(ranks) == 2 and live_pids(ranks) == []


def test_ranks_do_not_walk_the_forkservers_heap(ddp_pytester) -> None:
    # Frozen before the fork: the ranks' garbage collector leaves torch's objects
    # (and the memory pages they live on) alone.
    ddp_pytester.run(
        """
        import gc

        @pytest.mark.ddp(world_size=1)
        def test_frozen():
            assert gc.get_freeze_count() > 0
        """
    ).assert_outcomes(passed=1)


GROUPS_ALIVE = """
def live_ranks(tmp_path_factory):
    # This session's live ranks: those with a file open in its groups' folders
    # (an xdist worker's own session may keep ranks of its own from the same forkserver).
    session = str(tmp_path_factory.getbasetemp().parent.parent)  # <session>/pytest-ddp-*/rank0.tmp
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if not f.read().startswith("ddp-rank"):
                    continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(session + "/pytest-ddp-"):
                    pids.append(int(pid))
                    break
            except OSError:
                pass
    return sorted(pids)

@pytest.mark.ddp(world_size=2)
def test_two_ranks():
    pass

@pytest.mark.ddp(world_size=1)
def test_one_rank_a():
    pass

@pytest.mark.ddp(world_size=2)
def test_two_ranks_again():
    pass

@pytest.mark.ddp(world_size=1)
def test_one_rank_b(tmp_path_factory):
    assert live_ranks(tmp_path_factory) == [os.getpid()], "WHY"
"""


def test_groups_beyond_the_limit_are_stopped_least_recently_used_first(ddp_pytester) -> None:
    result = ddp_pytester.run(GROUPS_ALIVE.replace("WHY", "one group at most"), "--ddp-max-groups=1")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*4 tests on 4 rank groups started*"])


def test_a_group_no_later_test_needs_is_stopped(ddp_pytester) -> None:
    result = ddp_pytester.run(GROUPS_ALIVE.replace("WHY", "no 2-rank test is left"))
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*4 tests on 2 rank groups started*"])


def test_a_tests_subgroups_are_named_the_same_whatever_ran_before(ddp_pytester, tmp_path) -> None:
    """torch numbers groups for the life of a process; on warm ranks the report must not."""
    report_dir = tmp_path / "reports"
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_makes_a_subgroup():
            dist.all_reduce(torch.ones(1), group=dist.new_group([0, 1]))

        @pytest.mark.ddp(world_size=2, timeout=30)
        def test_makes_another_and_hangs(rank):
            subgroup = dist.new_group([0, 1])
            if rank != 1:
                dist.all_reduce(torch.ones(1), group=subgroup)
        """,
        f"--ddp-report-dir={report_dir}",
    )
    result.assert_outcomes(passed=1, failed=1)
    import json

    reports = [p for p in report_dir.glob("*.json") if not p.name.endswith(".trace.json")]
    [report] = [json.loads(p.read_text()) for p in reports]
    waiting = report["ranks"][0]["calls"][-1]
    assert (waiting["op"], waiting["group"], waiting["seq"]) == ("all_reduce", "1", 1)
    assert "all_reduce #1 on group 1 [0, 1]" in report["summary"]

"""Failures end fast, timeouts report every rank, crashes are named."""

from __future__ import annotations

import re

from conftest import line_of


def test_rank_failing_while_peer_waits_in_all_reduce(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_disagree(rank):
            if rank == 1:
                assert rank == 0, "rank 1 gave up"
            t = torch.ones(1)
            dist.all_reduce(t)
        """
    )
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "rank 1 gave up" in text
    # Rank 0's stack, dumped while it waits, points at its all_reduce line.
    line = line_of(ddp_pytester.pytester.path / "test_it.py", "dist.all_reduce(t)")
    assert re.search(rf"rank 0: Python stacks when stopped.*\n(.*\n)*> File .*test_it.py\", line {line} ", text), text
    assert "timed out" not in text


def test_timeout_reports_every_rank_stack(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2, timeout=5)
        def test_sleepy(rank):
            if rank == 1:
                time.sleep(3600)
            dist.barrier()
        """
    )
    result.assert_outcomes(failed=1)
    path = ddp_pytester.pytester.path / "test_it.py"
    result.stdout.fnmatch_lines(
        [
            "timed out after 5 s:*[[]ddp timeout]",
            "*rank 0: Python stacks when stopped*",
            f"> File *test_it.py*, line {line_of(path, 'dist.barrier()')} in test_sleepy",
            "*rank 1: Python stacks when stopped*",
            f"> File *test_it.py*, line {line_of(path, 'time.sleep')} in test_sleepy",
        ]
    )


def test_pytest_timeout_mark_is_the_ddp_timeout(ddp_pytester) -> None:
    """pytest-timeout's mark sets the timeout; pytest-timeout itself never fires."""
    result = ddp_pytester.run(
        """
        @pytest.mark.timeout(3)
        @pytest.mark.ddp(world_size=2)
        def test_sleepy(rank):
            time.sleep(3600)
        """,
        "--ddp-timeout=600",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["timed out after 3 s:*[[]ddp timeout]"])
    result.stdout.no_fnmatch_line("*Timeout (0:00:03)*")  # pytest-timeout's own message


def test_ddp_timeout_ini_option(ddp_pytester) -> None:
    ddp_pytester.pytester.makeini("[pytest]\nddp_timeout = 2\n")
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=1)
        def test_sleepy():
            time.sleep(3600)
        """
    )
    result.stdout.fnmatch_lines(["timed out after 2 s:*[[]ddp timeout]"])


def test_rank_killed_by_sigabrt_is_named_with_its_stderr(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_abort(rank):
            if rank == 1:
                print("about to abort", file=sys.stderr, flush=True)
                os.abort()
            dist.barrier()
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*rank 1: died (killed by SIGABRT)*", "*rank 1: stderr (killed by SIGABRT)*", "about to abort"]
    )


def test_rank_killed_by_sigkill_fails_the_test(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        import signal

        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_killed(rank):
            if rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.barrier()

        @pytest.mark.ddp(world_size=2)
        def test_next_gets_fresh_ranks(rank):
            dist.barrier()
        """
    )
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*rank 0: died (killed by SIGKILL)*"])


def test_native_output_of_a_crashed_rank_is_shown(ddp_pytester) -> None:
    """What a rank writes below Python (C++ messages) before it crashes is in the report."""
    result = ddp_pytester.run(
        """
        import ctypes

        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_native_crash(rank):
            if rank == 1:
                libc = ctypes.CDLL(None)
                message = b"terminate called after throwing an instance of 'demo'\\n"
                libc.write(2, message, len(message))
                libc.abort()
            dist.barrier()
        """
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*rank 1: died (killed by SIGABRT)*",
            "*rank 1: stderr (killed by SIGABRT)*",
            "terminate called after throwing an instance of 'demo'",
        ]
    )


def test_a_test_module_the_ranks_cannot_import_fails_with_their_error(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        if os.environ.get("RANK") is not None:  # only inside the ranks
            raise RuntimeError("this module refuses to load in a rank")

        @pytest.mark.ddp(world_size=2)
        def test_anything(rank):
            pass
        """
    )
    result.assert_outcomes(errors=1)
    text = result.stdout.str()
    assert "could not start" in text
    assert "RuntimeError: this module refuses to load in a rank" in text


def test_an_internal_error_in_one_rank_is_shown(ddp_pytester) -> None:
    ddp_pytester.pytester.makeconftest(
        """
        import os

        def pytest_runtest_logreport(report):
            if os.environ.get("RANK") == "1" and report.when == "call":
                raise RuntimeError("a hook broke in rank 1")
        """
    )
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_anything(rank):
            pass
        """
    )
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "rank 1: stderr (exit code 3)" in text
    assert "RuntimeError: a hook broke in rank 1" in text


def test_init_faults_every_rank_agrees_on_are_named_at_once(ddp_pytester) -> None:
    """Every rank passes a world size larger than the ranks that run, or one rank dials another port
    than the rank group's store: a certain deadlock, named by its cause, not a bare timeout."""
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2, init=False, timeout=60)
        def test_three(rank):
            dist.init_process_group("gloo", rank=rank, world_size=3)

        @pytest.mark.ddp(world_size=2, init=False, timeout=60)
        def test_port(rank):
            store_port = os.environ["MASTER_PORT"]
            if rank == 1:
                os.environ["MASTER_PORT"] = str(int(store_port) + 7)
            print(f"store port {store_port}", flush=True)
            dist.init_process_group("gloo")
        """
    )
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    result.stdout.fnmatch_lines([
        "processes 0, 1 passed world_size 3 to init_process_group, where 2 processes run: rank 2 never comes;"
        " *[[]ddp deadlock, init, *",
    ])
    port = int(re.search(r"store port (\d+)", text).group(1))  # type: ignore[union-attr]
    assert (f"process 1 dialled 127.0.0.1:{port + 7} (MASTER_ADDR:MASTER_PORT), not the rank group's store at"
            f" 127.0.0.1:{port}, in init_process_group") in text
    assert "timed out" not in text


def test_a_rank_that_left_mid_call_or_stopped_is_named_not_its_peer(ddp_pytester) -> None:
    """A rank that skipped a collective and ended its group is the cause of its peer's connection
    error; a stopped rank is named stopped (its state in /proc), and each rank without a stack says why."""
    result = ddp_pytester.run(
        """
        import signal

        @pytest.mark.ddp(world_size=2, init=False)
        def test_skip_then_destroy(rank):
            dist.init_process_group("gloo"); dist.barrier()
            if rank == 0:
                dist.all_reduce(torch.ones(3))
            dist.destroy_process_group()

        @pytest.mark.ddp(world_size=2, timeout=2)
        def test_stopped(rank):
            dist.barrier()
            if rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            dist.barrier()
        """
    )
    result.assert_outcomes(failed=2)
    path = ddp_pytester.pytester.path / "test_it.py"
    destroy, all_reduce = line_of(path, "dist.destroy_process_group()"), line_of(path, "dist.all_reduce(")
    result.stdout.fnmatch_lines([
        f"rank 1 never called all_reduce #2 and ended the group (destroy_process_group at *test_it.py:{destroy});"
        " then rank 0 raised RuntimeError: *[[]ddp failed, partial]",
        f"*then rank 0 raised RuntimeError: * in all_reduce #2 (*test_it.py:{all_reduce}).",
    ])
    stopped = "stopped (state T in /proc: SIGSTOP, or a debugger)"
    result.stdout.fnmatch_lines([
        f"timed out after 2 s: rank 1 is {stopped}, outside any collective; rank 0 waits in barrier #2 *",
        "rank 0: waiting in barrier #2 *; no Python stack: SIGUSR1, which asks for it, is ignored*",
        f"rank 1: {stopped} *; no Python stack: a stopped process runs no signal handler*",
    ])

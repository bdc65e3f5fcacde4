"""Failures end fast, timeouts report every rank, crashes are named.

One inner pytest session (run in this process by the first test that needs it) runs the failing
ddp tests of MODULES, each in a module of its own; each test here asserts on its module's part of
that session: its outcomes, its failure section and its short summary line.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from conftest import HEADER, ModuleShared, Session, failure_section, line_of, outcomes, session_in_process

# The session's timeout, for the tests whose marks set none (test_ini_timeout.py); the others set
# theirs (60 s where the test's was the default), as each ran in a session of its own before.
INI = "[pytest]\nddp_timeout = 2\n"

# A hook of the session's conftest that breaks in rank 1, after test_whose_report_hook_breaks.
CONFTEST = """
import os

def pytest_runtest_logreport(report):
    if os.environ.get("RANK") == "1" and report.when == "call" and "report_hook_breaks" in report.nodeid:
        raise RuntimeError("a hook broke in rank 1")
"""

MODULES = {
    "test_peer_waits": """
        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_disagree(rank):
            if rank == 1:
                assert rank == 0, "rank 1 gave up"
            t = torch.ones(1)
            dist.all_reduce(t)
        """,
    "test_timeout": """
        @pytest.mark.ddp(world_size=2, timeout=5)
        def test_sleepy(rank):
            if rank == 1:
                time.sleep(3600)
            dist.barrier()
        """,
    "test_timeout_mark": """
        @pytest.mark.timeout(3)
        @pytest.mark.ddp(world_size=2)
        def test_past_its_timeout_mark(rank):
            time.sleep(3600)
        """,
    "test_ini_timeout": """
        @pytest.mark.ddp(world_size=1)
        def test_past_the_ini_timeout():
            time.sleep(3600)
        """,
    "test_sigabrt": """
        def helper():
            print("about to abort", file=sys.stderr, flush=True)
            os.abort()

        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_abort(rank):
            if rank == 1:
                helper()
            dist.barrier()
        """,
    "test_sigkill": """
        import signal

        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_killed(rank):
            if rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.barrier()

        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_next_gets_fresh_ranks(rank):
            dist.barrier()
        """,
    "test_native_crash": """
        import ctypes

        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_native_crash(rank):
            if rank == 1:
                libc = ctypes.CDLL(None)
                message = b"terminate called after throwing an instance of 'demo'\\n"
                libc.write(2, message, len(message))
                libc.abort()
            dist.barrier()
        """,
    "test_internal_error": """
        @pytest.mark.ddp(world_size=2, timeout=60)
        def test_whose_report_hook_breaks(rank):
            pass
        """,
    "test_init_agreed": """
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
        """,
    "test_left_or_stopped": """
        import signal

        @pytest.mark.ddp(world_size=2, init=False, timeout=60)
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
        """,
}


class Failures:
    """The session's result, and the folder of its modules."""

    def __init__(self, result: pytest.RunResult, folder: Path) -> None:
        self.result, self.folder = result, folder

    def outcomes(self, module: str) -> dict[str, str]:
        return outcomes(self.result, f"{module}.py")

    def section(self, test: str) -> pytest.LineMatcher:
        return failure_section(self.result, test)

    def text(self, module: str, test: str) -> str:
        """``test``'s failure section and its line of the short summary."""
        summary = [line for line in self.result.outlines if line.startswith(f"FAILED {module}.py::{test} ")]
        return "\n".join([*self.section(test).lines, *summary])


@pytest.fixture
def failures(module_shared: ModuleShared, pytester: pytest.Pytester) -> Failures:
    def run() -> Failures:
        files = {f"{name}.py": HEADER + textwrap.dedent(body) for name, body in MODULES.items()}
        files.update({"pytest.ini": INI, "conftest.py": CONFTEST})
        result = session_in_process(pytester, "failures", Session(files, ("-rA",)), 1)
        return Failures(result, pytester.path / "failures")

    return module_shared.once("failures", run)


def test_rank_failing_while_peer_waits_in_all_reduce(failures: Failures) -> None:
    assert failures.outcomes("test_peer_waits") == {"test_disagree": "FAILED"}
    text = failures.text("test_peer_waits", "test_disagree")
    assert "rank 1 gave up" in text
    # Rank 0's stack, dumped while it waits, points at its all_reduce line.
    line = line_of(failures.folder / "test_peer_waits.py", "dist.all_reduce(t)")
    stack = rf"rank 0: Python stacks when stopped.*\n(.*\n)*> File .*test_peer_waits.py\", line {line} "
    assert re.search(stack, text), text
    assert "timed out" not in text


def test_timeout_reports_every_rank_stack(failures: Failures) -> None:
    assert failures.outcomes("test_timeout") == {"test_sleepy": "FAILED"}
    path = failures.folder / "test_timeout.py"
    failures.section("test_sleepy").fnmatch_lines(
        [
            "timed out after 5 s:*[[]ddp timeout]",
            "*rank 0: Python stacks when stopped*",
            f"> File *test_timeout.py*, line {line_of(path, 'dist.barrier()')} in test_sleepy",
            "*rank 1: Python stacks when stopped*",
            f"> File *test_timeout.py*, line {line_of(path, 'time.sleep')} in test_sleepy",
        ]
    )


def test_pytest_timeout_mark_is_the_ddp_timeout(failures: Failures) -> None:
    """pytest-timeout's mark sets the timeout, over the session's (the ini value's 2 s); pytest-timeout
    itself never fires."""
    assert failures.outcomes("test_timeout_mark") == {"test_past_its_timeout_mark": "FAILED"}
    failures.section("test_past_its_timeout_mark").fnmatch_lines(["timed out after 3 s:*[[]ddp timeout]"])
    failures.result.stdout.no_fnmatch_line("*Timeout (0:00:03)*")  # pytest-timeout's own message


def test_ddp_timeout_ini_option(failures: Failures) -> None:
    assert failures.outcomes("test_ini_timeout") == {"test_past_the_ini_timeout": "FAILED"}
    failures.section("test_past_the_ini_timeout").fnmatch_lines(["timed out after 2 s:*[[]ddp timeout]"])


def test_rank_killed_by_sigabrt_is_named_with_its_stderr(failures: Failures) -> None:
    assert failures.outcomes("test_sigabrt") == {"test_abort": "FAILED"}
    section = failures.section("test_abort")
    section.fnmatch_lines(
        ["*rank 1: died (killed by SIGABRT)*", "*rank 1: stderr (killed by SIGABRT)*", "about to abort"]
    )
    # Its stderr's tail keeps the fatal error and marks the test's line, pytest's frames hidden.
    text = "\n".join(section.lines)
    tail = text[text.index("rank 1: stderr (killed by SIGABRT)") : text.index("Captured stderr (rank 1)")]
    assert "Fatal Python error: Aborted" in tail
    path = failures.folder / "test_sigabrt.py"
    assert f'> File "{path}", line {line_of(path, "        helper()")} in test_abort' in tail
    assert "pytest and pytest-ddp frames hidden" in tail and "/pluggy/" not in tail


def test_rank_killed_by_sigkill_fails_the_test(failures: Failures) -> None:
    killed_then_fresh = {"test_killed": "FAILED", "test_next_gets_fresh_ranks": "PASSED"}
    assert failures.outcomes("test_sigkill") == killed_then_fresh
    failures.section("test_killed").fnmatch_lines(["*rank 0: died (killed by SIGKILL)*"])


def test_native_output_of_a_crashed_rank_is_shown(failures: Failures) -> None:
    """What a rank writes below Python (C++ messages) before it crashes is in the report."""
    assert failures.outcomes("test_native_crash") == {"test_native_crash": "FAILED"}
    failures.section("test_native_crash").fnmatch_lines(
        [
            "*rank 1: died (killed by SIGABRT)*",
            "*rank 1: stderr (killed by SIGABRT)*",
            "terminate called after throwing an instance of 'demo'",
        ]
    )


def test_a_test_module_the_ranks_cannot_import_fails_with_their_error(ddp_pytester) -> None:
    """In a session of its own: a rank group collects every test it is to run, and a module its
    ranks cannot import fails the others' start too."""
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


def test_an_internal_error_in_one_rank_is_shown(failures: Failures) -> None:
    assert failures.outcomes("test_internal_error") == {"test_whose_report_hook_breaks": "FAILED"}
    text = failures.text("test_internal_error", "test_whose_report_hook_breaks")
    assert "rank 1: stderr (exit code 3)" in text
    assert "RuntimeError: a hook broke in rank 1" in text


def test_init_faults_every_rank_agrees_on_are_named_at_once(failures: Failures) -> None:
    """Every rank passes a world size larger than the ranks that run, or one rank dials another port
    than the rank group's store: a certain deadlock, named by its cause, not a bare timeout."""
    assert failures.outcomes("test_init_agreed") == {"test_three": "FAILED", "test_port": "FAILED"}
    failures.section("test_three").fnmatch_lines([
        "processes 0, 1 passed world_size 3 to init_process_group, where 2 processes run: rank 2 never comes;"
        " *[[]ddp deadlock, init, *",
    ])
    text = failures.text("test_init_agreed", "test_three") + failures.text("test_init_agreed", "test_port")
    port = int(re.search(r"store port (\d+)", text).group(1))  # type: ignore[union-attr]
    assert (f"process 1 dialled 127.0.0.1:{port + 7} (MASTER_ADDR:MASTER_PORT), not the rank group's store at"
            f" 127.0.0.1:{port}, in init_process_group") in text
    assert "timed out" not in text


def test_a_rank_that_left_mid_call_or_stopped_is_named_not_its_peer(failures: Failures) -> None:
    """A rank that skipped a collective and ended its group is the cause of its peer's connection
    error; a stopped rank is named stopped (its state in /proc), and each rank without a stack says why."""
    both_failed = {"test_skip_then_destroy": "FAILED", "test_stopped": "FAILED"}
    assert failures.outcomes("test_left_or_stopped") == both_failed
    path = failures.folder / "test_left_or_stopped.py"
    destroy, all_reduce = line_of(path, "dist.destroy_process_group()"), line_of(path, "dist.all_reduce(")
    failures.section("test_skip_then_destroy").fnmatch_lines([
        f"rank 1 never called all_reduce #2 and ended the group (destroy_process_group at"
        f" *test_left_or_stopped.py:{destroy}); then rank 0 raised RuntimeError: *[[]ddp failed, partial]",
        f"*then rank 0 raised RuntimeError: * in all_reduce #2 (*test_left_or_stopped.py:{all_reduce}).",
    ])
    stopped = "stopped (state T in /proc: SIGSTOP, or a debugger)"
    failures.section("test_stopped").fnmatch_lines([
        f"timed out after 2 s: rank 1 is {stopped}, outside any collective; rank 0 waits in barrier #2 *",
        "rank 0: waiting in barrier #2 *; no Python stack: SIGUSR1, which asks for it, is ignored*",
        f"rank 1: {stopped} *; no Python stack: a stopped process runs no signal handler*",
    ])

"""Nothing until used: a session without ddp tests costs what it costs without the plugin (no
torch, no mpi4py, no controller, no forkserver); the first ddp test starts it all."""

from __future__ import annotations

import pytest

PLAIN_TESTS = """
import sys

HEAVY = ("torch", "mpi4py", "pytest_ddp.controller", "pytest_ddp.api", "pytest_ddp.groups.group")


def test_plain():
    assert [name for name in HEAVY if name in sys.modules] == []


def test_plain_too(tmp_path):
    assert [name for name in HEAVY if name in sys.modules] == []
"""


def plain_session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_plain=PLAIN_TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_a_session_of_plain_tests_imports_no_torch(pytester: pytest.Pytester) -> None:
    result = plain_session(pytester)
    result.assert_outcomes(passed=2)
    assert "ddp:" not in result.stdout.str()  # no controller summary


def test_xdist_workers_of_plain_tests_import_no_torch(pytester: pytest.Pytester) -> None:
    plain_session(pytester, "-n", "2").assert_outcomes(passed=2)


def test_a_session_that_calls_run_from_a_plain_test_gets_the_sessions_settings(
    pytester: pytest.Pytester,
) -> None:
    """pytest_ddp.run() needs no ddp test in the session, and runs under its settings:
    --ddp-max-world-size refuses a world size above it, as it does for a marked test. The session
    runs in this process (it imports torch anyway: a process of its own would import it again)."""
    pytester.makepyfile(
        test_run="""
        import pytest
        import pytest_ddp

        def test_run():
            with pytest.raises(ValueError, match="above --ddp-max-world-size=1"):
                pytest_ddp.run(print, world_size=2)
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--ddp-max-world-size=1")
    result.assert_outcomes(passed=1)


def test_collect_only_of_ddp_tests_starts_nothing(pytester: pytest.Pytester) -> None:
    """--collect-only lists a ddp test, and the session ends having imported neither torch nor
    mpi4py, with no child process (no forkserver, no rank)."""
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.ddp(world_size=2)
        def test_marked(rank):
            pass
        """
    )
    pytester.makeconftest(
        """
        import os, sys
        import pytest
        from pytest_ddp.common import procfs

        @pytest.hookimpl(tryfirst=True)  # before the controller's, which closes its groups
        def pytest_sessionfinish(session):
            heavy = ("torch", "mpi4py")
            children = [pid for pid in procfs.pids() if procfs.parent_of(pid) == os.getpid()]
            imported = [name for name in heavy if name in sys.modules]
            print(f"at the end: imported {imported}, children {children}")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "-s")
    assert "test_marked.py::test_marked" in result.stdout.str()
    result.stdout.fnmatch_lines(["at the end: imported [[][]], children [[][]]"])

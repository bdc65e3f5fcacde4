"""The plugin's settings, resolved once at configure: precedence, and bad values
refused before any test runs."""

from __future__ import annotations

import pytest

from conftest import ranks_working_in
from pytest_ddp.config.settings import Settings, adopt_enabled, rank_pytest_args
from pytest_ddp.plugin import settings_key


def settings_of(pytester: pytest.Pytester, *args: str) -> Settings:
    config = pytester.parseconfigure(*args)
    return config.stash[settings_key]


@pytest.mark.parametrize(
    "args, environment, ini, timeout",
    [
        ((), None, "", 60.0),
        (("--ddp-timeout=30",), None, "ddp_timeout = 40\n", 30.0),
        ((), None, "ddp_timeout = 40\n", 40.0),
        # pytest-timeout's global value lowers the default: --timeout, else PYTEST_TIMEOUT, else its ini value
        (("--ddp-timeout=30",), "10", "", 10.0),
        (("--timeout=20",), "10", "", 20.0),
        ((), "10", "timeout = 5\n", 10.0),
        ((), None, "timeout = 5\n", 5.0),
        ((), "0", "", 60.0),  # 0: no pytest-timeout timeout
    ],
)
def test_default_timeout_precedence(pytester, monkeypatch, args, environment, ini, timeout) -> None:
    if environment is None:
        monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_TIMEOUT", environment)
    pytester.makeini("[pytest]\n" + ini)
    assert settings_of(pytester, *args).timeout == timeout


def test_defaults_and_options(pytester, monkeypatch) -> None:
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    assert settings_of(pytester) == Settings(
        backend="gloo", timeout=60.0, grace=2.0, isolate_all=False, max_groups=2, report_dir=None, max_world_size=None,
        mpi_launcher=None, launcher="auto",
    )
    report_dir = pytester.path / "reports" / "new"
    chosen = settings_of(
        pytester, "--ddp-backend=NCCL", "--ddp-grace=0.5", "--ddp-isolate", "--ddp-max-groups=3",
        f"--ddp-report-dir={report_dir}", "--ddp-max-world-size=4", "--ddp-mpi-launcher=mpirun --oversubscribe",
        "--ddp-launcher=local",
    )
    assert chosen == Settings(
        backend="nccl", timeout=60.0, grace=0.5, isolate_all=True, max_groups=3,
        report_dir=str(report_dir), max_world_size=4, mpi_launcher="mpirun --oversubscribe", launcher="local",
    )
    assert report_dir.is_dir()  # created at start, checked once


@pytest.mark.parametrize(
    "args, ini, adopted",
    [((), "", False), (("--ddp-adopt",), "", True), ((), "[pytest]\nddp_adopt = true\n", True)],
)
def test_adopt_is_the_option_or_the_ini_value_and_the_option_reaches_the_ranks(pytester, args, ini, adopted) -> None:
    """The ini's value reaches the ranks' pytest through its ini file (tests/adopt/test_adopt.py's
    session adopts by it); the option, in their command line."""
    if ini:
        pytester.makefile(".ini", pytest=ini)
    config = pytester.parseconfigure(*args)
    assert adopt_enabled(config) is adopted
    assert ("--ddp-adopt" in rank_pytest_args(config, [])) is bool(args)


@pytest.mark.parametrize(
    "args, ini, message",
    [
        ((), "ddp_launcher = nowhere", "--ddp-launcher='nowhere': must be one of auto, local, torchrun, slurm, mpi"),
        (("--ddp-launcher=slurm",), "", "--ddp-launcher=slurm: this process was not started by slurm"),
    ],
)
def test_a_launcher_that_is_not_there_is_a_usage_error(ddp_pytester, args, ini, message) -> None:
    ddp_pytester.pytester.makeini("[pytest]\n" + ini)
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_never_runs():
            pass
        """,
        *args,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest-ddp: {message}*"])


@pytest.mark.parametrize(
    "make_dir, message",
    [
        (lambda base: base / "a_file", "is a file, not a directory"),
        (lambda base: base / "a_file" / "reports", "cannot be created: Not a directory"),
    ],
)
def test_bad_report_dir_is_a_usage_error_before_any_test(ddp_pytester, make_dir, message) -> None:
    base = ddp_pytester.pytester.path
    (base / "a_file").write_text("")
    report_dir = make_dir(base)
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=1)
        def test_fails():
            assert False
        """,
        f"--ddp-report-dir={report_dir}",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest-ddp: --ddp-report-dir='{report_dir}': {message}*"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_world_size_above_the_option_is_refused_naming_it(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=[1, 3])
        def test_sizes():
            pass
        """,
        "--ddp-max-world-size=2",
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_sizes?ws3?*", "world_size=3: above --ddp-max-world-size=2*"],
                                consecutive=True)


def test_world_size_the_machine_cannot_hold_is_refused_before_any_process_starts(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=1_000_000)
        def test_huge():
            pass
        """
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_huge*",
            "world_size=1000000: this machine holds at most * ranks (*); --ddp-max-world-size=N*",
        ],
        consecutive=True,
    )
    result.stdout.no_fnmatch_line("*rank group* started*")
    assert not ranks_working_in(ddp_pytester.pytester.path)


def returns_rank(rank: int) -> int:
    return rank


def test_run_with_too_few_gpus_skips_the_calling_test_or_raises_outside_pytest(monkeypatch) -> None:
    import pytest_ddp
    from pytest_ddp.config.machine import GpuShortage, visible_gpus

    needed = len(visible_gpus()) + 1
    with pytest.raises(pytest.skip.Exception, match=f"pytest_ddp.run\\(\\): nccl test needs {needed} GPUs"):
        pytest_ddp.run(returns_rank, world_size=needed, backend="nccl")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    with pytest.raises(GpuShortage, match=f"nccl test needs {needed} GPUs"):
        pytest_ddp.run(returns_rank, world_size=needed, backend="nccl")

"""The ddp marker and options: parsing, defaults, and clear errors for bad input."""

from __future__ import annotations

import pytest

from pytest_ddp.config.settings import Settings
from pytest_ddp.config.spec import (
    MAX_TIMEOUT,
    MarkArgs,
    SpecError,
    parse_mark,
    parse_timeout_mark,
    process_group_timeout,
)

BAD_MARKS = [
    ("world_size=0", "world_size=0: must be an int >= 1"),
    ("world_size=-1", "world_size=-1: must be an int >= 1"),
    ("world_size='4'", "world_size='4': must be an int >= 1"),
    ("world_size=4.5", "world_size=4.5: must be an int >= 1"),
    ("world_size=[]", "world_size=[]: the list of world sizes is empty"),
    ("world_size=[2, 0]", "world_size=[2, 0]: 0 is not an int >= 1"),
    ("world_size=2, backend='foo'", "backend='foo': must be one of gloo, nccl"),
    ("world_size=2, timeout=0", "timeout=0: must be a number of seconds > 0"),
    ("world_size=2, timeout=-3", "timeout=-3: must be a number of seconds > 0"),
    ("world_size=2, timeout='x'", "timeout='x': must be a number of seconds > 0"),
    ("world_size=2, timeout=float('inf')", "timeout=inf: must be a number of seconds > 0 and <= 1000000"),
    ("world_size=2, timeout=float('nan')", "timeout=nan: must be a number of seconds > 0 and <= 1000000"),
    ("world_size=2, timeout=1e14", "timeout=100000000000000.0: must be a number of seconds > 0 and <= 1000000"),
    ("world_size=2, colour='red'", "unknown argument colour"),
    ("2", "positional arguments (2,) are not accepted"),
    ("world_size=2, init='no'", "init='no': must be True or False"),
    ("", "world_size is required"),
]


def _parse(source: str) -> MarkArgs:
    return eval(f"(lambda *a, **k: parse_mark(a, k))({source})", {"parse_mark": parse_mark})


@pytest.mark.parametrize("source, message", BAD_MARKS)
def test_bad_mark_arguments_are_named(source: str, message: str) -> None:
    with pytest.raises(SpecError, match=None) as info:
        _parse(source)
    assert message in str(info.value)


SETTINGS = Settings(
    backend="gloo", timeout=60.0, grace=2.0, isolate_all=False, max_groups=2, report_dir=None, max_world_size=None,
    mpi_launcher=None, launcher="auto",
)


def test_good_marks_parse_and_resolve() -> None:
    mark = _parse("world_size=[2, 4], backend='NCCL', timeout=5, init=False")
    assert mark.world_sizes == (2, 4) and mark.parametrized and mark.backend == "nccl"
    spec = SETTINGS.spec(mark, 4)
    assert (spec.world_size, spec.backend, spec.timeout, spec.init) == (4, "nccl", 5.0, False)
    assert not spec.isolated  # init=False tests share warm ranks too (tests/rank/test_warm_reinit.py)


def test_timeout_precedence_mark_then_pytest_timeout_then_settings() -> None:
    plain = _parse("world_size=1")
    assert SETTINGS.spec(plain, 1, timeout_mark=None).timeout == 60
    assert SETTINGS.spec(plain, 1, timeout_mark=7).timeout == 7
    assert SETTINGS.spec(_parse("world_size=1, timeout=3"), 1, timeout_mark=7).timeout == 3


def test_pytest_timeout_mark_values() -> None:
    assert parse_timeout_mark((7,), {}) == 7.0
    assert parse_timeout_mark((), {"timeout": "2.5"}) == 2.5
    assert parse_timeout_mark((0,), {}) is None  # pytest-timeout: no timeout of its own
    for bad in ("soon", float("inf"), 1e14, [3]):
        with pytest.raises(SpecError, match="must be a number of seconds > 0 and <= 1000000"):
            parse_timeout_mark((bad,), {})


def test_process_group_timeout_stays_above_the_test_and_within_int32_milliseconds() -> None:
    assert process_group_timeout(1) == 600
    assert process_group_timeout(1000) == 2060
    assert process_group_timeout(MAX_TIMEOUT) * 1000 < 2**31  # milliseconds


def test_every_bad_mark_of_a_file_is_its_tests_error_naming_the_argument(ddp_pytester) -> None:
    bad_tests = "".join(
        f"@pytest.mark.ddp({source})\ndef test_bad_{i}():\n    pass\n\n"
        for i, (source, _) in enumerate(BAD_MARKS)
    )
    result = ddp_pytester.run(bad_tests + "@pytest.mark.ddp(world_size=1)\ndef test_good():\n    pass\n")
    result.assert_outcomes(passed=1, errors=len(BAD_MARKS))
    for i, (_, message) in enumerate(BAD_MARKS):
        literal = message.replace("[", "[[]")  # fnmatch's brackets
        lines = [f"*ERROR at setup of test_bad_{i} *", f"{literal}*(in @pytest.mark.ddp)"]
        result.stdout.fnmatch_lines(lines, consecutive=True)
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.fnmatch_lines(["ddp: 1 test on 1 rank group started*"])  # the good test's only


def test_bad_pytest_timeout_mark_on_a_ddp_test_is_its_error(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.timeout("soon")
        @pytest.mark.ddp(world_size=1)
        def test_unreadable():
            pass

        @pytest.mark.timeout(float("inf"))
        @pytest.mark.ddp(world_size=1)
        def test_infinite():
            pass
        """
    )
    result.assert_outcomes(errors=2)
    for test, message in (("test_unreadable", "timeout='soon'"), ("test_infinite", "timeout=inf")):
        lines = [f"*ERROR at setup of {test} *", f"{message}: must be a number*(in @pytest.mark.timeout)"]
        result.stdout.fnmatch_lines(lines, consecutive=True)
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    result.stdout.no_fnmatch_line("*rank group* started*")  # nothing was spawned


@pytest.mark.parametrize(
    "option, message",
    [
        ("--ddp-backend=ucc", "--ddp-backend='ucc': must be one of gloo, nccl, mpi"),
        ("--ddp-timeout=0", "--ddp-timeout='0': must be a number of seconds > 0"),
        ("--ddp-timeout=soon", "--ddp-timeout='soon': must be a number of seconds > 0"),
        ("--ddp-timeout=inf", "--ddp-timeout='inf': must be a number of seconds > 0 and <= 1000000"),
        ("--ddp-timeout=1e14", "--ddp-timeout='1e14': must be a number of seconds > 0 and <= 1000000"),
        ("--ddp-grace=inf", "--ddp-grace='inf': must be a number of seconds > 0 and <= 1000000"),
        ("--ddp-max-groups=0", "--ddp-max-groups='0': must be an int >= 1"),
        ("--ddp-max-groups=-3", "--ddp-max-groups='-3': must be an int >= 1"),
        ("--ddp-max-groups=two", "--ddp-max-groups='two': must be an int >= 1"),
        ("--ddp-max-world-size=0", "--ddp-max-world-size='0': must be an int >= 1"),
    ],
)
def test_bad_option_is_a_usage_error(ddp_pytester, option, message) -> None:
    result = ddp_pytester.run(
        """
        def test_nothing():
            pass
        """,
        option,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest-ddp: {message}*"])


def test_xdist_workers_get_disjoint_gpu_shares() -> None:
    from pytest_ddp.config.machine import worker_gpus

    visible = ["0", "1", "2", "3"]
    assert worker_gpus(visible, None, 1) == visible
    assert worker_gpus(visible, "gw0", 2) == ["0", "2"]
    assert worker_gpus(visible, "gw1", 2) == ["1", "3"]
    assert worker_gpus(["4", "5"], "gw2", 3) == []


def test_gpu_shortage_names_the_numbers() -> None:
    from pytest_ddp.config.machine import gpu_shortage

    assert gpu_shortage(needed=2, mine=2, visible=4, workers=2) is None
    assert gpu_shortage(needed=3, mine=2, visible=2, workers=1) == "nccl test needs 3 GPUs, 2 visible"
    assert gpu_shortage(needed=3, mine=2, visible=4, workers=2) == (
        "nccl test needs 3 GPUs, this xdist worker has 2 (4 visible, shared between 2 workers)"
    )

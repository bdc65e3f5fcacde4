"""The ddp marker and options: parsing, defaults, and clear errors for bad input."""

from __future__ import annotations

import pytest

from conftest import ranks_working_in
from pytest_ddp.spec import MarkArgs, SpecError, parse_mark, resolve

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


def test_good_marks_parse_and_resolve() -> None:
    mark = _parse("world_size=[2, 4], backend='NCCL', timeout=5, init=False")
    assert mark.world_sizes == (2, 4) and mark.parametrized and mark.backend == "nccl"
    spec = resolve(mark, 4, default_backend="gloo", default_timeout=60)
    assert (spec.world_size, spec.backend, spec.timeout, spec.init) == (4, "nccl", 5.0, False)
    assert spec.isolated  # init=False tests always get fresh ranks


def test_timeout_precedence_mark_then_pytest_timeout_then_option() -> None:
    plain = _parse("world_size=1")
    assert resolve(plain, 1, "gloo", 60, timeout_mark=None).timeout == 60
    assert resolve(plain, 1, "gloo", 60, timeout_mark=7).timeout == 7
    assert resolve(_parse("world_size=1, timeout=3"), 1, "gloo", 60, timeout_mark=7).timeout == 3


@pytest.mark.parametrize("source, message", BAD_MARKS[:3] + BAD_MARKS[6:8] + BAD_MARKS[10:12])
def test_bad_mark_is_a_collection_error_naming_test_and_argument(ddp_pytester, source, message) -> None:
    result = ddp_pytester.run(
        f"""
        @pytest.mark.ddp({source})
        def test_bad():
            pass

        @pytest.mark.ddp(world_size=1)
        def test_good():
            pass
        """
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*test_it.py::test_bad: @pytest.mark.ddp: {message}*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    result.stdout.no_fnmatch_line("*rank group* started*")  # nothing was spawned
    assert not ranks_working_in(ddp_pytester.pytester.path)


@pytest.mark.parametrize(
    "option, message",
    [
        ("--ddp-backend=mpi", "--ddp-backend='mpi': must be one of gloo, nccl"),
        ("--ddp-timeout=0", "--ddp-timeout='0': must be a number of seconds > 0"),
        ("--ddp-timeout=soon", "--ddp-timeout='soon': must be a number of seconds > 0"),
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
    from pytest_ddp.plugin import worker_gpus

    visible = ["0", "1", "2", "3"]
    assert worker_gpus(visible, None, 1) == visible
    assert worker_gpus(visible, "gw0", 2) == ["0", "2"]
    assert worker_gpus(visible, "gw1", 2) == ["1", "3"]
    assert worker_gpus(["4", "5"], "gw2", 3) == []

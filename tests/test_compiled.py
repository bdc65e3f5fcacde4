"""The recorder's compiled kernels for the functional collectives (pytest_ddp/record/compiled.py): they
record exactly what the Python recorder records, and where they cannot be built, the Python
recorder records instead, and the session says why."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ModuleShared, Session, session_in_process
from pytest_ddp.record import compiled

# A session whose one test runs functional collectives of every kind the compiled kernels take
# (and one they leave to Python: broadcast names a root), on a subgroup too, mixed with a
# torch.distributed function, and one never waited for; it writes what rank 0 recorded.
RECORDED_FUNCTIONAL_COLLECTIVES = """
import json, os, warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pytest_ddp
from pytest_ddp.record import backend_hook


def workload(rank):
    tensor = torch.arange(4.0) + rank
    funcol.all_reduce(tensor, "sum", dist.group.WORLD).wait()
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(tensor, 2, dist.group.WORLD.group_name)
    torch.ops._c10d_functional.wait_tensor(gathered)
    funcol.reduce_scatter_tensor(tensor, "sum", 0, dist.group.WORLD).wait()
    for output in funcol.all_reduce_coalesced([tensor, tensor[:2]], "sum", dist.group.WORLD):
        output.wait()
    funcol.all_to_all_single(tensor, None, None, dist.group.WORLD).wait()
    funcol.broadcast(tensor, 0, dist.group.WORLD).wait()
    pair = dist.new_group([0, 1])
    funcol.all_reduce(tensor, "max", pair).wait()
    dist.all_reduce(tensor)
    funcol.all_reduce(tensor, "sum", dist.group.WORLD)  # never waited for
    return backend_hook.compiled_kernels()


def test_record():
    result = pytest_ddp.run(workload, world_size=2, timeout=60)
    assert result.outcome == "passed", result.report
    calls = [
        [c.op, c.group, c.group_ranks, c.seq, c.site, c.shapes, c.dtypes, c.root, c.is_async, c.extra, c.state]
        for c in result.ranks[0].collectives
    ]
    with open(os.environ["RECORDED_TO"], "w") as f:
        json.dump({"compiled": result.values, "calls": calls}, f)
"""


DDP_TEST = """
import pytest, torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

@pytest.mark.ddp(world_size=2)
def test_functional():
    assert funcol.all_reduce(torch.ones(1), "sum", dist.group.WORLD).wait().item() == 2
"""


@pytest.fixture
def sessions(module_shared: ModuleShared, pytester: pytest.Pytester) -> dict[str, tuple[pytest.RunResult, Path]]:
    """The three sessions of the tests below, run in this process by the first test that needs
    them: the workload recorded by the compiled kernels, by Python alone (PYTEST_DDP_COMPILED=0),
    and on a machine where they cannot be built (with a ddp test too). By name, the result and
    the session's folder (what rank 0 recorded is in its recorded.json)."""

    def run() -> dict[str, tuple[pytest.RunResult, Path]]:
        no_compiler = {"XDG_CACHE_HOME": str(pytester.path / "cache"), "CXX": "false"}  # a compiler that always fails
        envs = {"compiled": {}, "python": {"PYTEST_DDP_COMPILED": "0"}, "no_compiler": no_compiler}
        files = {"test_functional.py": RECORDED_FUNCTIONAL_COLLECTIVES}
        results = {}
        for name, env in envs.items():
            session = Session(
                files | ({"test_ddp.py": DDP_TEST} if name == "no_compiler" else {}),
                env={"RECORDED_TO": str(pytester.path / name / "recorded.json"), **env},
            )
            results[name] = session_in_process(pytester, name, session), pytester.path / name
        return results

    return module_shared.once("sessions", run)


def recorded(sessions: dict[str, tuple[pytest.RunResult, Path]], name: str) -> dict[str, Any]:
    result, folder = sessions[name]
    result.assert_outcomes(passed=1)
    recorded: dict[str, Any] = json.loads((folder / "recorded.json").read_text())
    return recorded


def test_the_compiled_kernels_record_what_python_records(sessions: dict[str, tuple[pytest.RunResult, Path]]) -> None:
    compiled = recorded(sessions, "compiled")
    in_python = recorded(sessions, "python")
    assert compiled["compiled"] == [True, True]
    assert in_python["compiled"] == [False, False]
    assert compiled["calls"] == in_python["calls"]
    ops = [(op, state) for op, *_, state in compiled["calls"]]
    assert ops == [
        ("all_reduce", "ok"),
        ("all_gather_into_tensor", "ok"),
        ("reduce_scatter_tensor", "ok"),
        ("all_reduce_coalesced", "ok"),
        ("all_to_all_single", "ok"),
        ("broadcast", "ok"),
        ("new_group", "ok"),
        ("all_reduce", "ok"),
        ("all_reduce", "ok"),
        ("all_reduce", "ok"),
    ]


def test_where_they_cannot_be_built_python_records_and_the_session_says_why(
    sessions: dict[str, tuple[pytest.RunResult, Path]],
) -> None:
    """A machine without a C++ compiler (here, one that always fails): the session says why once,
    its functional collectives are recorded all the same, and the failed build leaves nothing but
    its lock."""
    result, folder = sessions["no_compiler"]
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["pytest-ddp: functional collectives recorded in Python (slower): the C++ build failed*"]
    )
    assert json.loads((folder / "recorded.json").read_text())["compiled"] == [False, False]
    assert [path.suffix for path in (folder.parent / "cache" / "pytest-ddp").iterdir()] == [".lock"]


def test_the_abi_flag_is_torchs_whether_torch_is_imported_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build asks the torch this process imported (starting no process: a fresh interpreter
    importing torch costs 2 s), or, where there is none, a process of its own: the same answer,
    torch's own."""
    import torch

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process started: {args}")

    flag = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    with monkeypatch.context() as patched:
        patched.setattr(compiled.subprocess, "run", no_process)
        assert compiled._cxx11_abi() is flag
    monkeypatch.delitem(sys.modules, "torch")
    assert compiled._cxx11_abi() is flag

"""Compiled code under the plugin: what passes bare under torch.compile passes here, the
recorder stays out of tracing (fake and meta tensors) and records the calls the compiled code makes
when it runs, and the thread check lets a library's idle threads be (inductor's pool, tqdm's
monitor) while it still fails a test for a thread that can take part in a later test's collectives.

One inner session (its tests run on the same warm ranks), run in this process; models are tiny, and
inductor's compiled code is cached by torch across runs."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from conftest import ModuleShared, Session, session_in_process
from pytest_ddp.rank import leftovers

COMPILED_CODE = """
import json, os

import pytest

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.parallel import DistributedDataParallel as DDP

import pytest_ddp


def doubled_then_summed(x):
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    return y + 1


def summed_in_place(x):
    y = x * 2
    dist.all_reduce(y)
    return y + 1


def check(function, backend, **options):
    compiled = torch.compile(function, backend=backend, **options)
    # Twice: the second call runs what the first compiled.
    assert compiled(torch.ones(4) * (dist.get_rank() + 1)).tolist() == [7.0] * 4
    assert compiled(torch.ones(4)).tolist() == [5.0] * 4


@pytest.mark.ddp(world_size=2)
def test_a_compiled_ddp_step():
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))
    step = torch.compile(model, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        step(torch.randn(3, 4) * (dist.get_rank() + 1)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    weights = [torch.empty_like(model.module.weight) for _ in range(2)]
    dist.all_gather(weights, model.module.weight.detach())
    assert torch.equal(weights[0], weights[1])  # the gradients were averaged


@pytest.mark.ddp(world_size=2)
def test_a_functional_collective_in_a_compiled_function():
    check(doubled_then_summed, "aot_eager")


@pytest.mark.ddp(world_size=2)
def test_dist_all_reduce_in_a_full_graph():
    check(summed_in_place, "aot_eager", fullgraph=True)


@pytest.mark.ddp(world_size=2)
def test_inductor():
    check(doubled_then_summed, "inductor")


@pytest.mark.ddp(world_size=2, timeout=60)
def test_a_rank_skips_the_compiled_collective():
    if dist.get_rank() == 0:
        check(doubled_then_summed, "aot_eager")


class Exported(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        dist.all_reduce(y)
        return doubled_then_summed(y)


def traced_then_compiled(rank):
    # Traced on fake tensors, never run: exported (non-strict), and by make_fx.
    torch.export.export(Exported(), (torch.ones(4),), strict=False)
    make_fx(doubled_then_summed, tracing_mode="fake")(torch.ones(4))
    check(doubled_then_summed, "aot_eager")
    check(doubled_then_summed, "inductor")


def test_what_is_recorded():
    result = pytest_ddp.run(traced_then_compiled, world_size=2, timeout=120)
    assert result.outcome == "passed", result.report
    calls = [[c.op, c.site, c.devices, c.state] for c in result.ranks[0].collectives]
    with open(os.environ["RECORDED_TO"], "w") as f:
        json.dump(calls, f)
"""

# Not this file's name: its session runs in this process, which imported this module.
MODULE = "test_under_compile"


def line_of(text: str) -> str:
    return f"{MODULE}.py:{COMPILED_CODE.splitlines().index(text) + 1}"


# Where the compiled function's collective is recorded: at its line, where the code that runs it is an
# FX graph module's (aot_eager), whose node says where it came from; else (inductor's code) at the
# function's first line, which its compiled frame carries.
COLLECTIVE_LINE = line_of('    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)')
COMPILED_FUNCTION = line_of("def doubled_then_summed(x):")


@pytest.fixture
def session(module_shared: ModuleShared, pytester: pytest.Pytester) -> tuple[pytest.RunResult, Path]:
    """The session of COMPILED_CODE, run in this process by the first test that needs it: its
    result and its folder (what test_what_is_recorded recorded is in its recorded.json)."""

    def run() -> tuple[pytest.RunResult, Path]:
        recorded_to = str(pytester.path / "compiled" / "recorded.json")
        session = Session({f"{MODULE}.py": COMPILED_CODE}, env={"RECORDED_TO": recorded_to})
        return session_in_process(pytester, "compiled", session), pytester.path / "compiled"

    return module_shared.once("session", run)


def test_correct_compiled_code_passes(session: tuple[pytest.RunResult, Path]) -> None:
    """Each test passes as it does bare (torch.multiprocessing.spawn): no error from tracing the
    recorder's kernels, no error at teardown for inductor's pool or tqdm's monitor thread."""
    result, _ = session
    result.assert_outcomes(passed=5, failed=1)  # the one that fails: see the test below


def test_only_the_calls_the_compiled_code_runs_are_recorded(session: tuple[pytest.RunResult, Path]) -> None:
    """Tracing (fake tensors: torch.compile's, torch.export's, make_fx's) records nothing; the two
    runs of each compiled function (aot_eager's, inductor's) record two all_reduces, on real
    tensors, at the user's code (not at the code torch generated: FX's, inductor's)."""
    _, folder = session
    calls: list[Any] = json.loads((folder / "recorded.json").read_text())
    by_aot_eager = ["all_reduce", COLLECTIVE_LINE, ["cpu"], "ok"]
    by_inductor = ["all_reduce", COMPILED_FUNCTION, ["cpu"], "ok"]
    assert calls == [by_aot_eager] * 2 + [by_inductor] * 2


def test_a_hang_in_compiled_code_is_diagnosed_at_the_users_line(session: tuple[pytest.RunResult, Path]) -> None:
    result, _ = session
    result.stdout.fnmatch_lines(
        [
            "*rank 1 never called all_reduce #1 (returned from its test);"
            f" rank 0 waits in all_reduce #1 ({COLLECTIVE_LINE}) for rank 1. [[]ddp deadlock, partial, *]",
        ]
    )


# -- the thread check, on hand-made threads -------------------------------------------------


def test_an_idle_pool_worker_is_not_left_but_a_busy_one_is() -> None:
    before = set(threading.enumerate())
    started, release = threading.Event(), threading.Event()

    def task() -> None:  # a task that could issue a collective once released
        started.set()
        release.wait()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        pool.submit(lambda: None).result()  # its worker now waits for work
        assert leftovers.threads_left(before, wait=0.0) == []
        busy = pool.submit(task)
        started.wait()
        left = leftovers.threads_left(before, wait=0.0)
        release.set()
        busy.result()
    assert [t["name"] for t in left] == ["pool_0"]
    assert "in task" in left[0]["stack"]


def test_tqdm_monitor_is_not_left_but_a_thread_of_the_test_is() -> None:
    tqdm = pytest.importorskip("tqdm")
    from tqdm._monitor import TMonitor

    before = set(threading.enumerate())
    monitor = TMonitor(tqdm.tqdm, 60)  # starts itself, as tqdm starts it
    stop = threading.Event()
    lingering = threading.Thread(target=stop.wait, name="lingering", daemon=True)
    lingering.start()
    try:
        assert [t["name"] for t in leftovers.threads_left(before, wait=0.0)] == ["lingering"]
    finally:
        stop.set()
        monitor.exit()
        lingering.join()

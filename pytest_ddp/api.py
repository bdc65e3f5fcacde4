"""``pytest_ddp.run``: run a function on fresh ranks from inside an ordinary test.

For tests that assert that a bad pattern is *diagnosed*, not merely that good
code passes::

    def bad(rank):
        if rank == 0:
            dist.barrier()

    def test_barrier_on_one_rank_is_diagnosed():
        result = pytest_ddp.run(bad, world_size=2, timeout=10)
        assert result.outcome == "deadlock"
        assert result.diagnosis.kind == "partial"
        assert result.diagnosis.culprits == [1]

The function must be importable by the ranks: defined at module level, in a
module they can import (a test module is fine).  Ranks are started by
multiprocessing's forkserver, which re-imports the main module: a script (not
a pytest run) that calls ``run()`` needs the usual ``if __name__ ==
"__main__":`` guard, as with ``torch.multiprocessing.spawn``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from pytest_ddp.common.protocol import CallFunction, decode_value, encode_value
from pytest_ddp.config.machine import GpuShortage
from pytest_ddp.config.settings import current as current_settings
from pytest_ddp.config.spec import SpecError, parse_mark, parse_timeout
from pytest_ddp.diagnose.consistency import (
    compare_sequences,
    difference_line,
    unfinished_line,
    unfinished_work,
    unreceived_line,
    unreceived_messages,
)
from pytest_ddp.diagnose.state import Call
from pytest_ddp.faults import Fault
from pytest_ddp.groups.admission import Admission
from pytest_ddp.groups.runner import GroupPool, StartFailure, TestRun
from pytest_ddp.report.failure import failure_text, format_dump, start_failure_text

OUTCOMES = ("passed", "failed", "deadlock", "timeout")


@dataclass
class Diagnosis:
    """Why a run did not pass."""

    # "rank_exited", "partial", "mismatch", "p2p_cycle", "p2p_unmatched", "init", "timeout", "failed"
    kind: str
    culprits: list[int]  # ranks at fault
    waiting: list[int]  # ranks left waiting for them
    collective: str | None  # op name of the call at fault, e.g. "all_reduce"
    text: str  # the whole human report, as a failing marked test shows it
    # The recorded call at fault (.op .group .seq .site): where the ranks wait, or disagree; None
    # where the verdict names none (an init failure, ranks that all finished).
    call: Call | None = None


@dataclass
class RankResult:
    """What one rank did."""

    rank: int
    outcome: str  # "passed" (returned), "failed" (raised or died), "stopped" (hung or busy when stopped)
    value: Any = None  # the function's return value
    exception: str | None = None  # "TypeError: cannot pickle ..." or None
    traceback: str | None = None  # the exception's traceback, or the dumped stack of a stopped rank
    collectives: list[Call] = field(default_factory=list)  # .op .seq .group .shapes .site .state ...
    stdout: str = ""
    stderr: str = ""
    # 0 after a clean stop; negative: killed by that signal (-9: stopped while hung).
    exit_code: int | None = None
    peak_rss: int | None = None  # bytes
    peak_cuda: int | None = None  # bytes; None without CUDA


@dataclass
class Result:
    """What :func:`run` returns."""

    outcome: str  # one of OUTCOMES
    diagnosis: Diagnosis | None  # None when passed
    ranks: list[RankResult]
    elapsed: float  # seconds from hand-over to verdict
    # How the ranks' collective sequences differ, also when the run passed: Gloo lets some through.
    collective_differences: list[str] = field(default_factory=list)
    # Asynchronous work a rank left unfinished when fn returned, one line each; a test fails on it.
    unfinished_work: list[str] = field(default_factory=list)
    # The faults that fired (``faults=``), as the report names them: "SIGKILL on rank 1 at all_reduce call 3".
    injected: list[str] = field(default_factory=list)
    # MPI messages whose send returned and that no receive took, one line each; a pytest test fails on it.
    unreceived_messages: list[str] = field(default_factory=list)

    @property
    def values(self) -> list[Any]:
        return [r.value for r in self.ranks]


def run(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str | None = None,
    timeout: float = 30.0,
    init: bool = True,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    grace: float | None = None,
    mpi_launcher: str | None = None,
    faults: list[Fault] | tuple[Fault, ...] = (),
) -> Result:
    """Run ``fn(rank, *args, **kwargs)`` on ``world_size`` fresh ranks and say what happened.

    The run is admitted as a ``@pytest.mark.ddp`` test is, under the settings of the pytest
    session it is called in: ``backend``, ``grace`` and ``mpi_launcher`` default to the
    session's (``--ddp-backend``, ``--ddp-grace``, ``--ddp-mpi-launcher``, else gloo, 2 s and
    MPICH's), and a world size above what the machine holds (or ``--ddp-max-world-size``) is
    refused.  Never raises for what the ranks do.

    ``init=False`` gives the ranks the torchrun environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, ...) but no process group: ``fn`` calls
    ``init_process_group`` itself.

    ``backend="nccl"`` with fewer GPUs than ranks (this xdist worker's share of them) skips the
    calling test (``pytest.skip``) inside pytest, and raises GpuShortage elsewhere.

    ``backend="mpi"`` runs ``fn`` on the ranks of one MPI world (``MPI.COMM_WORLD``
    in ``fn``); without mpi4py or a launcher it skips the calling test inside pytest, and
    raises RuntimeError elsewhere.

    ``faults``: faults to inject (:mod:`pytest_ddp.faults`), as on the mark.  A rank
    that one of them ends (kill, exit) does not by itself fail the run; a fault
    that never fires does.
    """
    settings = current_settings()
    try:
        settings = replace(
            settings,
            grace=settings.grace if grace is None else parse_timeout(grace, "grace"),
            mpi_launcher=mpi_launcher or settings.mpi_launcher,
        )
        mark = parse_mark(
            (),
            {"world_size": world_size, "backend": backend, "timeout": timeout, "init": init, "isolated": True,
             "check_collectives": False, "faults": faults},
        )
        if mark.parametrized:
            raise SpecError(f"world_size={world_size!r}: run() takes one world size")
        admission = Admission(settings)
        spec = admission.spec(mark, mark.world_sizes[0])
    except SpecError as exc:
        raise ValueError(f"run(): {exc}") from None
    if (reason := admission.unavailable(spec)) is not None:
        if "PYTEST_CURRENT_TEST" in os.environ:
            pytest.skip(f"pytest_ddp.run(): {reason}")
        raise (GpuShortage if spec.backend == "nccl" else RuntimeError)(f"pytest_ddp.run(): {reason}")
    module = fn.__module__
    if module == "__main__" or "<locals>" in fn.__qualname__:
        raise ValueError(f"run(): {fn.__qualname__} must be a module-level function of an importable module")
    command = CallFunction(
        id=f"{module}.{fn.__qualname__}",
        module=module,
        qualname=fn.__qualname__,
        args=encode_value((tuple(args), dict(kwargs or {}))),
        faults=encode_value(spec.faults) if spec.faults else None,
    )
    pool = GroupPool(max_groups=1)
    try:
        make_config = lambda: admission.group_config(spec, spec.timeout, mode="function")
        test_run = pool.run(spec, command, make_config=make_config, keep=False)
    finally:
        pool.close()
    return _result(test_run)


def _result(test_run: TestRun | StartFailure) -> Result:
    if isinstance(test_run, StartFailure):  # no rank ran fn
        text = start_failure_text(test_run)
        nothing_ran = Diagnosis(kind="failed", culprits=[], waiting=[], collective=None, text=text)
        return Result("failed", nothing_ran, [], 0.0)
    verdict = test_run.verdict
    ranks = [_rank_result(test_run, state.rank) for state in test_run.states]
    if verdict.status == "done":
        outcome = "failed" if verdict.kind is not None or test_run.faults_not_fired else "passed"
    elif verdict.status in ("timeout", "deadlock"):
        outcome = verdict.status
    else:  # "stopped": a rank failed and the others were stopped after the grace
        outcome = "failed"
    diagnosis: Diagnosis | None = None
    if outcome != "passed":
        failures = {r.rank: r.traceback or "" for r in ranks if r.outcome == "failed" and r.traceback}
        diagnosis = Diagnosis(
            kind=verdict.kind or "failed",
            culprits=list(verdict.culprits),
            waiting=list(verdict.waiting),
            collective=verdict.collective,
            text=failure_text(test_run, failures, ""),
            call=verdict.call_at_fault(test_run.states),
        )
    differences = [difference_line(d) for d in compare_sequences(test_run.states)]
    unfinished = [unfinished_line(w) for w in unfinished_work(test_run.states)]
    injected = [event.text for state in test_run.states for event in state.injected]
    unreceived = [unreceived_line(m) for m in unreceived_messages(test_run.states)]
    return Result(outcome, diagnosis, ranks, test_run.elapsed, differences, unfinished, injected, unreceived)


def _rank_result(test_run: TestRun, rank: int) -> RankResult:
    state = test_run.states[rank]
    streams = test_run.outputs.get(rank, {})
    result = RankResult(
        rank=rank,
        outcome="stopped",
        collectives=list(state.calls),
        stdout=streams.get("stdout", ""),
        stderr=streams.get("stderr", ""),
        exit_code=test_run.exit_codes.get(rank, state.exit_code),
        peak_rss=state.peak_rss,
        peak_cuda=state.peak_cuda,
    )
    report = state.reports.get("call")
    if report is not None:
        data = report["data"]
        if report["outcome"] == "passed":
            result.outcome = "passed"
            encoded = data.get("value")
            result.value = decode_value(encoded) if encoded else None
        else:
            result.outcome = "failed"
            result.exception = data.get("exception")
            result.traceback = data.get("traceback")
    elif not state.alive:
        result.outcome = "failed"
        result.exception = f"the process died ({state.exit_code})"
    if rank in test_run.stacks:
        result.traceback = format_dump(test_run.stacks[rank], "")
    return result

"""The MPI recorder on real MPI: tests/record/mpi_program.py runs under mpiexec, each rank recording
into an event log; the logs, folded into rank states as the controller folds them, are checked,
and judged by the watchdog."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import pytest_ddp
from conftest import line_of
from pytest_ddp.common.event_log import EventReader
from pytest_ddp.common.protocol import CALL_KEYS, RET_KEYS, TestStart
from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.consistency import unreceived_messages
from pytest_ddp.diagnose.state import RankState, Snapshot
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.diagnose.wording import worded
from pytest_ddp.groups.mpi_group import find_launcher

pytest.importorskip("mpi4py")

PROGRAM = Path(__file__).with_name("mpi_program.py")
# The plugin's own choice: MPICH's gforker (it listens on no socket), else Open MPI's
# mpiexec with the options it needs.
LAUNCHER = find_launcher(None)
pytestmark = pytest.mark.skipif(LAUNCHER is None, reason="no MPI launcher next to this Python or on PATH")
# Long enough for ranks that each import torch on a loaded machine; only a failing test waits it out.
DEADLINE = 120


class MpiRun:
    """mpiexec running scenarios of mpi_program.py one after another on one world, and its ranks'
    logs folded into rank states, a list per test."""

    def __init__(self, scenarios: list[str], ranks: int, folder: Path) -> None:
        self.folder = folder
        self.readers = [EventReader(str(folder / f"rank{r}.log")) for r in range(ranks)]
        self.tests: list[list[RankState]] = [[] for _ in range(ranks)]  # per rank, a state per test
        self.started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(Path(pytest_ddp.__file__).parent.parent)}
        assert LAUNCHER is not None
        self.process = subprocess.Popen(
            [*LAUNCHER, "-n", str(ranks), sys.executable, PROGRAM.name, str(folder), *scenarios],
            cwd=PROGRAM.parent,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def states(self, test: int = 0) -> list[RankState]:
        """The ranks in the ``test``-th test (a scenario, or a test a scenario starts)."""
        return [tests[test] if len(tests) > test else RankState(rank=r) for r, tests in enumerate(self.tests)]

    def read(self) -> None:
        for rank, (reader, tests) in enumerate(zip(self.readers, self.tests)):
            for event in reader.read_new():
                if isinstance(event, TestStart):
                    tests.append(RankState(rank=rank))
                tests[-1].apply(event)

    def read_until(self, test: int, ready: Callable[[list[RankState]], bool]) -> None:
        """Fold the logs until ``ready`` holds of the ``test``-th test's states, while the ranks run."""
        while True:
            self.read()
            if ready(self.states(test)):
                return
            assert self.process.poll() is None, f"mpiexec ended first:\n{self.process.communicate()[0]}"
            assert time.monotonic() - self.started < DEADLINE, f"the logs never got there: {self.states(test)}"
            try:  # returns at once if mpiexec ends; else the logs are read again
                self.process.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass

    def finish(self) -> str:
        """Close rank 0's input (a hang was judged: rank 0 does what it left undone, so that every
        rank can end), wait for the end; mpiexec's output."""
        output, _ = self.process.communicate(timeout=DEADLINE)
        assert self.process.returncode == 0, output
        self.read()
        return output

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.communicate()


@contextmanager
def mpi_run(scenarios: list[str], ranks: int, folder: Path) -> Iterator[MpiRun]:
    run = MpiRun(scenarios, ranks, folder)
    try:
        yield run
    finally:
        run.kill()  # whatever happened, nothing of the run is left


def judge(states: list[RankState]) -> Verdict:
    snapshot = Snapshot(now=time.time(), started=0, timeout=1e6, grace=1e6, ranks=states)
    return worded(watchdog.judge(snapshot), states)


def outline(verdict: Verdict) -> tuple[str, str | None, list[int], list[int]]:
    return verdict.status, verdict.kind, verdict.culprits, verdict.waiting


def site(text: str) -> str:
    return f"mpi_program.py:{line_of(PROGRAM, text)}"


@dataclass
class Ran:
    """A world's run of scenarios: its mpiexec, its output, and a hang's verdict, judged while it hung."""

    run: MpiRun
    output: str
    verdict: Verdict


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """calls (tests 0 and 1: it starts a next test), then waitall (test 2), on one world of 2."""
    with mpi_run(["calls", "waitall"], 2, tmp_path_factory.mktemp("two_ranks")) as run:
        run.read_until(2, lambda states: states[0].finished and states[1].current_call is not None)
        verdict = judge(run.states(2))
        return Ran(run, run.finish(), verdict)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """large_any_source (test 0), then small_any_source (test 1), on one world of 3: in this order,
    as the message small_any_source leaves would meet large_any_source's receive."""
    with mpi_run(["large_any_source", "small_any_source"], 3, tmp_path_factory.mktemp("three_ranks")) as run:
        run.read_until(0, lambda states: states[0].finished and all(s.calls for s in states[1:]))
        verdict = judge(run.states(0))
        return Ran(run, run.finish(), verdict)


def test_calls_are_recorded_with_peer_tag_root_count_bytes_site_and_outcome(two_ranks: Ran) -> None:
    run, output = two_ranks.run, two_ranks.output
    assert output.count('{"world": "RecordingComm", "request": true, "cart": true}') == 2
    sender, receiver = run.states()
    calls = sender.calls
    assert [c.label for c in calls] == [
        "Send #1 to 1 (tag 5)",
        "send #2 to 1 (tag 7)",
        "Send #3 to 1 (tag 8)",
        "Isend #4 to 1 (tag 9)",
        "Send #5 to 1 (tag 10)",
        "isend #6 to 1 (tag 11)",
        "Allreduce #1",
        "allreduce #2",
        "Split #3",
        "Barrier #1 on group 1.0 [0]",
        "Dup #4",
        "Bcast #1 on group 2 [0, 1]",
        "Create_cart #5",
        "Irecv #1 from any (tag 99)",
    ]
    first = calls[0]
    assert (first.peer, first.tag, first.shapes, first.dtypes, first.extra, first.state) == (
        1,
        5,
        [[10]],
        ["int64"],
        {"bytes": 80},
        "ok",
    )
    assert first.site == site("comm.Send(data, dest=1, tag=5)")
    pickled, counted, in_place, reduced = (calls[i] for i in (1, 2, 6, 7))
    assert (pickled.obj_type, pickled.obj_size and pickled.obj_size > 0) == ("dict", True)
    assert (counted.shapes, counted.extra) == ([[4]], {"bytes": 32})
    assert (in_place.shapes, in_place.dtypes, in_place.extra) == ([[3]], ["float32"], {"bytes": 12, "op": "MAX"})
    assert (reduced.obj_type, reduced.extra) == ("int", {"op": "SUM"})
    assert calls[11].root == 1
    assert [c.state for c in calls] == ["ok"] * 13 + ["running"]  # the Isend's ret came with its Waitall

    any_source = receiver.calls[0]
    assert (any_source.peer, any_source.tag, any_source.got_source, any_source.got_tag) == (None, None, 0, 5)
    assert any_source.label == "Recv #1 from any (any tag)"
    truncated = receiver.calls[4]
    assert truncated.state == "raised" and truncated.error is not None and "truncated" in truncated.error
    assert receiver.calls[3].site == site("comm.Irecv(data, source=0, tag=9).Wait()")
    got_none = receiver.calls[5]  # its wait() returned None: it completed all the same
    assert (got_none.label, got_none.state, got_none.got_source) == ("irecv #2 from any (tag 11)", "ok", 0)
    for state in run.states():
        assert state.in_flight == [{"i": 13, "err": "request not complete 0.1 s after the test"}]
    assert outline(judge(run.states())) == ("done", None, [], [])
    # The next test on these ranks numbers its calls from 0; a communicator made before it is named so.
    assert [[c.label for c in tests[1].calls] for tests in run.tests] == [["Barrier #1 on group before-2 [0, 1]"]] * 2
    # The recorder writes its events by hand: only keys the wire format defines.
    lines = [json.loads(line) for r in (0, 1) for line in (run.folder / f"rank{r}.log").read_text().splitlines()]
    assert all(set(line) <= CALL_KEYS for line in lines if line["e"] == "call")
    assert all(set(line) <= RET_KEYS for line in lines if line["e"] == "ret")


def test_small_sends_to_one_any_source_receive_pass_but_leave_a_message_never_received(three_ranks: Ran) -> None:
    states = three_ranks.run.states(1)
    assert outline(judge(states)) == ("done", None, [], [])
    got = states[0].calls[0].got_source
    assert got in (1, 2)
    unreceived = [(m.rank, m.dest, m.call.label) for m in unreceived_messages(states)]
    assert unreceived == [(3 - got, 0, "Send #1 to 0 (tag 0)")]


def test_large_sends_to_one_any_source_receive_blame_the_receiver(three_ranks: Ran) -> None:
    run, verdict = three_ranks.run, three_ranks.verdict
    blocked = 3 - (run.states()[0].calls[0].got_source or 0)
    assert outline(verdict) == ("deadlock", "partial", [0], [blocked])
    assert verdict.summary == (
        f"rank 0 never received from rank {blocked} (returned from its test); "
        f"rank {blocked} waits in Send #1 to 0 (tag 0) ({site('# blocks in one of ranks 1, 2')})."
    )


def test_a_rank_in_waitall_waits_in_its_irecv(two_ranks: Ran) -> None:
    run, verdict = two_ranks.run, two_ranks.verdict
    assert outline(verdict) == ("deadlock", "partial", [0], [1])
    line = site("MPI.Request.Waitall([comm.Irecv(data, source=0, tag=3)])")
    assert verdict.summary == (
        f"rank 0 never sent to rank 1 (returned from its test); rank 1 waits in Irecv #1 from 0 (tag 3) ({line})."
    )
    assert run.states(2)[1].calls[0].state == "ok"  # rank 0 sent once the hang was judged

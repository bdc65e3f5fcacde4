"""The headline of a failure leads with what happened and to whom, then the verdict's tag
(``[ddp deadlock, partial, 0.41 s]``), so that pytest's short test summary, cut at an 80-column
terminal, keeps the cause; and the call it names is the first where the ranks' sequences differ,
the one the sequence table marks, even with an earlier asynchronous call still in flight.  A
failure every failing rank shares leads with its error; a headline is one line of at most 200
characters, the whole lead in the body when it was cut."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from snapshots import rank, snap

from conftest import ModuleShared, Session, line_of, session_in_process
from pytest_ddp.config.spec import RankSpec
from pytest_ddp.diagnose import watchdog
from pytest_ddp.diagnose.state import Call, RankState, Snapshot
from pytest_ddp.diagnose.wording import worded
from pytest_ddp.groups.runner import TestRun
from pytest_ddp.report.failure import HEADLINE_LIMIT, render
from pytest_ddp.report.json_report import to_json
from pytest_ddp.report.model import build
from pytest_ddp.report.sequences import group_sequences, table

# -- the call named: the first where the sequences differ (hand-made states) ----------------


def _call(index: int, seq: int, *, is_async: bool = False, done: bool = False) -> Call:
    call = Call(index=index, op="all_reduce", group="WORLD", group_ranks=(0, 1), seq=seq,
                site=f"t.py:{10 + seq}", enter=1.0, shapes=[[4]], dtypes=["float32"], is_async=is_async)
    if done:
        call.exit = 1.1
    return call


def _two_in_flight() -> list[RankState]:
    """Rank 0 made all_reduce #1, issued #2 asynchronously (still running) and waits in #3;
    rank 1 made #1 and returned from its test."""
    waiting = RankState(rank=0, phase="call")
    waiting.calls = [_call(0, 1, done=True), _call(1, 2, is_async=True), _call(2, 3)]
    gone = RankState(rank=1, phase="finished", finished_at=1.5)
    gone.calls = [_call(0, 1, done=True)]
    return [waiting, gone]


def test_the_headline_names_the_first_call_the_table_marks_not_the_one_waited_in() -> None:
    states = _two_in_flight()
    verdict = worded(watchdog.judge(Snapshot(now=2.0, started=0.0, timeout=60, grace=2, ranks=states)), states)
    assert (verdict.kind, verdict.culprits, verdict.call) == ("partial", [1], "all_reduce #2")
    assert verdict.summary == (
        "rank 1 never called all_reduce #2 (returned from its test); "
        "rank 0 waits in all_reduce #3 (t.py:13) for rank 1."
    )
    marked = [line for line in table(group_sequences(states)) if line.endswith("<-- ranks differ")]
    assert [line.split()[0] for line in marked] == ["2"]


def test_the_text_and_the_json_say_the_headline_and_rank_lines_of_one_build() -> None:
    states = _two_in_flight()
    verdict = worded(watchdog.judge(Snapshot(now=2.0, started=0.0, timeout=60, grace=2, ranks=states)), states)
    report = build(TestRun("t.py::test_x", RankSpec(2, "gloo", 60.0, 2.0), states, verdict, 0.41, 2.0), {}, "t.py")
    assert report.headline == f"{verdict.summary} [ddp deadlock, partial, 0.41 s]"
    text, data = render(report).splitlines(), to_json(report)
    assert text[0] == data["headline"] == report.headline
    assert [r["line"] for r in data["ranks"]] == text[2:4] == [
        "rank 0: waiting in all_reduce #3 (t.py:13), in call",
        "rank 1: finished (passed); last call all_reduce #1 (t.py:11)",
    ]


def test_a_rank_that_made_the_earlier_call_is_named_for_the_call_waited_in() -> None:
    states = _two_in_flight()
    states[1].calls.append(_call(1, 2, is_async=True, done=True))  # rank 1 made #2 too, then returned
    verdict = worded(watchdog.judge(Snapshot(now=2.0, started=0.0, timeout=60, grace=2, ranks=states)), states)
    assert verdict.call == "all_reduce #3"
    assert verdict.summary.startswith("rank 1 never called all_reduce #3 (returned from its test);")


def _gather(index: int, size: int, *, raised: bool = False) -> Call:
    call = Call(index=index, op="all_gather_single", group="WORLD", group_ranks=(0, 1), seq=1, site="t.py:5",
                enter=1.0, shapes=[[size]], dtypes=["float32"], exit=1.1)
    call.error = "RuntimeError: [gloo] invalid tensor size" if raised else None
    return call


def test_sizes_that_differ_are_a_mismatch_whichever_rank_raised() -> None:
    """Gloo raises on one rank of an all_gather_single whose sizes differ and lets the other go
    on to its next call: both calls are recorded and disagree, so the verdict is the mismatch
    (not rank_exited), whichever rank raised."""
    for raised in (0, 1):
        states = []
        for r, size in ((0, 2), (1, 3)):
            state = RankState(rank=r, phase="call")
            state.calls = [_gather(0, size, raised=r == raised)]
            if r == raised:
                state.phase, state.finished_at, state.failed_at = "finished", 1.5, 1.2
            else:
                state.calls.append(Call(index=1, op="barrier", group="WORLD", group_ranks=(0, 1), seq=2,
                                        site="t.py:6", enter=1.2))
            states.append(state)
        verdict = watchdog.judge(Snapshot(now=2.0, started=0.0, timeout=60, grace=2, ranks=states))
        assert (verdict.kind, verdict.culprits, verdict.call) == ("mismatch", [0, 1], "all_gather_single #1"), raised


# -- a failure every failing rank shares leads with its error (hand-made states) ------------


def _failed(*errors: str) -> list[str]:
    """The first lines of the report of a test whose ranks finished, each failed with its error."""
    states = [rank(r, finished=True, failed=error) for r, error in enumerate(errors)]
    verdict = worded(watchdog.judge(snap(*states)), states)
    run = TestRun("t.py::test_x", RankSpec(len(states), "gloo", 60.0, 2.0), states, verdict, 0.4, 2.0)
    return render(build(run, {}, "t.py")).splitlines()


def test_a_failure_the_failing_ranks_share_leads_with_its_error() -> None:
    missing = "fixture 'no_such_fixture' not found"
    assert _failed(missing, missing)[0] == f"{missing} (ranks 0, 1). [ddp failed]"
    summary = f"ERROR t.py::test_x - {_failed(missing, missing)[0]}"  # as pytest writes it
    assert missing in summary[:80]


def test_ranks_that_failed_each_their_way_keep_the_verdicts_words() -> None:
    assert _failed("ValueError: a", "ValueError: b")[0] == (
        "rank 0 failed (ValueError: a); rank 1 failed (ValueError: b). [ddp failed]"
    )


def test_a_long_lead_is_cut_in_the_one_headline_and_whole_in_the_body() -> None:
    long = "ValueError:" + " the batch was bad;" * 20
    lines = _failed(long, long)
    first, blank, *body = lines
    assert len(first) <= HEADLINE_LIMIT and first.endswith("... [ddp failed]") and blank == ""
    assert body[:2] == ["rank 0: finished (failed); last call no collective yet",
                        "rank 1: finished (failed); last call no collective yet"]
    assert body[2:] == ["", "the headline in full:", f"  {long} (ranks 0, 1)."]


# -- real failures of each kind, in one session at 80 columns -------------------------------

FAILURES = """
import os, time
import pytest, torch, torch.distributed as dist


@pytest.mark.ddp(world_size=2)
def test_partial(rank):
    dist.all_reduce(torch.ones(1))
    if rank != 1:  # rank 1 skips it
        dist.all_reduce(torch.ones(1))  # partial


@pytest.mark.ddp(world_size=2)
def test_in_flight(rank):
    dist.all_reduce(torch.ones(1))
    if rank != 1:  # rank 1 skips them
        dist.all_reduce(torch.ones(1), async_op=True)  # issued, never completed
        dist.all_reduce(torch.ones(1))  # waited in


@pytest.mark.ddp(world_size=2)
def test_mismatch(rank):
    dist.all_reduce(torch.ones(10 if rank == 0 else 20))


@pytest.mark.ddp(world_size=2)
def test_cycle(rank):
    dist.recv(torch.zeros(1), src=1 - rank)


@pytest.mark.ddp(world_size=2)
def test_unmatched(rank):
    if rank == 0:
        dist.send(torch.ones(1), dst=1)
    dist.barrier()


@pytest.mark.ddp(world_size=2)
def test_exited(rank):
    if rank == 1:
        raise ValueError("bad batch")
    dist.all_reduce(torch.ones(1))


@pytest.mark.ddp(world_size=2, init=False)
def test_init():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=2 if rank == 1 else rank, world_size=2)


@pytest.mark.ddp(world_size=2, timeout=2)
def test_timeout(rank):
    if rank == 1:
        time.sleep(3600)
    dist.barrier()


@pytest.mark.ddp(world_size=2)
def test_failed(rank):
    assert rank == 0, "loss diverged"


@pytest.mark.ddp(world_size=2)
def test_fixture(rank, nosuch):
    pass


@pytest.mark.ddp(world_size=2, colour="red")
def test_bad_mark(rank):
    pass
"""

# Each test -> what its headline must say within the short summary's 80 columns, and its tag
# (a regular expression: Gloo may fail both ranks on a mismatch before the watchdog sees them wait).
DEADLOCK = r"deadlock, {}, \d+\.\d\d s"
CAUSES = {
    "test_partial": ("rank 1 never called all_reduce #2", DEADLOCK.format("partial")),
    "test_in_flight": ("rank 1 never called all_reduce #2", DEADLOCK.format("partial")),
    "test_mismatch": ("ranks 0, 1 disagree on all_reduce #1", f"({DEADLOCK.format('mismatch')}|failed, mismatch)"),
    "test_cycle": ("a point-to-point cycle", DEADLOCK.format("p2p_cycle")),
    "test_unmatched": ("no recv matches rank 0's send #1", DEADLOCK.format("p2p_unmatched")),
    "test_exited": ("rank 1 failed (ValueError: bad batch)", DEADLOCK.format("rank_exited")),
    "test_init": ("process 1 passed rank 2, out of range", DEADLOCK.format("init")),
    "test_timeout": ("timed out after 2 s: rank 1 is running", "timeout"),
    "test_failed": ("AssertionError: loss diverged", "failed"),
    "test_fixture": ("fixture 'nosuch' not found (ranks 0, 1)", "failed"),
}
NOT_RUN = {"test_bad_mark": "unknown argument colour"}  # no rank ran it: no verdict, no tag


@pytest.fixture
def session(module_shared: ModuleShared, pytester: pytest.Pytester) -> tuple[pytest.RunResult, Path]:
    """FAILURES' session, run in this process by the first test that needs it, and its file."""

    def run() -> tuple[pytest.RunResult, Path]:
        failures = Session({"test_h.py": FAILURES}, ("-rfE", "--tb=short"), {"COLUMNS": "80"})
        return session_in_process(pytester, "headline", failures), pytester.path / "headline" / "test_h.py"

    return module_shared.once("session", run)


def _short_summary(result: pytest.RunResult) -> dict[str, str]:
    """Each test's line in pytest's short test summary."""
    lines = {}
    for line in result.outlines:
        found = re.match(r"(FAILED|ERROR) test_h\.py::(\w+)", line)
        if found:
            lines[found.group(2)] = line
    return lines


@pytest.mark.parametrize("test", sorted([*CAUSES, *NOT_RUN]))
def test_the_short_summary_at_80_columns_keeps_the_cause(
    session: tuple[pytest.RunResult, Path], test: str
) -> None:
    result, _ = session
    cause = CAUSES[test][0] if test in CAUSES else NOT_RUN[test]
    line = _short_summary(result)[test]
    assert len(line) <= 80 and cause in line, line


@pytest.mark.parametrize("test", sorted(CAUSES))
def test_the_headline_keeps_the_verdicts_kind_at_its_end(session: tuple[pytest.RunResult, Path], test: str) -> None:
    result, _ = session
    cause, tag = CAUSES[test]
    headlines = [line for line in result.outlines if line.startswith(cause)]
    assert headlines and re.search(rf" \[ddp {tag}\]$", headlines[0]), headlines


def test_two_calls_in_flight_name_the_first_the_table_marks(session: tuple[pytest.RunResult, Path]) -> None:
    result, path = session
    out = result.stdout.str()
    report = out[out.index("_ test_in_flight _") :]
    first, waited = line_of(path, "async_op=True"), line_of(path, "# waited in")
    assert report.splitlines()[1].startswith(
        "rank 1 never called all_reduce #2 (returned from its test); "
        f"rank 0 waits in all_reduce #3 (test_h.py:{waited})"
    )
    marked = next(line for line in report.splitlines() if line.endswith("<-- ranks differ"))
    assert marked.split()[:3] == ["2", "all_reduce", "[1]"], marked
    assert f"test_h.py:{first}" not in report.splitlines()[1]

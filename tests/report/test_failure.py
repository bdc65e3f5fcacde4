"""A failure's text (report/failure.py) on hand-made runs: its headline one line of at most
HEADLINE_LIMIT characters, the lead it cut whole in the body; a start failure's first line its
headline once; a dead rank's stderr cut to its fatal error and the test's frames."""

from __future__ import annotations

from pytest_ddp.config.spec import RankSpec
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.diagnose.verdicts import Verdict
from pytest_ddp.groups.runner import StartFailure, TestRun
from pytest_ddp.report.failure import HEADLINE_LIMIT, failure_text, start_failure_text, stderr_tail


def _failed_run(summary: str) -> TestRun:
    verdict = Verdict("done", "failed", culprits=[0, 1], summary=summary)
    states = [RankState(0), RankState(1)]
    return TestRun("t.py::test_x", RankSpec(2, "gloo", 60.0, 2.0), states, verdict, 1.0, 1.0)


def test_a_long_multi_line_headline_is_one_capped_line_with_the_whole_text_in_the_body() -> None:
    gloo = (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [::1]:29500"
    )
    summary = "ranks 0, 1 raised:\n" + "\n".join(f"rank {r}: {gloo}" for r in range(8))
    text = failure_text(_failed_run(summary), {}, "t.py")
    first, blank, *rest = text.splitlines()
    assert len(first) <= HEADLINE_LIMIT and first.endswith("... [ddp failed]")  # the tag is kept
    assert first.startswith("ranks 0, 1 raised: rank 0: RuntimeError")
    assert blank == ""
    assert rest[0].startswith("rank 0: ")  # no second headline: the ranks' lines follow it
    full = "\n".join(rest)
    assert "\nthe headline in full:\n" + "\n".join(f"  {line}" for line in summary.splitlines()) in full


def test_a_short_headline_is_shown_once_on_one_line() -> None:
    text = failure_text(_failed_run("rank 1 raised ValueError: boom"), {}, "t.py")
    assert text.splitlines()[:2] == ["rank 1 raised ValueError: boom [ddp failed]", ""]
    assert text.splitlines()[2].startswith("rank 0: ")
    summary = "rank 1 raised RuntimeError: Rank 1 failed to pass monitoredBarrier\n in 1000 ms"
    text = failure_text(_failed_run(summary), {}, "t.py")
    assert text.splitlines()[:2] == [f"{' '.join(summary.split())} [ddp failed]", ""]
    assert "monitoredBarrier\n" not in text


HARNESS = '  File "/venv/lib/python3.11/site-packages/{}.py", line 1 in f'


def test_a_dead_ranks_stderr_keeps_the_fatal_error_and_the_tests_frames() -> None:
    stderr = "\n".join(
        [f"warning {i}" for i in range(50)]
        + ["terminate called after throwing an instance of 'gloo::IoException'",
           "Fatal Python error: Aborted", "",
           "Current thread 0x00007f53ff842b80 (most recent call first):",
           '  File "/src/test_ab.py", line 3 in helper', '  File "/src/test_ab.py", line 7 in test_abort']
        + [HARNESS.format(name) for name in ["_pytest/python", "pluggy/_execution"] * 30]
        + ["", "Extension modules: torch._C (total: 1)"]
    )
    tail = stderr_tail(stderr, "/src/test_ab.py").splitlines()
    assert len(tail) <= 42  # 40 lines, and a line saying what was left out on each side
    assert "Fatal Python error: Aborted" in tail
    assert "terminate called after throwing an instance of 'gloo::IoException'" in tail
    assert '> File "/src/test_ab.py", line 7 in test_abort' in tail
    assert "  (60 pytest and pytest-ddp frames hidden)" in tail
    assert tail[-1] == "Extension modules: torch._C (total: 1)"
    assert tail[0].endswith("earlier lines left out)")


def test_a_dead_ranks_stderr_tail_without_a_fatal_error_is_its_last_lines() -> None:
    tail = stderr_tail("\n".join(f"line {i}" for i in range(100)), "/src/test_x.py").splitlines()
    assert tail == ["(60 earlier lines left out)"] + [f"line {i}" for i in range(60, 100)]


def _start_failure(error: str) -> StartFailure:
    return StartFailure("t.py::test_x", RankSpec(2, "gloo", 60.0, 2.0), error, 1.0)


def test_a_start_failures_first_line_is_its_headline_once() -> None:
    failure = _start_failure(
        "rank 1 could not start:\nTraceback (most recent call last):\nImportError: no torch\n"
    )
    assert start_failure_text(failure).splitlines() == [
        "ddp: rank 1 could not start",
        "",
        "Traceback (most recent call last):",
        "ImportError: no torch",
    ]
    assert start_failure_text(_start_failure("ranks [1] were not ready in time")) == (
        "ddp: ranks [1] were not ready in time"
    )


def test_a_start_failures_first_line_cut_in_the_headline_is_whole_below_it() -> None:
    first = "rank 1 exited while starting (exit code 1): " + "the launcher said no; " * 20
    lines = start_failure_text(_start_failure(f"{first}\nmore")).splitlines()
    assert lines[0].startswith("ddp: rank 1 exited while starting") and lines[0].endswith("...")
    assert len(lines[0]) <= HEADLINE_LIMIT
    assert lines[1:] == ["", first, "more"]

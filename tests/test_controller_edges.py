"""The controller's edges: the ranks' environment and shared directory, teardown
errors of stopped groups, durations, headlines and stderr tails."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import line_of


def test_ranks_get_torchruns_environment(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_env(rank):
            env = os.environ
            assert dist.is_torchelastic_launched()
            expected = {
                "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank),
                "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "2",
                "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            }
            assert {k: env.get(k) for k in expected} == expected
            run_ids = [None, None]
            dist.all_gather_object(run_ids, env["TORCHELASTIC_RUN_ID"])
            assert run_ids[0] == run_ids[1] != ""
        """
    )
    result.assert_outcomes(passed=1)


def test_ddp_shared_path_is_one_directory_for_all_ranks_of_a_test(ddp_pytester) -> None:
    basetemp = ddp_pytester.pytester.path / "basetemp"
    result = ddp_pytester.run(
        """
        import torch.distributed.checkpoint as dcp

        seen = []

        @pytest.mark.ddp(world_size=2)
        def test_files(rank, ddp_shared_path):
            if rank == 0:
                (ddp_shared_path / "note.txt").write_text("from rank 0")
            dist.barrier()
            assert (ddp_shared_path / "note.txt").read_text() == "from rank 0"
            paths = [None, None]
            dist.all_gather_object(paths, str(ddp_shared_path))
            assert paths[0] == paths[1]
            seen.append(ddp_shared_path)
            if rank == 0:
                open("shared.txt", "w").write(str(ddp_shared_path))

        @pytest.mark.ddp(world_size=2)
        def test_checkpoint_round_trip(rank, ddp_shared_path):
            state = {"w": torch.full((4,), float(rank + 1)), "step": torch.tensor(7)}
            dcp.save(state, checkpoint_id=str(ddp_shared_path / "ckpt"))
            loaded = {"w": torch.zeros(4), "step": torch.tensor(0)}
            dcp.load(loaded, checkpoint_id=str(ddp_shared_path / "ckpt"))
            assert int(loaded["step"]) == 7
            # Replicated tensors are saved once, by rank 0: every rank reads rank 0's values.
            assert torch.equal(loaded["w"], torch.full((4,), 1.0))
            seen.append(ddp_shared_path)
            assert seen[0] != seen[1], "each test gets its own directory"
        """,
        f"--basetemp={basetemp}",
    )
    result.assert_outcomes(passed=2)
    shared = Path((ddp_pytester.pytester.path / "shared.txt").read_text())
    # In the session's basetemp, kept after it like tmp_path (pytest's rotation removes it).
    assert shared.parent == basetemp / "ddp_shared"
    assert (shared / "note.txt").read_text() == "from rank 0"


BROKEN_MODULE_FIXTURE = """
@pytest.fixture(scope="module")
def resource():
    yield 1
    raise RuntimeError("module teardown broke")
"""


# ws2's group is evicted (--ddp-max-groups=1) for test_b, after test_a was
# reported: its ranks tear `resource` down only then, at the group's stop.
EVICTING_TEST_A = """
@pytest.mark.ddp(world_size=2)
def test_a(resource):
    pass

@pytest.mark.ddp(world_size=1)
def test_b():
    pass

@pytest.mark.ddp(world_size=2)
def test_c():
    pass
"""
EVICTED_AFTER_TEST_A = BROKEN_MODULE_FIXTURE + EVICTING_TEST_A


def test_a_stopped_groups_failed_teardown_is_an_error_naming_the_group(ddp_pytester) -> None:
    # A plugin that reads the item's funcargs in every report, as pytest-benchmark does: the stop's
    # report comes after the item's teardown, when its funcargs are None. The rank raised there and
    # sent nothing (seen on a machine with pytest-benchmark installed).
    ddp_pytester.pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            item.funcargs.get("benchmark")
            yield
        """
    )
    result = ddp_pytester.run(
        EVICTED_AFTER_TEST_A,
        "--ddp-max-groups=1", "--junitxml=junit.xml",
    )
    result.assert_outcomes(passed=3, errors=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of ddp group world_size=2, gloo (stopped after test_a)*",
        "ddp: when the rank group (world_size=2, gloo) was stopped after test_it.py::test_a, *",
        "*ranks 0, 1: failed*",
        "*RuntimeError: module teardown broke",
        "ERROR test_it.py::test_b*",
    ])
    # junit: an extra test case for test_b, the test reported when the group was stopped.
    cases = list(ET.parse(ddp_pytester.pytester.path / "junit.xml").getroot().iter("testcase"))
    errors = [(case.get("name"), case.find("error")) for case in cases if case.find("error") is not None]
    assert [name for name, _ in errors] == ["test_b"]
    assert "module teardown broke" in errors[0][1].get("message")


# test_a destroys the process group: its group is stopped right after it, before it is
# reported, and `resource`, kept for test_b, is torn down then.
# Work a test leaves in flight (a receive nothing sends to; check_collectives=False keeps it from
# failing the test) puts its group in doubt: it is stopped right after test_a. (Ending the process
# group no longer does: the next test gets a fresh one on the same ranks.)
STOPPED_RIGHT_AFTER_TEST_A = """
@pytest.mark.ddp(world_size=2, check_collectives=False)
def test_a(resource):
    dist.irecv(torch.zeros(1), src=1 - dist.get_rank())

@pytest.mark.ddp(world_size=2)
def test_b():
    pass
"""


def test_teardown_at_the_stop_right_after_a_test_is_that_tests_error(ddp_pytester) -> None:
    result = ddp_pytester.run(
        BROKEN_MODULE_FIXTURE + STOPPED_RIGHT_AFTER_TEST_A,
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_a*",
        "the ranks failed in the teardown of the fixtures they still held when their group was stopped "
        "[[]ddp failed*]",
        "*ranks 0, 1: failed*",
        "E       RuntimeError: module teardown broke",
        "*RuntimeError (in teardown)",
    ])


def test_a_stopped_groups_failed_teardown_is_reported_under_xdist(ddp_pytester) -> None:
    # Each test goes to its own worker; test_a's worker keeps its group for
    # test_b, which it never gets, and stops it at its session's end.
    result = ddp_pytester.run_subprocess(
        BROKEN_MODULE_FIXTURE
        + """
@pytest.mark.xdist_group("a")
@pytest.mark.ddp(world_size=2)
def test_a(resource):
    pass

@pytest.mark.xdist_group("b")
@pytest.mark.ddp(world_size=2)
def test_b():
    pass
""",
        "-n", "2", "--dist", "loadgroup",
    )
    result.assert_outcomes(passed=2, errors=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*RuntimeError: module teardown broke*"])


def ending_module_fixture(ending: str) -> str:
    """A module fixture whose teardown, on rank 1, says so on stderr and then runs ``ending``."""
    return f"""
import signal, threading

@pytest.fixture(scope="module")
def resource(rank):
    yield 1
    if rank == 1:
        print("rank 1 tears resource down", file=sys.stderr)
        {ending}
"""


# Each way a rank ends its teardown at its group's stop without reporting it, and the lines
# that say so (fnmatch patterns, in order) under "rank 1: failed".
HELD = "the teardown of the fixtures it still held when its group was stopped"
ENDINGS = [
    pytest.param(
        "os._exit(3)", [f"died (exit code 3) during {HELD}", "its stderr:", "rank 1 tears*"], id="exit"
    ),
    pytest.param(
        "os.kill(os.getpid(), signal.SIGSEGV)",
        [
            f"died (killed by SIGSEGV) during {HELD}", "its stderr:", "rank 1 tears*",
            "Fatal Python error: Segm*",
        ],
        id="sigsegv",
    ),
    pytest.param(
        "threading.Event().wait()",
        [
            f"did not finish {HELD} within 1 s, and was killed",
            "its Python stacks when killed:",
            "*line * in resource",
            "its stderr:",
            "rank 1 tears*",
        ],
        id="hang",
    ),
]

# The inner session's controller gives a rank 1 s, not 5, to finish its teardown at a
# group's stop (the hang's wait); put back at its end: the module is this process's too.
SHORT_STOP_WAIT = """
import pytest_ddp.groups.group

SAVED = pytest_ddp.groups.group.STOP_WAIT

def pytest_configure(config):
    pytest_ddp.groups.group.STOP_WAIT = 1.0

def pytest_unconfigure(config):
    pytest_ddp.groups.group.STOP_WAIT = SAVED
"""


@pytest.mark.parametrize("ending, said", ENDINGS)
def test_a_rank_that_ends_in_a_stopped_groups_teardown_is_an_error_naming_it(
    ddp_pytester, ending, said
) -> None:
    ddp_pytester.pytester.makeconftest(SHORT_STOP_WAIT)
    result = ddp_pytester.run(ending_module_fixture(ending) + EVICTING_TEST_A, "--ddp-max-groups=1")
    result.assert_outcomes(passed=3, errors=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of ddp group world_size=2, gloo (stopped after test_a)*",
            "ddp: when the rank group (world_size=2, gloo) was stopped after test_it.py::test_a, *",
            "*rank 1: failed*",
            *said,
            "ERROR test_it.py::test_b*",
        ]
    )


@pytest.mark.parametrize("ending, said", ENDINGS)
def test_a_rank_that_ends_in_the_teardown_at_the_stop_right_after_a_test_is_that_tests_error(
    ddp_pytester, ending, said
) -> None:
    ddp_pytester.pytester.makeconftest(SHORT_STOP_WAIT)
    result = ddp_pytester.run(
        ending_module_fixture(ending) + STOPPED_RIGHT_AFTER_TEST_A,
    )
    result.assert_outcomes(passed=2, errors=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a*",
            "the ranks failed in the teardown of the fixtures they still held when their group was stopped "
            "[[]ddp*]",
            "*rank 1: failed*",
            *said,
        ]
    )


def test_a_rank_that_died_in_its_test_is_not_reported_again_at_its_groups_stop(ddp_pytester) -> None:
    # Rank 0 finishes test_a, rank 1 dies in it: the group is stopped right after, rank 0
    # tears `resource` down, and rank 1's death is test_a's failure alone.
    result = ddp_pytester.run(
        ending_module_fixture("pass")
        + """
@pytest.mark.ddp(world_size=2)
def test_a(rank, resource):
    if rank == 1:
        os._exit(3)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*rank 1: died (exit code 3) during call*"])
    assert "teardown of the fixtures" not in result.stdout.str()


def test_a_hung_tests_time_is_counted_once_and_a_phase_that_never_ran_lasts_0_s(
    ddp_pytester, tmp_path
) -> None:
    ddp_pytester.pytester.makeconftest(
        """
        import json

        def pytest_runtest_logreport(report):
            with open("durations.jsonl", "a") as f:
                f.write(json.dumps([report.when, report.outcome, report.duration]) + "\\n")
        """
    )
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2, timeout=1)
        def test_hangs(rank):
            if rank == 0:
                dist.barrier()
            else:
                time.sleep(60)
        """,
        f"--ddp-report-dir={tmp_path}", "--junitxml=junit.xml",
    )
    result.assert_outcomes(failed=1)
    lines = (ddp_pytester.pytester.path / "durations.jsonl").read_text().splitlines()
    durations = {when: duration for when, _, duration in map(json.loads, lines)}
    [path] = [p for p in tmp_path.glob("*.json") if not p.name.endswith(".trace.json")]
    elapsed = json.loads(path.read_text())["elapsed"]
    assert durations["teardown"] == 0.0  # never ran: every rank was stopped in call
    # The call ran from the end of setup to the verdict: within the run, and counted once
    # (junit's time is the sum of the phases, setup's milliseconds included; it and the JSON's
    # elapsed are rounded to the ms).
    assert 0 < durations["call"] <= elapsed + 0.001
    case = next(ET.parse(ddp_pytester.pytester.path / "junit.xml").getroot().iter("testcase"))
    assert float(case.get("time")) <= elapsed + durations["setup"] + 0.002


def _failed_run(summary: str):
    from pytest_ddp.config.spec import RankSpec
    from pytest_ddp.diagnose.state import RankState
    from pytest_ddp.diagnose.verdicts import Verdict
    from pytest_ddp.groups.runner import TestRun

    verdict = Verdict("done", "failed", culprits=[0, 1], summary=summary)
    states = [RankState(0), RankState(1)]
    return TestRun("t.py::test_x", RankSpec(2, "gloo", 60.0, 2.0), states, verdict, 1.0, 1.0)


def test_a_long_multi_line_headline_is_one_capped_line_with_the_whole_text_in_the_body() -> None:
    from pytest_ddp.report.failure import HEADLINE_LIMIT, failure_text

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


HARNESS = '  File "/venv/lib/python3.11/site-packages/{}.py", line 1 in f'


def test_a_dead_ranks_stderr_keeps_the_fatal_error_and_the_tests_frames() -> None:
    from pytest_ddp.report.failure import stderr_tail

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
    from pytest_ddp.report.failure import stderr_tail

    tail = stderr_tail("\n".join(f"line {i}" for i in range(100)), "/src/test_x.py").splitlines()
    assert tail == ["(60 earlier lines left out)"] + [f"line {i}" for i in range(60, 100)]


def test_a_rank_killed_by_sigabrt_shows_the_fatal_error_and_the_tests_line(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        def helper():
            os.abort()

        @pytest.mark.ddp(world_size=2)
        def test_abort(rank):
            if rank == 1:
                helper()
            dist.barrier()
        """
    )
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    tail = text[text.index("rank 1: stderr (killed by SIGABRT)") : text.index("Captured stderr (rank 1)")]
    assert "Fatal Python error: Aborted" in tail
    line = line_of(ddp_pytester.pytester.path / "test_it.py", "        helper()")
    assert f'> File "{ddp_pytester.pytester.path / "test_it.py"}", line {line} in test_abort' in tail
    assert "pytest and pytest-ddp frames hidden" in tail and "/pluggy/" not in tail


def test_a_short_headline_is_shown_once_on_one_line() -> None:
    from pytest_ddp.report.failure import failure_text

    text = failure_text(_failed_run("rank 1 raised ValueError: boom"), {}, "t.py")
    assert text.splitlines()[:2] == ["rank 1 raised ValueError: boom [ddp failed]", ""]
    assert text.splitlines()[2].startswith("rank 0: ")
    summary = "rank 1 raised RuntimeError: Rank 1 failed to pass monitoredBarrier\n in 1000 ms"
    text = failure_text(_failed_run(summary), {}, "t.py")
    assert text.splitlines()[:2] == [f"{' '.join(summary.split())} [ddp failed]", ""]
    assert "monitoredBarrier\n" not in text


def _start_failure(error: str):
    from pytest_ddp.config.spec import RankSpec
    from pytest_ddp.groups.runner import StartFailure

    return StartFailure("t.py::test_x", RankSpec(2, "gloo", 60.0, 2.0), error, 1.0)


def test_a_start_failures_first_line_is_its_headline_once() -> None:
    from pytest_ddp.report.failure import start_failure_text

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
    from pytest_ddp.report.failure import HEADLINE_LIMIT, start_failure_text

    first = "rank 1 exited while starting (exit code 1): " + "the launcher said no; " * 20
    lines = start_failure_text(_start_failure(f"{first}\nmore")).splitlines()
    assert lines[0].startswith("ddp: rank 1 exited while starting") and lines[0].endswith("...")
    assert len(lines[0]) <= HEADLINE_LIMIT
    assert lines[1:] == ["", first, "more"]


def test_pdb_shows_a_failed_ddp_test_at_once_and_says_it_cannot_enter_a_rank(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=1)
        def test_fails(rank):
            assert rank == 1

        def test_after():
            pass
        """,
        "--pdb",
    )
    result.assert_outcomes(failed=1, passed=1)  # the session goes on, as after pdb's "continue"
    result.stdout.fnmatch_lines(
        [
            "*>>> traceback >>>*",
            "*assert 0 == 1*",
            "*>>> pytest-ddp: --pdb cannot enter a rank: ranks run without a terminal >>>*",
            "Each rank's traceback is above; -l adds its locals.",
            "*= FAILURES =*",
        ]
    )

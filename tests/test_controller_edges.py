"""The controller's edges: teardown errors of stopped groups, durations, and --pdb."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

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

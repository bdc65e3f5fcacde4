"""Hostile input for the reports, and plugins that run tests again or in another order.

A rank's text that UTF-8 cannot encode (a lone surrogate: how Python decodes a non-UTF-8 file
name) reaches the terminal, the JSON, the trace, the page and junitxml, escaped, and the session
goes on; report files of different tests never share a name; a test run again inside its ranks
(pytest-rerunfailures' flaky mark) gets a fresh ``ddp_shared_path``, and a rank that runs it
again alone fails it; a full disk is an error that says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import HEADER
from pytest_ddp.report.writable import NAME_HASH, NAME_PREFIX, file_name, printable

SURROGATE = os.fsdecode(b"\xff")  # "\udcff"
ESCAPED = "\\udcff"  # how every report writes it

RANK_TEXT = """
import warnings

B = os.fsdecode(b"\\xff")

@pytest.mark.ddp(world_size=2)
def test_raises(rank):
    if rank == 1:
        raise OSError(os.fsdecode(b"/tmp/\\xff.bin"))

@pytest.mark.ddp(world_size=2)
def test_prints(rank, record_property):
    print("out" + B)
    sys.stderr.write("err" + B + "\\n")
    warnings.warn("warned" + B)
    record_property("prop" + B, "value" + B)
    assert rank == 0, "failed" + B

@pytest.mark.ddp(world_size=2)
@pytest.mark.parametrize("value", [B, "a<b", "a>b", "a b"], ids=["x" + B, "a<b", "a>b", "a b"])
def test_ids(rank, value):
    assert rank == 0, value

@pytest.mark.ddp(world_size=2)
def test_after(rank):
    dist.barrier()

def test_plain_after():
    pass
"""
FAILING = ["test_raises", "test_prints", "test_ids[x\\udcff]", "test_ids[a<b]", "test_ids[a>b]", "test_ids[a b]"]


def _no_internal_error(result: pytest.RunResult) -> None:
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str(), result.stdout.str()


def _run(command: list[str], cwd: Path, **env: str) -> pytest.RunResult:
    """``command``'s result, its output read as pytest writes file names (surrogateescape)."""
    env = {**{key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}, **env}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, timeout=300)
    out, err = (os.fsdecode(stream).splitlines() for stream in (done.stdout, done.stderr))
    return pytest.RunResult(done.returncode, out, err, 0.0)


def _reports(folder: Path) -> dict[str, dict]:
    """The JSON reports in ``folder`` by test name, each checked: it parses, holds nothing UTF-8
    cannot encode, and its trace and page beside it are written and read as strict UTF-8."""
    found = {}
    for path in folder.glob("*.json"):
        if path.name.endswith(".trace.json"):
            continue
        report = json.loads(path.read_text(encoding="utf-8"))
        json.dumps(report, ensure_ascii=False).encode("utf-8")  # no lone surrogate in any string
        stem = path.name.removesuffix(".json")
        trace = json.loads((folder / f"{stem}.trace.json").read_text(encoding="utf-8"))
        json.dumps(trace, ensure_ascii=False).encode("utf-8")
        page = (folder / f"{stem}.html").read_text(encoding="utf-8")
        assert page.rstrip().endswith("</html>"), path
        found[report["test"].partition("::")[2]] = {**report, "page": page}
    assert len(list(folder.iterdir())) == 4 * len(found)  # no test's files (and .fr folder) overwrote another's
    return found


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
def test_rank_text_utf8_cannot_encode_reaches_every_report_and_the_session_goes_on(ddp_pytester, xdist) -> None:
    reports = ddp_pytester.pytester.path / "reports"
    args = [f"--ddp-report-dir={reports}", "--junitxml=junit.xml", "-rA", *(["-n", "2"] if xdist else [])]
    # Plain, in this process (its ranks from this process's forkserver); under xdist, in a process
    # of its own: run here, its workers, each a pytest importing torch, cost as much.
    result = (ddp_pytester.run_subprocess if xdist else ddp_pytester.run)(RANK_TEXT, *args)
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    result.assert_outcomes(failed=6, passed=2, warnings=1)
    assert f"OSError: /tmp/{ESCAPED}.bin" in output
    found = _reports(reports)
    assert sorted(found) == sorted(FAILING)  # one set of files per test: a<b, a>b, a b apart
    raised = found["test_raises"]
    assert f"/tmp/{ESCAPED}.bin" in raised["ranks"][1]["failure"] and f"/tmp/{ESCAPED}.bin" in raised["page"]
    printed = found["test_prints"]
    assert printed["ranks"][0]["output"] == {"stdout": f"out{ESCAPED}\n", "stderr": f"err{ESCAPED}\n"}
    assert f"failed{ESCAPED}" in printed["ranks"][1]["failure"]
    cases = {case.get("name"): case for case in ET.parse(ddp_pytester.pytester.path / "junit.xml").iter("testcase")}
    assert len(cases) == 8
    assert f"/tmp/{ESCAPED}.bin" in cases["test_raises"].find("failure").text
    prints = ET.tostring(cases["test_prints"], encoding="unicode")
    assert f'<property name="prop{ESCAPED}" value="value{ESCAPED}" />' in prints
    assert f"warned{ESCAPED} [ranks 0, 1]" in output


def test_a_test_id_with_a_surrogate_gets_its_report_files_and_shared_path(ddp_pytester) -> None:
    path = ddp_pytester.pytester.path
    folder = path / f"odd{SURROGATE}"
    folder.mkdir()
    (folder / "test_odd.py").write_text(
        HEADER
        + textwrap.dedent(
            """
            @pytest.mark.ddp(world_size=2)
            def test_in_odd_folder(rank, ddp_shared_path):
                (ddp_shared_path / f"from{rank}").write_text("x")
                dist.barrier()
                assert sorted(p.name for p in ddp_shared_path.iterdir()) == ["from0", "from1"]
                assert rank == 0
            """
        )
    )
    reports = ddp_pytester.pytester.path / "reports"
    # Not with --junitxml: pytest's own junitxml cannot write such a node id (plain pytest neither);
    # not through pytester, which cannot read the file name pytest prints.
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={path / 'basetemp'}"]
    result = _run([*command, f"--ddp-report-dir={reports}"], path)
    _no_internal_error(result)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["assert 1 == 0 (rank 1). [[]ddp failed]"])
    [report] = _reports(reports).values()
    assert report["test"] == f"odd{ESCAPED}/test_odd.py::test_in_odd_folder"
    assert (reports / f"{file_name(f'odd{SURROGATE}/test_odd.py::test_in_odd_folder')}.json").is_file()


# -- file names -----------------------------------------------------------------------------

IDS = [
    "t.py::test[a<b]",
    "t.py::test[a>b]",
    "t.py::test[a b]",
    "t.py::test[a_b]",
    "t.py::test[é]",
    "t.py::test[è]",
    "t.py::test[" + SURROGATE + "]",
    "t.py::test[\\udcff]",
    "t.py::test[" + "x" * 300 + "1]",
    "t.py::test[" + "x" * 300 + "2]",
    "",
    "::",
    "../..",
    ".hidden",
    "-rf",
]


def test_distinct_node_ids_get_distinct_bounded_plain_file_names() -> None:
    names = [file_name(nodeid) for nodeid in IDS]
    assert len(set(names)) == len(IDS)
    for name in names:
        assert len(name) <= NAME_PREFIX + 1 + NAME_HASH
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"), name
        assert name[0] not in ".-", name  # neither hidden nor an option, nor "." or ".."
    assert file_name("t.py::test[a<b]").startswith("t.py_test_a_b-")  # readable


def test_a_node_ids_file_name_is_the_same_in_every_process() -> None:
    here = [file_name(nodeid) for nodeid in IDS]
    code = (
        "import json, sys\nfrom pytest_ddp.report.writable import file_name\n"
        "ids = json.loads(sys.stdin.read())\nprint(json.dumps([file_name(i) for i in ids]))"
    )
    for seed in ("0", "1"):  # str hashes differ between these processes; the names may not
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], input=json.dumps(IDS), env=env, capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == here


def test_printable_escapes_only_what_utf8_cannot_encode() -> None:
    assert printable("plain é 漢 \N{SNOWMAN}") == "plain é 漢 \N{SNOWMAN}"
    assert printable(os.fsdecode(b"/tmp/\xff.bin")) == "/tmp/\\udcff.bin"
    assert printable("\ud800x") == "\\ud800x"


# -- runs again, in another order --------------------------------------------------------------

RERUN_SHARED = """
import json

@pytest.mark.flaky(reruns=1)
@pytest.mark.ddp(world_size=2)
def test_twice(rank, request, ddp_shared_path):
    seen = sorted(p.name for p in ddp_shared_path.iterdir())
    views = [None, None]
    dist.all_gather_object(views, [str(ddp_shared_path), seen])
    (ddp_shared_path / f"from{rank}").write_text("x")
    dist.barrier()
    if rank == 0:
        with open("attempts.jsonl", "a") as log:
            log.write(json.dumps([request.node.execution_count, views]) + "\\n")
    assert request.node.execution_count > 1, "the first attempt fails"
"""


def test_each_attempt_of_a_rerun_test_gets_an_empty_shared_path_all_ranks_agree_on(ddp_pytester) -> None:
    result = ddp_pytester.run(RERUN_SHARED)
    result.assert_outcomes(passed=1)
    lines = (ddp_pytester.pytester.path / "attempts.jsonl").read_text().splitlines()
    attempts = [json.loads(line) for line in lines]
    assert [count for count, _ in attempts] == [1, 2]
    for _, views in attempts:
        assert views[0] == views[1]  # the same path on both ranks, empty when the attempt begins
        assert views[0][1] == []
    assert attempts[0][1][0][0] != attempts[1][1][0][0]


ALONE = """
@pytest.mark.flaky(reruns=1)
@pytest.mark.ddp(world_size=2, timeout=60)
def test_rank_1_fails(rank):
    dist.barrier()
    assert rank == 0
"""


def test_a_rank_that_runs_the_test_again_alone_fails_it(ddp_pytester) -> None:
    # pytest-rerunfailures runs in each rank's pytest: rank 1 runs its failed test again, alone,
    # and waits in a barrier its peer, done, never enters.  That was reported as a pass.
    result = ddp_pytester.run(ALONE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError (then the rank ran the test again, alone*"])


SESSION = """
@pytest.mark.ddp(world_size=2)
@pytest.mark.parametrize("n", range(3))
def test_ddp_passes(rank, n):
    dist.barrier()

@pytest.mark.ddp(world_size=2)
@pytest.mark.parametrize("n", range(2))
def test_ddp_fails(rank, n):
    dist.barrier()
    assert rank == 0, f"fails {n}"

@pytest.mark.ddp(world_size=[1, 2])
def test_ddp_sizes(rank, world_size):
    dist.barrier()

@pytest.mark.parametrize("n", range(3))
def test_plain(n):
    assert n != 1
"""
# passed: 3 + 2 ddp, 2 plain; failed: 2 ddp, 1 plain
OUTCOMES = {"passed": 7, "failed": 3}


@pytest.mark.parametrize("reruns", ["--reruns=2", "--override-ini=reruns=2"])
def test_a_session_under_rerunfailures_keeps_every_outcome(ddp_pytester, reruns) -> None:
    # --reruns stays in this session: its ddp tests run once (the controller runs them, not
    # pytest-rerunfailures); reruns=2 in the ini reaches the ranks, whose failing rank runs alone.
    result = ddp_pytester.run(SESSION, reruns, "-rA")
    _no_internal_error(result)
    assert result.parseoutcomes() == {**OUTCOMES, "rerun": 2}  # the plain test's two reruns
    result.stdout.fnmatch_lines(["FAILED *test_ddp_fails[[]0[]]*", "FAILED *test_ddp_fails[[]1[]]*"])


# pytest-randomly, installed by `make venv` beside the venv's packages, not among them: installed,
# it would shuffle every inner session of this suite.
RANDOMLY = Path(sys.prefix) / "randomly"
RANDOM_DRAWS = """
import random

@pytest.mark.ddp(world_size=2)
def test_ranks_draw_alike(rank):
    draws = [None, None]
    dist.all_gather_object(draws, (random.random(), torch.rand(1).item()))
    assert draws[0] == draws[1]
"""


@pytest.mark.skipif(not RANDOMLY.is_dir(), reason=f"pytest-randomly is not installed in {RANDOMLY} (make venv)")
def test_a_session_under_randomly_keeps_every_outcome(ddp_pytester, monkeypatch) -> None:
    # Its ranks reseed from the session's seed, as its plain tests do: they draw the same numbers.
    # In this process: its sys.path (the ranks get the controller's) and the environment, as a
    # session of its own would have them.
    monkeypatch.setenv("PYTHONPATH", str(RANDOMLY))
    monkeypatch.syspath_prepend(RANDOMLY)
    result = ddp_pytester.run(SESSION + RANDOM_DRAWS, "-p", "randomly", "--randomly-seed=12345", "-rA")
    _no_internal_error(result)
    result.stdout.fnmatch_lines(["*--randomly-seed=12345*"])
    result.assert_outcomes(passed=OUTCOMES["passed"] + 1, failed=OUTCOMES["failed"])


# -- a full disk ----------------------------------------------------------------------------

FULL_DISK = """
set -e
mount -t tmpfs -o size=256k tmpfs "$DISK"
mkdir "$DISK/basetemp" "$DISK/reports"
dd if=/dev/zero of="$DISK/fill" bs=4k count=100 2>/dev/null || true
exec "$PYTHON" -m pytest -p no:cacheprovider "$@"
"""


def _unshare() -> str | None:
    """unshare(1), where this process may mount in a mount namespace of its own (root)."""
    found = shutil.which("unshare")
    return found if found is not None and os.geteuid() == 0 else None


@pytest.mark.skipif(_unshare() is None, reason="mounting a tmpfs in a mount namespace needs root and unshare(1)")
@pytest.mark.parametrize("full", ["basetemp", "reports"])
def test_a_full_disk_is_an_error_that_says_so_and_the_session_ends(ddp_pytester, full) -> None:
    """A tiny tmpfs, filled, mounted in a child mount namespace (gone with it): the ranks' files
    (``--basetemp``) or the report files (``--ddp-report-dir``) cannot be written there."""
    path = ddp_pytester.pytester.path
    disk = path / "disk"
    disk.mkdir()
    ddp_pytester.write(SESSION)
    basetemp = disk / "basetemp" if full == "basetemp" else path / "basetemp"
    args = [f"--basetemp={basetemp}", f"--ddp-report-dir={disk / 'reports'}", "-rA"]
    command = [_unshare(), "--mount", "--propagation", "private", "sh", "-c", FULL_DISK, "sh", *args]
    result = _run(command, path, DISK=str(disk), PYTHON=sys.executable)
    _no_internal_error(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    if full == "basetemp":  # no ddp test's group can start, and each says why; the others ran
        result.assert_outcomes(errors=7, passed=2, failed=1)
        result.stdout.fnmatch_lines(["ddp: the rank group could not start: [[]Errno 28[]] No space left on device*"])
    else:  # each failing ddp test's failure says its report files were not written, and why
        result.assert_outcomes(**OUTCOMES)
        lines = [line for line in result.stdout.lines if "report files were not written" in line]
        assert len(lines) == 2 and all(line.endswith("OSError: [Errno 28] No space left on device") for line in lines)


GARBLED_LOG = """
def event_log():
    for fd in os.listdir("/proc/self/fd"):
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.islink(f"/proc/self/fd/{fd}") else ""
        if target.endswith(f"rank{dist.get_rank()}.events"):
            return int(fd)
    raise AssertionError("no event log")

@pytest.mark.ddp(world_size=2)
def test_cut_short(rank):
    dist.barrier()
    if rank == 1:  # as a write cut short by a full disk leaves it: the next line follows the half
        os.write(event_log(), b'{"e":"call","i"')
    dist.barrier()

@pytest.mark.ddp(world_size=2)
def test_after(rank):
    dist.barrier()
"""


def test_a_line_of_a_ranks_event_log_cut_short_fails_its_test_and_the_session_goes_on(ddp_pytester) -> None:
    result = ddp_pytester.run(GARBLED_LOG, "-rA")
    _no_internal_error(result)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["ddp: its event log holds a line that is not an event*", "FAILED *test_cut_short*"])

"""What happens inside a rank process at its edges: what a test leaves behind (threads,
processes, environment variables, warnings), and how it stops a session."""

from __future__ import annotations

import dataclasses
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import live_pids, outcomes, wait_for
from pytest_ddp.common.bounds import TEXT_LIMIT, cut, read_bounded
from pytest_ddp.common.protocol import Report, WarningRecorded
from pytest_ddp.diagnose import rank_words
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.rank import leftovers
from pytest_ddp.rank.channel import bounded
from pytest_ddp.report import rank_warnings

SPAWN = """
import multiprocessing, subprocess
def serve():
    import socket, time
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); time.sleep(600)

def spawn(path):
    child = multiprocessing.get_context("fork").Process(target=serve, daemon=False)
    child.start()
    grandchild = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(path, "a") as f:
        f.write(f"{child.pid} {grandchild.pid}\\n")
"""


def spawning(pids: Path) -> str:
    return (
        SPAWN
        + f"""
@pytest.mark.ddp(world_size=2)
def test_spawns(rank):
    if rank == 1:
        spawn({str(pids)!r})
    dist.barrier()

@pytest.mark.ddp(world_size=2)
def test_next(rank):
    dist.barrier()
"""
    )


def dying(pids: Path) -> str:
    return (
        SPAWN.replace("start_new_session=True", "")
        + f"""
@pytest.mark.ddp(world_size=2)
def test_dies(rank):
    if rank == 1:
        spawn({str(pids)!r})
        os.kill(os.getpid(), 9)
    dist.barrier()
"""
    )


STOPPING = """
@pytest.mark.ddp(world_size=2)
def test_stops(rank):
    if rank == 1:
        {raise_it}

@pytest.mark.ddp(world_size=2)
def test_never_runs(rank):
    pass
"""
STOPS = {
    "exit": ('pytest.exit("enough for today", returncode=3)', ["*Exit: enough for today*"]),
    "interrupt": ("raise KeyboardInterrupt", ["*KeyboardInterrupt*"]),
}


# The sessions below run in this process: their ranks come from its forkserver, as every group of
# a session's do, and what they check is the ranks' processes and the session's result, not this
# session's process (a session of its own was a pytest, a forkserver and ranks importing torch).
def test_processes_a_test_left_are_ended_after_it_and_named(ddp_pytester):
    spawned = ddp_pytester.pytester.path / "spawned"
    ddp_pytester.write(spawning(spawned), name="test_spawns")
    result = ddp_pytester.pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA")
    assert outcomes(result, "test_spawns.py") == {"test_spawns": "PASSED", "test_next": "PASSED"}
    assert result.parseoutcomes()["warnings"] == 1
    left = [int(pid) for pid in spawned.read_text().split()]
    assert live_pids(left) == []  # ended and reaped before the next test
    result.stdout.fnmatch_lines(
        [
            "test_spawns.py::test_spawns",
            "*LeftoverProcessWarning: processes the test left running were ended: "
            f"pid {left[0]} (a fork of the rank), pid {left[1]} (sleep 600) [[]rank 1[]]",
        ]
    )


def test_processes_of_a_killed_rank_die_with_it(ddp_pytester):
    died = ddp_pytester.pytester.path / "died"
    ddp_pytester.write(dying(died), name="test_dies")
    result = ddp_pytester.pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA")
    assert outcomes(result, "test_dies.py") == {"test_dies": "FAILED"}
    left = [int(pid) for pid in died.read_text().split()]
    wait_for(lambda: not live_pids(left), f"processes {left} to end")


def test_a_thread_left_running_fails_its_test_not_the_next(ddp_pytester):
    result = ddp_pytester.run(
        """
import threading
stop = threading.Event()

@pytest.mark.ddp(world_size=2)
def test_culprit(rank):
    def lingers():
        stop.wait()
        dist.all_reduce(torch.tensor([100.0]))
    if rank == 1:
        threading.Thread(target=lingers, name="lingerer", daemon=True).start()

@pytest.mark.ddp(world_size=2)
def test_victim(rank):
    t = torch.tensor([1.0 if rank == 0 else 0.0])
    dist.all_reduce(t)
    assert t.item() == 1
"""
    )
    result.assert_outcomes(passed=2, errors=1)  # the culprit's call passed; its teardown did not
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_culprit*",
            "Failed: thread 'lingerer' started by the test still running 1 s after it ended* (rank 1). [[]ddp failed]",
            "thread 'lingerer':",
            "*in lingers",
            "*stop.wait()",
            "*2 rank groups started*",  # the culprit's group was dropped
        ]
    )


def test_threads_left_lists_only_the_tests_threads_with_their_stacks():
    before = set(threading.enumerate())
    release = threading.Event()
    ended = threading.Thread(target=lambda: None, name="ended")
    lingering = threading.Thread(target=release.wait, name="lingering")
    ended.start()
    lingering.start()
    try:
        left = leftovers.threads_left(before, wait=0.0)
    finally:
        release.set()
        lingering.join()
    assert [t["name"] for t in left] == ["lingering"]
    assert "release.wait" in left[0]["stack"] or "wait" in left[0]["stack"]
    assert leftovers.threads_left(before) == []  # THREAD_JOIN_WAIT by default; none to wait for
    text = leftovers.threads_left_text(left, 0.25)  # the wait it was given, not THREAD_JOIN_WAIT
    assert "'lingering' started by the test still running 0.25 s after it ended" in text
    wait = f"still running {leftovers.THREAD_JOIN_WAIT:g} s after it ended"
    assert wait in leftovers.threads_left_text(left)


@pytest.mark.parametrize("name", STOPS)
def test_exit_or_keyboard_interrupt_in_a_rank_stops_the_session(ddp_pytester, name):
    raise_it, expected = STOPS[name]
    ddp_pytester.write(STOPPING.format(raise_it=raise_it))
    # The session's KeyboardInterrupt is its result here, not this test's.
    result = ddp_pytester.pytester.runpytest_inprocess("-p", "no:cacheprovider", no_reraise_ctrlc=True)
    assert result.ret == (3 if "exit" in raise_it else pytest.ExitCode.INTERRUPTED)
    result.stdout.fnmatch_lines(expected)
    result.stdout.no_fnmatch_line("*died*")
    result.stdout.no_fnmatch_line("*test_never_runs*PASSED*")
    assert "1 failed" in result.stdout.str() and "passed" not in result.stdout.lines[-1]


def test_a_missing_fixture_is_named_in_the_headline(ddp_pytester):
    result = ddp_pytester.run(
        """
@pytest.mark.ddp(world_size=2)
def test_it(rank, nosuch):
    pass
"""
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["fixture 'nosuch' not found (ranks 0, 1). [[]ddp failed*]"])


def test_report_message_prefers_the_error_line_of_a_plain_text_longrepr():
    longrepr = (
        "file t.py, line 3\n  def test_it(rank, nosuch):\n"
        "E       fixture 'nosuch' not found\n>       available\n\nt.py:3"
    )
    assert rank_words._report_message({"longrepr": longrepr}) == "fixture 'nosuch' not found"
    assert rank_words._report_message({"longrepr": "Skipped\nValueError: boom"}) == "ValueError: boom"


def test_each_test_gets_the_environment_the_rank_started_with(ddp_pytester):
    result = ddp_pytester.run(
        """
@pytest.mark.ddp(world_size=2)
def test_changes(rank):
    os.environ["WORLD_SIZE"] = "1"
    os.environ["ADDED_BY_A_TEST"] = "x"
    del os.environ["RANK"]

@pytest.mark.ddp(world_size=2)
def test_sees_the_original(rank):
    assert os.environ["WORLD_SIZE"] == "2"
    assert os.environ["RANK"] == str(rank)
    assert "ADDED_BY_A_TEST" not in os.environ
"""
    )
    result.assert_outcomes(passed=2)


WARNS = """
import warnings

@pytest.mark.ddp(world_size=2)
def test_warns(rank):
    warnings.warn("from every rank")
    if rank == 1:
        warnings.warn(DeprecationWarning("from rank one"))
"""


def test_warnings_of_the_ranks_reach_the_summary_once_with_their_ranks(ddp_pytester):
    result = ddp_pytester.run(WARNS)
    result.assert_outcomes(passed=1, warnings=2)
    result.stdout.fnmatch_lines(
        [
            "*warnings summary*",
            "test_it.py::test_warns",
            "*UserWarning: from every rank [[]ranks 0, 1[]]",
            "*DeprecationWarning: from rank one [[]rank 1[]]",
        ]
    )


def test_a_warning_made_an_error_fails_the_test_in_the_rank(ddp_pytester):
    result = ddp_pytester.run(WARNS, "-W", "error::DeprecationWarning")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["DeprecationWarning: from rank one (rank 1). [[]ddp failed*]"])


def test_merged_warnings_group_by_text_place_and_test():
    def state(rank: int, *messages: str) -> RankState:
        s = RankState(rank)
        s.warnings = [
            WarningRecorded(
                {
                    "message": m, "category": "builtins:UserWarning", "filename": "t.py", "lineno": 3,
                    "line": None,
                },
                "t.py::a",
            )
            for m in messages
        ]
        return s

    merged = rank_warnings.merged([state(0, "same"), state(1, "same", "own"), state(2, "same")])
    assert [(str(w.message), w.category, nodeid) for w, nodeid in merged] == [
        ("same [ranks 0-2]", UserWarning, "t.py::a"),
        ("own [rank 1]", UserWarning, "t.py::a"),
    ]


def test_a_rank_forked_after_its_group_was_given_up_exits_quietly(tmp_path):
    """Ctrl-C while a group starts: the controller removes the folder while a rank is forked."""
    from pytest_ddp.rank.entry import forked_main

    script = (
        "import multiprocessing, sys\n"
        "from pytest_ddp.rank.entry import forked_main\n"
        "a, b = multiprocessing.Pipe(False)\n"
        f"forked_main({str(tmp_path / 'gone' / 'rank0.json')!r}, a, b, {{}})\n"
    )
    assert forked_main  # the function the script calls
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == ""


def test_ctrl_c_while_the_forkserver_imports_torch_prints_nothing(tmp_path):
    script = (
        "import os, signal\n"
        "from multiprocessing import forkserver\n"
        "from pytest_ddp.groups.spawn import fork_context\n"
        "fork_context()\n"
        "os.kill(forkserver._forkserver._forkserver_pid, signal.SIGINT)  # while it imports torch\n"
        "ctx = fork_context()\n"
        "p = ctx.Process(target=os.getpid); p.start(); p.join()\n"
        "print('exit', p.exitcode)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "KeyboardInterrupt" not in done.stderr
    assert done.stdout == "exit 0\n"


# Which modules hold a torch.distributed function the recorder wraps (by name, in a rank, after the
# fork), as c10d's original: their calls would go unrecorded. Printed after each step: torch.distributed
# and the functional collectives (torch's own bindings, under any launcher), the forkserver's preload,
# then DTensor (torch._dynamo's import loads it: preloaded, DTensor's scatter went unrecorded).
BOUND_ORIGINALS = """
import importlib, sys
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from pytest_ddp.common.ops import OPS
from pytest_ddp.groups.spawn import PRELOAD

wrapped = {id(getattr(c10d, op)) for op, spec in OPS.items() if spec.python and hasattr(c10d, op)}
for step in (["torch.distributed._functional_collectives"], PRELOAD, ["torch.distributed.tensor"]):
    for name in step:
        importlib.import_module(name)
    print(" ".join(
        f"{name}.{attribute}"
        for name, module in list(sys.modules.items()) if module is not None and module not in (c10d, dist)
        for attribute, value in list(vars(module).items()) if id(value) in wrapped
    ))
"""


def test_the_forkserver_preloads_no_module_that_holds_what_the_recorder_wraps():
    command = [sys.executable, "-c", BOUND_ORIGINALS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    torchs_own, preloaded, with_dtensor = (set(line.split()) for line in done.stdout.splitlines())
    assert preloaded - torchs_own == set()  # the steps add up: only what the preload adds
    # the scan sees it
    assert "torch.distributed.tensor._collective_utils.scatter" in with_dtensor - preloaded


def test_ranks_find_the_entry_point_plugins_the_forkserver_imported(ddp_pytester):
    """pytest-timeout, loaded from its entry point by this pytest, was imported by the forkserver:
    a rank's pytest finds it imported, not by its assertion-rewriting importer (that import took
    most of a rank's start)."""
    result = ddp_pytester.run(
        """
import sys

@pytest.mark.ddp(world_size=1)
def test_it():
    assert type(sys.modules["pytest_timeout"].__loader__).__name__ != "AssertionRewritingHook"
"""
    )
    result.assert_outcomes(passed=1)


def test_the_forkserver_imports_the_torch_modules_the_collection_imported_and_ranks_record_them(ddp_pytester):
    """DTensor, imported by the test file, is imported once by the forkserver, not by each rank (a
    second of imports a rank for torch's DTensor tests); the functions it bound by name before the
    rank's recorder was installed are recorded all the same (its scatter: c10d's own otherwise).
    A subprocess: an in-process session shares its forkserver with earlier ones."""
    import torch

    if torch.backends.cuda.is_built():
        pytest.skip("a CUDA build's forkserver preloads none of them (torch_modules_imported)")
    ddp_pytester.pytester.makeconftest(
        "import sys, pytest\n"
        "imported = 'torch.distributed.tensor' in sys.modules  # before the test file, in the rank\n"
        "@pytest.fixture\ndef preloaded():\n    return imported\n"
    )
    result = ddp_pytester.run_subprocess(
        """
import torch.distributed.tensor._collective_utils as collective_utils

@pytest.mark.ddp(world_size=1)
def test_it(preloaded):
    assert preloaded
    assert collective_utils.scatter is dist.scatter  # the recorded one: c10d's own without rebind()
"""
    )
    result.assert_outcomes(passed=1)


def test_a_ranks_start_file_is_readable_by_its_user_alone(tmp_path):
    """It holds the rank's environment: 0600, whatever the umask, and a planted link is refused."""
    from pytest_ddp.common.protocol import RankRole
    from pytest_ddp.groups.spawn import write_start_file

    role = RankRole(0, 2, "gloo", True, "pytest", 60.0, "127.0.0.1", 29500, 0)
    path = write_start_file(tmp_path, role, {"TOKEN": "x"}, [], [])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "rank1.json").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        write_start_file(tmp_path, dataclasses.replace(role, rank=1), {}, [], [])
    assert (tmp_path / "elsewhere").read_text() == ""


def test_a_rank_s_text_is_cut_to_its_head_and_tail_with_a_note():
    text = "head " + "x" * (3 * TEXT_LIMIT) + " tail"
    shown = cut(text)
    head, note, tail = shown.split("\n")
    assert len(shown) <= TEXT_LIMIT and text.startswith(head) and text.endswith(tail) and len(tail) > 5
    assert note == f"[... {len(text) - len(head) - len(tail):,} characters cut by pytest-ddp ...]"
    assert cut(shown) == shown and cut("short") == "short"  # cut once, not again
    lines = [f"E   line {i}" for i in range(TEXT_LIMIT)]
    report = bounded(Report("call", "failed", data={"$report_type": "TestReport", "lines": lines}))
    assert report.data is not None
    kept = report.data["lines"]
    assert sum(map(len, kept)) <= TEXT_LIMIT and kept[0] == lines[0] and kept[-1] == lines[-1]
    assert sum("cut by pytest-ddp" in line for line in kept) == 1
    value = "v" * (2 * TEXT_LIMIT)  # run()'s returned value, pickled: data, never cut
    assert bounded(Report("call", "passed", data={"value": value})).data == {"value": value}


def test_a_rank_s_file_is_read_to_its_head_and_tail_past_its_offset(tmp_path):
    path = tmp_path / "stdout"
    path.write_bytes(b"earlier test\n" + b"first " + b"y" * (3 * TEXT_LIMIT) + b" last")
    offset = len(b"earlier test\n")
    shown = read_bounded(path, offset)
    head, note, tail = shown.split("\n")
    assert len(shown) <= TEXT_LIMIT and head.startswith("first yyy") and tail.endswith("yyy last")
    assert note == f"[... {path.stat().st_size - offset - len(head) - len(tail):,} bytes cut by pytest-ddp ...]"
    assert read_bounded(path, path.stat().st_size - 4) == "last"
    assert read_bounded(tmp_path / "not there", 0) == ""


def test_a_huge_failure_message_reaches_the_terminal_and_report_files_cut(ddp_pytester):
    """A 20 MB message (a 200 MB one reached the terminal twice and the report files five times):
    cut on the rank, so the terminal and every report file hold its head and tail, and the note;
    20 MB the test printed, read to its head and tail from the rank's file."""
    reports = ddp_pytester.pytester.path / "reports"
    result = ddp_pytester.run(
        """
@pytest.mark.ddp(world_size=1)
def test_huge(rank):
    print("start-of-output " + "p" * (20 * 1024 * 1024) + " end-of-output")
    raise ValueError("start-of-message " + "x" * (20 * 1024 * 1024) + " end-of-message")
""",
        f"--ddp-report-dir={reports}",
    )
    result.assert_outcomes(failed=1)
    terminal = "\n".join(result.outlines)
    assert len(terminal) < 4 * TEXT_LIMIT, len(terminal)
    assert "ValueError: start-of-message xxx" in terminal and "xxx end-of-message" in terminal
    assert "characters cut by pytest-ddp ...]" in terminal
    assert "start-of-output ppp" in terminal and "ppp end-of-output" in terminal
    assert "bytes cut by pytest-ddp ...]" in terminal
    sizes = {path.name: path.stat().st_size for path in reports.iterdir() if path.is_file()}
    assert len(sizes) == 3 and max(sizes.values()) < 8 * TEXT_LIMIT, sizes
    assert "characters cut by pytest-ddp" in next(reports.glob("*[!e].json")).read_text()

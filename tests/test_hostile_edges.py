"""Hostile edges, third round (issue 26): RLIMIT_NPROC as the kernel counts it, exit codes of
injected faults, faults that can never fire, and a test whose every rank an injected fault ended."""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path

import pytest

from conftest import Session, sessions_together
from pytest_ddp import faults
from pytest_ddp.common.protocol import Injected
from pytest_ddp.config.machine import (
    CAP_SYS_ADMIN,
    CAP_SYS_RESOURCE,
    RANK_MEMORY,
    RANK_TASKS,
    SESSION_TASKS,
    nproc_enforced,
    rank_capacity,
    user_tasks,
)
from pytest_ddp.diagnose import watchdog, wording
from pytest_ddp.diagnose.state import RankState, Snapshot

pytest_plugins = ["pytester"]

ROOT = os.geteuid() == 0
OTHER_UID = 65534  # nobody: another user, for the tests that need one (root only)


# -- RLIMIT_NPROC, as the kernel counts it ---------------------------------------------------

IDENTITY = "         0          0 4294967295\n"  # /proc/self/uid_map of the initial user namespace


def test_the_kernel_holds_to_rlimit_nproc_no_root_and_no_process_with_sys_admin_or_sys_resource() -> None:
    """setrlimit(2): not enforced on real uid 0 nor with CAP_SYS_ADMIN or CAP_SYS_RESOURCE (as
    measured: root with a limit of 20 starts 200 threads; uid 1001 stops at 20 tasks, and with
    CAP_SYS_ADMIN starts 200); in another user namespace root is a user like any other."""
    assert not nproc_enforced(40, 0, 0, IDENTITY)
    assert nproc_enforced(40, 1001, 0, IDENTITY)
    assert not nproc_enforced(40, 1001, 1 << CAP_SYS_ADMIN, IDENTITY)
    assert not nproc_enforced(40, 1001, 1 << CAP_SYS_RESOURCE, IDENTITY)
    assert not nproc_enforced(resource.RLIM_INFINITY, 1001, 0, IDENTITY)
    assert nproc_enforced(40, 0, (1 << 41) - 1, "0 100000 65536\n")  # a user namespace's root
    assert not nproc_enforced(40, 0, 0, "0 0 1\n1 100000 65535\n")  # its uid 0 is the host's root


def status(real_uid: int, effective_uid: int, threads: int) -> str:
    return f"Name:\tpython\nUid:\t{real_uid}\t{effective_uid}\t{effective_uid}\t{effective_uid}\nThreads:\t{threads}\n"


def test_rlimit_nproc_counts_the_threads_of_the_real_uid() -> None:
    statuses = [status(1001, 1001, 6), status(1001, 0, 3), status(0, 1001, 50), status(1002, 1002, 1)]
    assert user_tasks(statuses, 1001) == 9


def test_the_capacity_under_rlimit_nproc_is_in_threads_and_never_negative() -> None:
    memory = 1000 * RANK_MEMORY
    assert rank_capacity(memory, 40, 3) == (
        (40 - 3 - SESSION_TASKS) // RANK_TASKS,
        f"RLIMIT_NPROC 40 with 3 threads of this user running, at least {RANK_TASKS} per rank",
    )
    assert rank_capacity(memory, 40, 100)[0] == 0
    assert rank_capacity(memory, -1, 100) == (1000, "22000 MiB available at about 22 MiB per rank")


NPROC_TEST = """
import pytest, torch
import torch.distributed as dist

@pytest.mark.ddp(world_size=2)
def test_two():
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

@pytest.mark.ddp(world_size=8)
def test_eight():
    dist.all_reduce(torch.ones(1))
"""


WHO = ["root", "a user"]
UID = 54321  # the other user's: a uid no process runs as


def _statuses() -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found.append(Path(f"/proc/{entry}/status").read_text())
            except OSError:
                continue
    return found


def nproc_prefix(who: str) -> tuple[str, ...] | str:
    """What runs a session as ``who`` under ``ulimit -u 25``, or why it cannot run here."""
    if not ROOT:
        return "runs a session as root, and as another real uid (setpriv), which takes root"
    if shutil.which("prlimit") is None:
        return "no prlimit to lower RLIMIT_NPROC with"
    prefix = ("prlimit", "--nproc=25:25")
    if who == "root":
        return prefix
    if shutil.which("setpriv") is None:
        return "no setpriv to run a session as another real uid"
    if user_tasks(_statuses(), UID):
        return f"uid {UID} runs processes here"
    # Another real uid (RLIMIT_NPROC counts the real uid's threads), still euid 0 to read this
    # checkout and the venv, with no capability (either would exempt it).
    return (*prefix, "setpriv", f"--ruid={UID}", "--bounding-set=-all", "--inh-caps=-all")


@pytest.fixture(scope="module")
def nproc_sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pytest.RunResult | str]:
    """NPROC_TEST's session as each of WHO, started together, or why it cannot run here."""
    prefixes = {who: nproc_prefix(who) for who in WHO}
    sessions = {
        who: Session({"test_nproc.py": NPROC_TEST}, prefix=prefix)
        for who, prefix in prefixes.items()
        if isinstance(prefix, tuple)
    }
    results = sessions_together(tmp_path_factory.mktemp("nproc"), sessions, timeout=300)
    return {who: results[who] if who in results else str(prefixes[who]) for who in WHO}


@pytest.mark.parametrize("who", WHO)
def test_a_session_under_a_low_rlimit_nproc(nproc_sessions: dict[str, pytest.RunResult | str], who: str) -> None:
    """``ulimit -u 25``: root is not held to it, so both tests run; a user is, so its 2 ranks
    run (a 2-rank session peaks at 20 threads) and 8 are refused, saying why, before anything starts."""
    done = nproc_sessions[who]
    if isinstance(done, str):
        pytest.skip(done)
    out = done.stdout.str()
    if who == "root":
        assert done.ret == 0, out
        assert "2 passed" in out
        return
    assert "1 passed, 1 error" in out, out
    assert ("test_nproc.py::test_eight: world_size=8: this machine holds at most 2 ranks (RLIMIT_NPROC 25 with ") in out
    assert f"threads of this user running, at least {RANK_TASKS} per rank); --ddp-max-world-size=N" in out


# -- faults misused ------------------------------------------------------------------------


@pytest.mark.parametrize("code", [256, -1, True, 1.5, "1"])
def test_an_exit_code_that_is_not_an_exit_status_is_refused_naming_the_fault(code: object) -> None:
    with pytest.raises(faults.FaultError) as refused:
        faults.check(faults.exit(rank=1, at="all_reduce", code=code))  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"exit(rank=1, at='all_reduce', call=1): code={code!r} must be an int from 0 to 255 (an exit status)"
    )
    assert faults.check(faults.exit(rank=1, at="all_reduce", code=255)).code == 255
    assert faults.check(faults.exit(rank=1, at="all_reduce", code=0)).code == 0


def test_a_fault_after_a_deadly_one_at_the_same_operation_is_refused() -> None:
    with pytest.raises(
        faults.FaultError,
        match=r"hang on rank 1 at all_reduce call 3 can never fire: SIGKILL on rank 1 "
        r"at all_reduce call 2 ends the rank's process before it",
    ):
        faults.check_all([faults.kill(rank=1, at="all_reduce", call=2), faults.hang(rank=1, at="all_reduce", call=3)])
    # Another rank, or an earlier call, can fire.
    faults.check_all([faults.kill(rank=1, at="all_reduce", call=2), faults.hang(rank=0, at="all_reduce", call=3)])
    faults.check_all([faults.exit(rank=1, at="all_reduce", call=2), faults.delay(1, "all_reduce", 1, call=1)])


def test_exit_code_256_is_the_tests_error_and_nothing_starts(pytester: pytest.Pytester) -> None:
    """Before: accepted, and the rank exited 0 (the status is the code's low byte)."""
    pytester.makepyfile(
        test_exit="""
        import pytest
        from pytest_ddp import faults

        @pytest.mark.ddp(world_size=2, faults=[faults.exit(rank=1, at="all_reduce", code=256)])
        def test_exit():
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "test_exit.py::test_exit: @pytest.mark.ddp: faults: exit(rank=1, at='all_reduce', call=1): code=256 "
            "must be an int from 0 to 255 (an exit status)"
        ]
    )
    result.stdout.no_fnmatch_line("*rank group* started*")


FAULTS_MISUSED = """
import pytest, torch
import torch.distributed as dist

import pytest_ddp
from pytest_ddp import faults


# Rank 1 is killed at its barrier, so its all_reduce (another operation) never comes.
@pytest.mark.ddp(
    world_size=2, faults=[faults.kill(rank=1, at="barrier"), faults.raise_(rank=1, at="all_reduce")]
)
def test_after_a_kill(rank):
    if rank == 1:
        dist.barrier()
        dist.all_reduce(torch.ones(1))


def reduce_twice(rank):
    for _ in range(2):
        dist.all_reduce(torch.ones(1))


def test_run_with_a_fault_that_never_fires():
    never = [faults.delay(rank=0, at="all_reduce", seconds=0, call=3)]
    result = pytest_ddp.run(reduce_twice, world_size=2, faults=never)
    assert result.outcome == "failed"
    assert result.diagnosis is not None
    assert result.diagnosis.text.startswith(
        "injected faults never fired: delay of 0 s on rank 0 at all_reduce call 3 [ddp failed]"
    ), result.diagnosis.text
"""


def test_a_fault_that_never_fired_fails_its_test_saying_why(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_misused=FAULTS_MISUSED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "injected faults never fired: raise RuntimeError(*) on rank 1 at all_reduce call 1 "
            "(never reached: SIGKILL on rank 1 at barrier call 1 ended the rank first) [[]ddp failed*]",
        ]
    )


# -- a test no rank ran to its end ---------------------------------------------------------


def ended(rank: int, action: str, exit_code: int) -> RankState:
    """A rank whose process an injected fault ended, before its test's end."""
    state = RankState(rank=rank, alive=False, exit_code=exit_code, phase="call", died_at=0.0)
    fault = faults.kill(rank, "all_reduce") if action == "kill" else faults.exit(rank, "all_reduce", code=exit_code)
    state.injected.append(Injected(str(fault), action, "all_reduce", 1, "t.py:5"))
    return state


def passed(rank: int) -> RankState:
    return RankState(rank=rank, phase="finished", finished_at=0.0)


def test_a_test_whose_every_rank_an_injected_fault_ended_fails() -> None:
    verdict = wording.worded(
        watchdog.judge(
            Snapshot(now=1.0, started=0.0, timeout=60, grace=2, ranks=[ended(0, "kill", -9), ended(1, "exit", 0)])
        ),
        [ended(0, "kill", -9), ended(1, "exit", 0)],
    )
    assert (verdict.status, verdict.kind, verdict.culprits) == ("done", "rank_exited", [0, 1])
    assert verdict.summary == (
        "no rank ran the test to its end: injected faults ended every rank: rank 0 died (killed by SIGKILL); "
        "rank 1 died (exit code 0)."
    )
    # A survivor that ran the test to its end: the test passes, as docs/faults.md says.
    survived = watchdog.judge(
        Snapshot(now=1.0, started=0.0, timeout=60, grace=2, ranks=[ended(0, "kill", -9), passed(1)])
    )
    assert (survived.status, survived.kind) == ("done", None)


ALL_KILLED = """
import pytest, torch
import torch.distributed as dist

import pytest_ddp
from pytest_ddp import faults

BOTH = [faults.kill(rank=0, at="all_reduce"), faults.kill(rank=1, at="all_reduce")]


@pytest.mark.ddp(world_size=2, faults=BOTH)
def test_every_rank_killed(rank):
    dist.all_reduce(torch.ones(1))


@pytest.mark.ddp(world_size=2, faults=[faults.kill(rank=1, at="barrier")])
def test_one_rank_killed_the_other_passes(rank):
    if rank == 1:
        dist.barrier()


def reduce(rank):
    dist.all_reduce(torch.ones(1))
    return rank


def only_rank_1_barriers(rank):
    if rank == 1:
        dist.barrier()
    return rank


def test_run():
    every = pytest_ddp.run(reduce, world_size=2, faults=BOTH)
    assert every.outcome == "failed"
    assert every.diagnosis.kind == "rank_exited"
    assert "no rank ran the test to its end: injected faults ended every rank" in every.diagnosis.text
    one = pytest_ddp.run(only_rank_1_barriers, world_size=2, faults=[faults.kill(rank=1, at="barrier")])
    assert one.outcome == "passed", one.diagnosis
    assert one.injected == ["SIGKILL on rank 1 at barrier call 1"]
"""


def test_a_test_no_rank_ran_to_its_end_fails_and_one_a_survivor_passed_passes(pytester: pytest.Pytester) -> None:
    """Before: a test whose both ranks were killed at their first all_reduce passed."""
    pytester.makepyfile(test_all_killed=ALL_KILLED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "no rank ran the test to its end: injected faults ended every rank: ranks 0, 1 died "
            "(killed by SIGKILL). [[]ddp failed, rank_exited]",
            "injected: SIGKILL on rank 0 at all_reduce call 1 (test_all_killed.py:*)",
            "injected: SIGKILL on rank 1 at all_reduce call 1 (test_all_killed.py:*)",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_all_killed.py::test_every_rank_killed*"])

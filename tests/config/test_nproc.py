"""RLIMIT_NPROC as the kernel counts it (config/machine.py): who it holds to, how it counts a user's
threads, the capacity in ranks it leaves; and a session under a low limit, as root and as a user."""

from __future__ import annotations

import os
import resource
import shutil

import pytest

from conftest import Session, sessions_together
from pytest_ddp.common import procfs
from pytest_ddp.config.machine import (
    CAP_SYS_ADMIN,
    CAP_SYS_RESOURCE,
    RANK_MEMORY,
    RANK_TASKS,
    SESSION_TASKS,
    nproc_enforced,
    rank_capacity,
    statuses,
    user_tasks,
)

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


def status(real_uid: int, effective_uid: int, threads: int) -> dict[str, str]:
    text = f"Name:\tpython\nUid:\t{real_uid}\t{effective_uid}\t{effective_uid}\t{effective_uid}\nThreads:\t{threads}\n"
    return procfs.parse_fields(text)


def test_rlimit_nproc_counts_the_threads_of_the_real_uid() -> None:
    statuses = [status(1001, 1001, 6), status(1001, 0, 3), status(0, 1001, 50), status(1002, 1002, 1)]
    assert user_tasks(statuses, 1001) == 9


def test_rank_capacity_by_memory_and_by_rlimit_nproc_in_threads_never_negative() -> None:
    memory = 1000 * RANK_MEMORY
    assert rank_capacity(memory, 40, 3) == (
        (40 - 3 - SESSION_TASKS) // RANK_TASKS,
        f"RLIMIT_NPROC 40 with 3 threads of this user running, at least {RANK_TASKS} per rank",
    )
    why = "RLIMIT_NPROC 300 with 50 threads of this user running, at least 7 per rank"
    assert rank_capacity(memory, 300, 50) == (35, why)  # 7 threads a rank, 3 more for the session
    assert rank_capacity(memory, 40, 100)[0] == 0
    assert rank_capacity(memory, -1, 100) == (1000, "22000 MiB available at about 22 MiB per rank")
    assert rank_capacity(2000 * RANK_MEMORY - 1, -1, 0)[0] == 1999
    # This project's machine (24 GiB, 4 in use) holds 600 ranks or more, not 2000.
    assert 600 <= rank_capacity(20 * 2**30, 96365, tasks=500)[0] < 2000


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
    if user_tasks(statuses(), UID):
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
    done.stdout.fnmatch_lines(["*ERROR at setup of test_eight*", "world_size=8: this machine holds at most 2 ranks "
                               "(RLIMIT_NPROC 25 with *"], consecutive=True)
    assert f"threads of this user running, at least {RANK_TASKS} per rank); --ddp-max-world-size=N" in out

"""Hostile edges, third round (issue 26): the compiled kernels' cache where others can write or
nothing can be written, RLIMIT_NPROC as the kernel counts it, exit codes of injected faults,
faults that can never fire, and a test whose every rank an injected fault ended."""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
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
from pytest_ddp.record import compiled

pytest_plugins = ["pytester"]

ROOT = os.geteuid() == 0
OTHER_UID = 65534  # nobody: another user, for the tests that need one (root only)

# -- the compiled kernels' cache ------------------------------------------------------------

# The ranks' functional collective, and whether the compiled kernels recorded it there.
KERNELS_TEST = """
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pytest_ddp
from pytest_ddp.record import backend_hook, compiled

EXPECT = os.environ["EXPECT_COMPILED"] == "1"


def functional(rank):
    assert funcol.all_reduce(torch.ones(1), "sum", dist.group.WORLD).wait().item() == 2
    return backend_hook.compiled_kernels(), compiled.why_not()
"""
# The controller builds and checks the kernels before the ranks start.
BY_MARKER = """
@pytest.mark.ddp(world_size=2)
def test_marker():
    loaded, why = functional(dist.get_rank())
    assert loaded is EXPECT, why
"""
# No ddp item: the ranks of run() build and check them on their own.
BY_RUN = """
def test_run():
    result = pytest_ddp.run(functional, world_size=2)
    assert result.outcome == "passed", result.diagnosis
    assert [loaded for loaded, _ in result.values] == [EXPECT, EXPECT], result.values
"""

# A library that says so when anything loads it.
PLANTED_SOURCE = """
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char* mark = getenv("PLANTED_MARK");
    FILE* f = mark ? fopen(mark, "w") : NULL;
    if (f) fclose(f);
}
"""


def compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++")


NO_COMPILER = "no C++ compiler to build the kernels with"


def built_libraries(folder: Path) -> tuple[tuple[str, bytes, bytes], bytes]:
    """The kernels' file name, bytes and recorded sha256, as built into this session's cache
    (built there once if they are not); and the planted library's bytes, built in ``folder``."""
    done = subprocess.run(
        [sys.executable, "-c", "from pytest_ddp.record import compiled; print(compiled.build())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "why_not=None" in done.stdout, done.stdout
    torch_dir = compiled._torch_dir()
    assert torch_dir is not None
    name = compiled.library_name(torch_dir)
    cache = compiled.cache_folder()
    good = name, (cache / name).read_bytes(), (cache / name).with_suffix(".sha256").read_bytes()
    (folder / "planted.c").write_text(PLANTED_SOURCE)
    command = [str(compiler()), "-shared", "-fPIC", "-x", "c", "planted.c", "-o", "planted.so"]
    subprocess.run(command, cwd=folder, check=True)
    return good, (folder / "planted.so").read_bytes()


def cache_with(home: Path, name: str, library: bytes | None, digest: bytes | None) -> Path:
    """``home``/pytest-ddp, private, holding ``library`` as ``name`` and ``digest`` beside it."""
    cache = home / "pytest-ddp"
    cache.mkdir(mode=0o700, parents=True)
    if library is not None:
        (cache / name).write_bytes(library)
        (cache / name).chmod(0o700)
    if digest is not None:
        (cache / name).with_suffix(".sha256").write_bytes(digest)
        (cache / name).with_suffix(".sha256").chmod(0o600)
    return cache


@dataclass
class Case:
    """One test's inner session (KERNELS_TEST + ``entry``, run under ``prefix``) with its kernels'
    cache under ``home``, laid out by the test's case; ``skip``: why it cannot run here."""

    home: Path
    expect_compiled: bool = False
    entry: str = BY_MARKER
    env: dict[str, str] = field(default_factory=dict)
    prefix: tuple[str, ...] = ()
    before: list[str] = field(default_factory=list)  # the cache's files, before the session
    skip: str | None = None
    result: pytest.RunResult | None = None
    planted_mark: Path = Path()

    def passed(self) -> pytest.RunResult:
        """The session's result: it passed, with or without the kernels, and loaded no planted library."""
        if self.skip is not None:
            pytest.skip(self.skip)
        assert self.result is not None
        self.result.assert_outcomes(passed=1)
        assert not self.planted_mark.exists()
        return self.result


def damaged(home: Path, good: tuple[str, bytes, bytes], planted: bytes, damage: str, entry: str) -> Case:
    name, library, digest = good
    damaged = {"truncated": library[: len(library) // 2], "empty": b"", "planted": planted}
    cache_with(home, name, damaged.get(damage, library), None if damage == "no sha256" else digest)
    return Case(home, False, entry, {"CXX": "false"})


def hostile(home: Path, good: tuple[str, bytes, bytes], planted: bytes, how: str, entry: str) -> Case:
    if how == "cache of another user" and not ROOT:
        return Case(home, skip="giving a folder to another user takes root")
    cache = cache_with(home, good[0], planted, hashlib.sha256(planted).hexdigest().encode())
    if how == "cache 0777":
        cache.chmod(0o777)
    elif how == "parent 0777":
        home.chmod(0o777)
    else:
        os.chown(cache, OTHER_UID, OTHER_UID)
    return Case(home, False, entry, before=sorted(path.name for path in cache.iterdir()))


def unwritable(home: Path, where: str) -> Case:
    cache = home / "pytest-ddp"
    prefix: tuple[str, ...] = ()
    if where == "a file as XDG_CACHE_HOME":
        home.write_text("")
    elif where == "a file as the cache":
        home.mkdir()
        cache.write_text("")
    else:
        if ROOT:  # root writes through a folder's permissions, but not without its capabilities
            if shutil.which("setpriv") is None:
                return Case(home, skip="no setpriv to drop root's capabilities with")
            prefix = ("setpriv", "--inh-caps=-all", "--bounding-set=-all")
        if where == "an unwritable folder":
            home.mkdir(mode=0o500)
        else:
            cache.mkdir(mode=0o500, parents=True)
    return Case(home, prefix=prefix)


DAMAGED = {
    "truncated": ("truncated", BY_MARKER),
    "empty-ranks": ("empty", BY_RUN),
    "planted": ("planted", BY_MARKER),
    "planted-ranks": ("planted", BY_RUN),
    "no-sha256": ("no sha256", BY_MARKER),
}
HOSTILE = {
    "cache-writable": ("cache 0777", BY_MARKER),
    "cache-writable-ranks": ("cache 0777", BY_RUN),
    "parent-writable": ("parent 0777", BY_MARKER),
    "cache-of-another-user": ("cache of another user", BY_MARKER),
}
UNWRITABLE = ["a file as XDG_CACHE_HOME", "a file as the cache", "an unwritable folder", "an unwritable cache"]


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """The inner sessions of the cache tests below, by the test's case: each cache laid out as
    its test says, then the sessions run together, 4 at a time (each one's controller and ranks
    mostly wait for their imports and each other)."""
    folder = tmp_path_factory.mktemp("caches")
    homes = folder / "homes"
    homes.mkdir()
    cases = {f"unwritable-{where}": unwritable(homes / f"unwritable-{i}", where) for i, where in enumerate(UNWRITABLE)}
    if compiler() is None:
        for case in ("truncated-rebuilt", "another-users-library", "sticky"):
            cases[case] = Case(homes / case, skip=NO_COMPILER)
        for case in [*DAMAGED, *HOSTILE]:
            cases[case] = Case(homes / case, skip=NO_COMPILER)
    else:
        good, planted = built_libraries(folder)
        name, library, digest = good
        for case, (damage, entry) in DAMAGED.items():
            cases[case] = damaged(homes / case, good, planted, damage, entry)
        for case, (how, entry) in HOSTILE.items():
            cases[case] = hostile(homes / case / "home", good, planted, how, entry)
        cache_with(homes / "truncated-rebuilt", name, library[:1000], digest)
        cases["truncated-rebuilt"] = Case(homes / "truncated-rebuilt", True)
        other = homes / "another-users-library"
        if ROOT:
            cache = cache_with(other, name, planted, hashlib.sha256(planted).hexdigest().encode())
            os.chown(cache / name, OTHER_UID, OTHER_UID)
            cases["another-users-library"] = Case(other, env={"CXX": "false"})
        else:
            cases["another-users-library"] = Case(other, skip="giving a file to another user takes root")
        shared = homes / "sticky" / "shared"
        shared.mkdir(parents=True)
        shared.chmod(0o1777)
        cache_with(shared, name, library, digest)
        cases["sticky"] = Case(shared, True)
    sessions = {}
    for case, run in cases.items():
        if run.skip is None:
            run.planted_mark = folder / "runs" / case / "planted-was-loaded"
            env = {"XDG_CACHE_HOME": str(run.home), "EXPECT_COMPILED": "1" if run.expect_compiled else "0",
                   "PLANTED_MARK": str(run.planted_mark), **run.env}  # fmt: skip
            sessions[case] = Session({"test_kernels.py": KERNELS_TEST + run.entry}, env=env, prefix=run.prefix)
    for case, result in sessions_together(folder / "runs", sessions, timeout=600, at_once=4).items():
        cases[case].result = result
    return cases


def verifies(cache: Path, name: str) -> bool:
    library = cache / name
    recorded = library.with_suffix(".sha256").read_text().strip()
    return hashlib.sha256(library.read_bytes()).hexdigest() == recorded


def library_name() -> str:
    torch_dir = compiled._torch_dir()
    assert torch_dir is not None
    return compiled.library_name(torch_dir)


def test_two_sessions_building_into_one_empty_cache_build_once(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Both sessions pass with the compiled kernels; one compiles, the other waits for it and
    loads its library; the cache holds one library, its sha256 and the lock, nothing half-written."""
    real = compiler()
    if real is None:
        pytest.skip(NO_COMPILER)
    log = tmp_path / "compiles"
    wrapper = tmp_path / "cxx"
    wrapper.write_text(f'#!/bin/sh\necho "$$" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o700)
    home = tmp_path / "home"
    pytester.makepyfile(test_kernels=KERNELS_TEST + BY_MARKER)
    env = dict(os.environ, XDG_CACHE_HOME=str(home), CXX=str(wrapper), EXPECT_COMPILED="1")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_kernels.py"]
    sessions = [
        subprocess.Popen(
            command, cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in sessions]
    assert [process.returncode for process in sessions] == [0, 0], outputs
    assert len(log.read_text().splitlines()) == 1
    name = library_name()
    cache = home / "pytest-ddp"
    assert sorted(path.name for path in cache.iterdir()) == sorted(
        [name, Path(name).with_suffix(".lock").name, Path(name).with_suffix(".sha256").name]
    )
    assert verifies(cache, name)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / name).with_suffix(".sha256").stat().st_mode) == 0o600


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_library_is_never_loaded(caches: dict[str, Case], case: str) -> None:
    """A cached library that does not match the sha256 recorded when it was built (cut short,
    emptied, another library under its name, or none recorded) is rebuilt, never loaded; here the
    rebuild fails (no compiler), so the ranks record in Python and the session says why."""
    damage, entry = DAMAGED[case]
    result = caches[case].passed()
    name = library_name()
    cache = caches[case].home / "pytest-ddp"
    if entry is BY_MARKER:
        why = (
            f"the sha256 of the cached {name} is missing"
            if damage == "no sha256"
            else f"the cached {name} does not match the sha256 recorded when it was built"
        )
        result.stdout.fnmatch_lines(
            [
                f"pytest-ddp: functional collectives recorded in Python (slower): {why}, "
                "and rebuilding it failed: the C++ build failed: exit code 1"
            ]
        )
    left = {name, Path(name).with_suffix(".lock").name, Path(name).with_suffix(".sha256").name}
    if damage == "no sha256":
        left.remove(Path(name).with_suffix(".sha256").name)
    assert {path.name for path in cache.iterdir()} == left


def test_a_truncated_library_is_rebuilt_and_the_session_says_so(caches: dict[str, Case]) -> None:
    result = caches["truncated-rebuilt"].passed()
    name = library_name()
    result.stdout.fnmatch_lines(
        [
            f"pytest-ddp: compiled kernels rebuilt: the cached {name} does not match the sha256 recorded when it "
            "was built; rebuilt"
        ]
    )
    assert verifies(caches["truncated-rebuilt"].home / "pytest-ddp", name)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_cache_others_can_write_is_not_used(caches: dict[str, Case], case: str) -> None:
    """A library in a cache that someone else could have written (a shared HOME=/tmp, a CI
    cache) is never loaded, even with a sha256 that matches it: the session falls back to
    Python and says why, and how to have a private cache; nothing is written there."""
    hostile, entry = HOSTILE[case]
    result = caches[case].passed()
    home = caches[case].home
    cache = home / "pytest-ddp"
    if hostile == "cache 0777":
        why = f"the kernels' cache {cache} is writable by others (mode 777)"
    elif hostile == "parent 0777":
        why = f"the kernels' cache {cache} is in {home}, writable by others (mode 777)"
    else:
        why = f"the kernels' cache {cache} is owned by uid {OTHER_UID}, not by this user"
    if entry is BY_MARKER:
        result.stdout.fnmatch_lines(
            [
                f"pytest-ddp: functional collectives recorded in Python (slower): {why}; "
                "XDG_CACHE_HOME=<a folder of your own> gives it a private one"
            ]
        )
    assert sorted(path.name for path in cache.iterdir()) == caches[case].before


def test_a_library_of_another_user_in_a_private_cache_is_not_loaded(caches: dict[str, Case]) -> None:
    result = caches["another-users-library"].passed()
    result.stdout.fnmatch_lines(
        [
            f"pytest-ddp: functional collectives recorded in Python (slower): the cached {library_name()} is not a "
            "file of this user's that only this user can write, and rebuilding it failed: *"
        ]
    )


def test_a_cache_under_a_sticky_shared_folder_is_used(caches: dict[str, Case]) -> None:
    """HOME=/tmp: a private cache folder in a folder everyone may write but only the owner of an
    entry may rename or remove it (the sticky bit), is private: its kernels load."""
    result = caches["sticky"].passed()
    assert "pytest-ddp:" not in result.stdout.str()


@pytest.mark.parametrize("where", UNWRITABLE)
def test_a_cache_that_cannot_be_made_or_written_falls_back_to_python(caches: dict[str, Case], where: str) -> None:
    """Not an error out of the plugin at configure (before: NotADirectoryError, FileNotFoundError):
    the session records in Python and says why."""
    result = caches[f"unwritable-{where}"].passed()
    cache = caches[f"unwritable-{where}"].home / "pytest-ddp"
    why = {
        "a file as XDG_CACHE_HOME": f"the kernels' cache {cache} cannot be made: Not a directory",
        "a file as the cache": f"the kernels' cache {cache} cannot be made: File exists",
        "an unwritable folder": f"the kernels' cache {cache} cannot be made: Permission denied",
        "an unwritable cache": f"the kernels' cache {cache} cannot be written: Permission denied",
    }[where]
    result.stdout.fnmatch_lines([f"pytest-ddp: functional collectives recorded in Python (slower): {why}"])


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


def unused_uid() -> int:
    """A uid no process runs as."""
    uid = 54321
    if user_tasks(_statuses(), uid):
        pytest.skip(f"uid {uid} runs processes here")
    return uid


def _statuses() -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found.append(Path(f"/proc/{entry}/status").read_text())
            except OSError:
                continue
    return found


@pytest.mark.parametrize("who", ["root", "a user"])
def test_a_session_under_a_low_rlimit_nproc(pytester: pytest.Pytester, who: str) -> None:
    """``ulimit -u 25``: root is not held to it, so both tests run; a user is, so its 2 ranks
    run (a 2-rank session peaks at 20 threads) and 8 are refused, saying why, before anything starts."""
    if not ROOT:
        pytest.skip("runs a session as root, and as another real uid (setpriv), which takes root")
    pytester.makepyfile(test_nproc=NPROC_TEST)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'tmp'}"]
    if who == "a user":
        if shutil.which("setpriv") is None:
            pytest.skip("no setpriv to run a session as another real uid")
        # Another real uid (RLIMIT_NPROC counts the real uid's threads), still euid 0 to read
        # this checkout and the venv, with no capability (either would exempt it).
        command = ["setpriv", f"--ruid={unused_uid()}", "--bounding-set=-all", "--inh-caps=-all", *command]
    done = subprocess.run(
        [*command, "test_nproc.py"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NPROC, (25, 25)),
    )
    if who == "root":
        assert done.returncode == 0, done.stdout
        assert "2 passed" in done.stdout
        return
    assert "1 passed, 1 error" in done.stdout, done.stdout
    assert (
        "test_nproc.py::test_eight: world_size=8: this machine holds at most 2 ranks (RLIMIT_NPROC 25 with "
    ) in done.stdout
    assert f"threads of this user running, at least {RANK_TASKS} per rank); --ddp-max-world-size=N" in done.stdout


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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "injected faults never fired: raise RuntimeError(*) on rank 1 at all_reduce call 1 "
            "(never reached: SIGKILL on rank 1 at barrier call 1 ended the rank first) [[]ddp failed*]",
        ]
    )


XDIST_FAULTS = """
import pytest, torch
import torch.distributed as dist
from pytest_ddp import faults


@pytest.mark.ddp(world_size=2, faults=[faults.raise_(rank=1, at="all_reduce", exc=ValueError)])
def test_fault(rank):
    if rank == 1:
        with pytest.raises(ValueError):
            dist.all_reduce(torch.ones(1))
    else:
        dist.barrier()  # rank 1's all_reduce never took part
    if rank == 1:
        dist.barrier()


@pytest.mark.parametrize("n", range(4))
@pytest.mark.ddp(world_size=2)
def test_no_fault(rank, n):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@pytest.mark.ddp(world_size=2, faults=[faults.kill(rank=0, at="all_reduce", call=2)])
def test_never_fires(rank):
    dist.all_reduce(torch.ones(1))
"""


def test_faults_under_xdist_fire_in_their_own_test_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_xdist_faults=XDIST_FAULTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*FAILED test_xdist_faults.py::test_never_fires*"])
    result.stdout.fnmatch_lines(["*injected faults never fired: SIGKILL on rank 0 at all_reduce call 2*"])


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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
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

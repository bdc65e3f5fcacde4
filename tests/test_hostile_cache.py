"""Hostile edges, third round (issue 26): the compiled kernels' cache where others can write or
nothing can be written, or where two sessions build into it at once.

Every case is an inner session of its own (the cache is a session's XDG_CACHE_HOME), in this
process where it can be (its ranks come from this process's forkserver: 2 to 3 s a case here,
against 5 to 6 s in a session of its own, which imports torch and starts a forkserver). Split from
test_hostile_edges.py, the rest of issue 26's edges, so that pytest-xdist's --dist loadfile can
give the two files to two workers."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import Session, session_in_process, sessions_together
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
    built = compiled.build()
    assert built.why_not is None, built
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

    def environment(self) -> dict[str, str]:
        """What the case's session sets in the environment."""
        return {"XDG_CACHE_HOME": str(self.home), "EXPECT_COMPILED": "1" if self.expect_compiled else "0",
                "PLANTED_MARK": str(self.planted_mark), **self.env}  # fmt: skip

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
    """The cases of the cache tests below, by the test's case, each cache laid out as its test
    says; the sessions of the cases that run under a prefix (setpriv: root without its
    capabilities) run here, together, in processes of their own, and the others' in their
    tests (:func:`ran`)."""
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
    for case, run in cases.items():
        run.planted_mark = folder / "runs" / case / "planted-was-loaded"
    prefixed = {
        case: Session({"test_kernels.py": KERNELS_TEST + run.entry}, env=run.environment(), prefix=run.prefix)
        for case, run in cases.items()
        if run.skip is None and run.prefix
    }
    for case, result in sessions_together(folder / "runs", prefixed, timeout=600).items():
        cases[case].result = result
    return cases


@pytest.fixture
def ran(caches: dict[str, Case], pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Case]:
    """A case, its session run: in this process, or, run under a prefix, by :func:`caches`."""

    def run(name: str) -> Case:
        case = caches[name]
        if case.skip is None and case.result is None:
            for key, value in case.environment().items():
                monkeypatch.setenv(key, value)
            # Set, so that it is undone after: the controller turns the kernels off for its ranks
            # in its own environment (this process's) where they cannot be had.
            monkeypatch.setenv(compiled.ENV, "1")
            pytester.makepyfile(test_kernels=KERNELS_TEST + case.entry)
            case.result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
        return case

    return run


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
    env = {"XDG_CACHE_HOME": str(home), "CXX": str(wrapper), "EXPECT_COMPILED": "1"}
    session = Session({"test_kernels.py": KERNELS_TEST + BY_MARKER}, ("-q",), env)
    # One in a process of its own, started first (it imports torch), the other in this one.
    there = pytester.mkdir("there")
    (there / "test_kernels.py").write_text(session.files["test_kernels.py"])
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_kernels.py"]
    other = subprocess.Popen(
        command, cwd=there, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        here = session_in_process(pytester, "here", session)
    finally:
        output = other.communicate(timeout=600)[0]
    assert (here.ret, other.returncode) == (0, 0), (here.stdout.str(), output)
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
def test_a_damaged_library_is_never_loaded(ran: Callable[[str], Case], case: str) -> None:
    """A cached library that does not match the sha256 recorded when it was built (cut short,
    emptied, another library under its name, or none recorded) is rebuilt, never loaded; here the
    rebuild fails (no compiler), so the ranks record in Python and the session says why."""
    damage, entry = DAMAGED[case]
    run = ran(case)
    result = run.passed()
    name = library_name()
    cache = run.home / "pytest-ddp"
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


def test_a_truncated_library_is_rebuilt_and_the_session_says_so(ran: Callable[[str], Case]) -> None:
    run = ran("truncated-rebuilt")
    result = run.passed()
    name = library_name()
    result.stdout.fnmatch_lines(
        [
            f"pytest-ddp: compiled kernels rebuilt: the cached {name} does not match the sha256 recorded when it "
            "was built; rebuilt"
        ]
    )
    assert verifies(run.home / "pytest-ddp", name)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_cache_others_can_write_is_not_used(ran: Callable[[str], Case], case: str) -> None:
    """A library in a cache that someone else could have written (a shared HOME=/tmp, a CI
    cache) is never loaded, even with a sha256 that matches it: the session falls back to
    Python and says why, and how to have a private cache; nothing is written there."""
    hostile, entry = HOSTILE[case]
    run = ran(case)
    result = run.passed()
    home = run.home
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
    assert sorted(path.name for path in cache.iterdir()) == run.before


def test_a_library_of_another_user_in_a_private_cache_is_not_loaded(ran: Callable[[str], Case]) -> None:
    result = ran("another-users-library").passed()
    result.stdout.fnmatch_lines(
        [
            f"pytest-ddp: functional collectives recorded in Python (slower): the cached {library_name()} is not a "
            "file of this user's that only this user can write, and rebuilding it failed: *"
        ]
    )


def test_a_cache_under_a_sticky_shared_folder_is_used(ran: Callable[[str], Case]) -> None:
    """HOME=/tmp: a private cache folder in a folder everyone may write but only the owner of an
    entry may rename or remove it (the sticky bit), is private: its kernels load."""
    result = ran("sticky").passed()
    assert "pytest-ddp:" not in result.stdout.str()


@pytest.mark.parametrize("where", UNWRITABLE)
def test_a_cache_that_cannot_be_made_or_written_falls_back_to_python(ran: Callable[[str], Case], where: str) -> None:
    """Not an error out of the plugin at configure (before: NotADirectoryError, FileNotFoundError):
    the session records in Python and says why."""
    run = ran(f"unwritable-{where}")
    result = run.passed()
    cache = run.home / "pytest-ddp"
    why = {
        "a file as XDG_CACHE_HOME": f"the kernels' cache {cache} cannot be made: Not a directory",
        "a file as the cache": f"the kernels' cache {cache} cannot be made: File exists",
        "an unwritable folder": f"the kernels' cache {cache} cannot be made: Permission denied",
        "an unwritable cache": f"the kernels' cache {cache} cannot be written: Permission denied",
    }[where]
    result.stdout.fnmatch_lines([f"pytest-ddp: functional collectives recorded in Python (slower): {why}"])

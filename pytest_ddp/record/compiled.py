"""The recorder's compiled kernels (``recorder_kernels.cpp``): built once per torch and Python,
cached, and loaded by the ranks.

A Python kernel on each functional collective and its wait_tensor costs about 35 us of CPU per
call on two ranks; the compiled ones cost a few.  They are built with the machine's C++
compiler against the installed torch's headers (5 to 10 s, once: the library is cached under
``~/.cache/pytest-ddp``, named by what it was built from), by the controller before it starts
any rank, and by a launched rank that finds none.  Where they cannot be built or loaded (no
compiler, no Python headers, a torch whose C++ API differs, a cache that cannot be made or is
not private), or ``PYTEST_DDP_COMPILED=0`` is set, the recorder records the same calls in
Python: slower, never different.

A library is loaded only from a private cache (:func:`_private_cache`: a folder of this user's
that nobody else can write, on a path nobody else can change) and only if its bytes have the
sha256 recorded beside it when it was built; one that does not (truncated, emptied, planted, or
built by an older pytest-ddp that recorded none) is rebuilt.  The bytes hashed are the bytes
loaded: the library is opened once, hashed from that descriptor and loaded through it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ENV = "PYTEST_DDP_COMPILED"  # "0": record in Python only
SOURCE = Path(__file__).with_name("recorder_kernels.cpp")
MODULE = "pytest_ddp_recorder_kernels"  # the name its PyInit_ function carries
BUILD_TIMEOUT = 300.0  # seconds
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_PRIVATE = "; XDG_CACHE_HOME=<a folder of your own> gives it a private one"

_loaded: ModuleType | None = None
_why_not: str | None = None  # why there are none in this process, once known


@dataclass(frozen=True)
class Built:
    """What :func:`build` found: ``why_not`` None, a library to load; ``rebuilt``: why the
    cached one was replaced, if it was."""

    why_not: str | None = None
    rebuilt: str | None = None

    def line(self) -> str | None:
        """The one line a session says about its kernels, if any."""
        if self.why_not is not None:
            return f"functional collectives recorded in Python (slower): {self.why_not}"
        if self.rebuilt is not None:
            return f"compiled kernels rebuilt: {self.rebuilt}"
        return None


class _Unusable(Exception):
    """The cache, or a library in it, cannot be used (the message says why)."""


def wanted() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")  # found without importing torch (the controller does not)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-ddp"


def library_name(torch_dir: Path) -> str:
    """The file name of the kernels built for this torch, this Python and this source."""
    identity = hashlib.sha256()
    identity.update(SOURCE.read_bytes())
    identity.update(str(torch_dir.resolve()).encode())
    identity.update((torch_dir / "version.py").read_bytes())
    identity.update(sys.version.encode())
    return f"recorder_kernels-{identity.hexdigest()[:16]}{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def _private_cache() -> Path:
    """The cache folder, made (0700) where missing, resolved; :class:`_Unusable` unless this user
    owns it and nobody else can write it or any folder above it (a sticky one like /tmp aside:
    nobody else can rename what is this user's there), so nobody else can put a library in it."""
    folder = cache_folder()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(os.path.realpath(folder))
        info = os.lstat(folder)
    except OSError as error:
        raise _Unusable(f"the kernels' cache {folder} cannot be made: {error.strerror or error}") from None
    me = os.geteuid()
    if info.st_uid != me:
        raise _Unusable(f"the kernels' cache {folder} is owned by uid {info.st_uid}, not by this user{_PRIVATE}")
    if info.st_mode & 0o022:
        raise _Unusable(f"the kernels' cache {folder} is writable by others (mode {_mode(info)}){_PRIVATE}")
    for above in folder.parents:
        try:
            info = os.stat(above)
        except OSError as error:
            raise _Unusable(f"the kernels' cache {folder}: {above}: {error.strerror or error}") from None
        if info.st_uid not in (me, 0):
            raise _Unusable(f"the kernels' cache {folder} is in {above}, owned by uid {info.st_uid}{_PRIVATE}")
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            raise _Unusable(
                f"the kernels' cache {folder} is in {above}, writable by others (mode {_mode(info)}){_PRIVATE}"
            )
    return folder


def _mode(info: os.stat_result) -> str:
    return f"{stat.S_IMODE(info.st_mode):o}"


def _own_file(path: Path, what: str) -> int:
    """``path`` opened for reading: a regular file of this user's that nobody else can write
    (not a link); :class:`_Unusable` saying why not (``what``: the file in words)."""
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        raise _Unusable(f"{what} is missing") from None
    except OSError as error:
        raise _Unusable(f"{what} cannot be opened: {error.strerror or error}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(fd)
        raise _Unusable(f"{what} is not a file of this user's that only this user can write")
    return fd


def _digest_path(library: Path) -> Path:
    return library.with_suffix(".sha256")


def _open_verified(library: Path) -> int:
    """The library, opened, its bytes checked against the sha256 recorded beside it when it was
    built; :class:`_Unusable` saying why not."""
    fd = _own_file(library, f"the cached {library.name}")
    try:
        # The digest is read after the library was opened, and a build renames the library into
        # place before its digest: a library being replaced fails here, and is looked at again
        # under the build's lock.
        with os.fdopen(_own_file(_digest_path(library), f"the sha256 of the cached {library.name}")) as f:
            recorded = f.read().strip()
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        if digest.hexdigest() != recorded:
            raise _Unusable(f"the cached {library.name} does not match the sha256 recorded when it was built")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _verified(library: Path) -> str | None:
    """Why the cached library cannot be loaded, or None if it can."""
    try:
        os.close(_open_verified(library))
    except _Unusable as unusable:
        return str(unusable)
    return None


def _compile_command(torch_dir: Path, output: Path, cxx11_abi: bool) -> list[str]:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    include = torch_dir / "include"
    return [
        compiler,
        *("-O2", "-shared", "-fPIC", "-std=c++20", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}"),
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        f"-I{sysconfig.get_paths()['include']}",
        str(SOURCE),
        "-o",
        str(output),
        f"-L{torch_dir / 'lib'}",
        *("-lc10", "-ltorch_cpu", "-ltorch_python"),
    ]


def _library() -> tuple[Path, Path]:
    """This torch's folder, and where its kernels are cached; :class:`_Unusable` where they cannot be."""
    torch_dir = _torch_dir()
    if torch_dir is None:
        raise _Unusable("torch is not installed")
    return torch_dir, _private_cache() / library_name(torch_dir)


def build() -> Built:
    """Build the kernels for this torch unless a library that verifies is cached (or they are
    not wanted); one that does not verify is rebuilt.  One process builds at a time; the others
    wait for it and find its library."""
    if not wanted():
        return Built(f"{ENV}=0")
    try:
        torch_dir, target = _library()
    except _Unusable as unusable:
        return Built(str(unusable))
    if _verified(target) is None:
        return Built()
    try:
        lock = os.open(target.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        return Built(f"the kernels' cache {target.parent} cannot be written: {error.strerror or error}")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        why = _verified(target)  # None: another process built it while this one waited
        if why is None:
            return Built()
        rebuilt = why if os.path.lexists(target) else None  # a first build says nothing
        failed = _build(torch_dir, target)
    finally:
        os.close(lock)
    if failed is None:
        return Built(rebuilt=rebuilt and f"{rebuilt}; rebuilt")
    return Built(failed if rebuilt is None else f"{rebuilt}, and rebuilding it failed: {failed}")


def _cxx11_abi() -> bool:
    """The ABI flag torch was built with, asked of torch itself: of the torch this process
    imported (a rank's; a controller's, once the test files did), or else in a process of its
    own (a fresh interpreter importing torch: about 2 s of CPU), so as not to import it here."""
    flag = getattr(getattr(sys.modules.get("torch"), "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
    if flag is not None:
        return bool(flag)
    answer = subprocess.run(
        [sys.executable, "-c", "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=True,
    )
    return answer.stdout.strip() == "1"


def _build(torch_dir: Path, target: Path) -> str | None:
    """Compile into a folder of its own in the cache, then rename the library into place and its
    sha256 beside it (in that order: see :func:`_open_verified`); None, or why it failed."""
    try:
        abi = _cxx11_abi()
    except (OSError, subprocess.SubprocessError) as error:
        return f"could not ask torch how it was built: {error}"
    try:
        with tempfile.TemporaryDirectory(dir=target.parent) as folder:
            output = Path(folder) / target.name
            try:
                done = subprocess.run(
                    _compile_command(torch_dir, output, abi),
                    capture_output=True,
                    text=True,
                    timeout=BUILD_TIMEOUT,
                )
            except (OSError, subprocess.SubprocessError) as error:
                return f"no C++ compiler ran: {error}"
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).splitlines()
                errors = [line.strip() for line in lines if "error" in line] or [f"exit code {done.returncode}"]
                return "the C++ build failed: " + errors[0]
            os.chmod(output, 0o700)
            digest = _digest_path(output)
            fd = os.open(digest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(hashlib.sha256(output.read_bytes()).hexdigest() + "\n")
            os.replace(output, target)
            os.replace(digest, _digest_path(target))
    except OSError as error:  # a cache that could be made but not written, a full disk
        return f"the kernels' cache {target.parent} cannot be written: {error.strerror or error}"
    return None


def _load(fd: int, library: Path) -> ModuleType:
    """The module in the library open at ``fd``: loaded through the descriptor, so that what is
    loaded is what was verified."""
    through = f"/proc/self/fd/{fd}"
    loader = importlib.machinery.ExtensionFileLoader(MODULE, through)
    spec = importlib.util.spec_from_loader(MODULE, loader, origin=through)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.__file__ = str(library)  # where it is cached, not the descriptor it was loaded through
    return module


def kernels() -> ModuleType | None:
    """The compiled kernels, loaded in this process (built first where they are not cached, or
    their library fails verification); None where there are none (:func:`why_not` says why)."""
    global _loaded, _why_not
    if _loaded is not None or _why_not is not None:
        return _loaded
    _why_not = build().why_not
    if _why_not is not None:
        return None
    try:
        _, library = _library()
        fd = _open_verified(library)
    except _Unusable as unusable:
        _why_not = str(unusable)
        return None
    try:
        _loaded = _load(fd, library)
    except Exception as error:  # built against another torch's C++ API, ...
        _why_not = f"the compiled kernels did not load: {error}"
    finally:
        os.close(fd)
    return _loaded


def why_not() -> str | None:
    """Why this process records the functional collectives in Python, if it does."""
    return _why_not

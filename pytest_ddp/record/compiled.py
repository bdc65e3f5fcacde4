"""The recorder's compiled kernels (``recorder_kernels.cpp``): built once per torch and Python,
cached, and loaded by the ranks.

A Python kernel on each functional collective and its wait_tensor costs about 35 us of CPU per
call on two ranks; the compiled ones cost a few.  They are built with the machine's C++
compiler against the installed torch's headers (about 5 s, once: the library is cached under
``~/.cache/pytest-ddp``, named by what it was built from), by the controller before it starts
any rank, and by a launched rank that finds none.  Where they cannot be built or loaded (no
compiler, no Python headers, a torch whose C++ API differs), or ``PYTEST_DDP_COMPILED=0`` is set,
the recorder records the same calls in Python: slower, never different.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

ENV = "PYTEST_DDP_COMPILED"  # "0": record in Python only
SOURCE = Path(__file__).with_name("recorder_kernels.cpp")
MODULE = "pytest_ddp_recorder_kernels"  # the name its PyInit_ function carries
BUILD_TIMEOUT = 300.0  # seconds

_loaded: ModuleType | None = None
_why_not: str | None = None  # why there are none in this process, once known


def wanted() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")  # found without importing torch (the controller does not)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def library_path(torch_dir: Path) -> Path:
    """Where the kernels built for this torch, this Python and this source are cached."""
    identity = hashlib.sha256()
    identity.update(SOURCE.read_bytes())
    identity.update(str(torch_dir.resolve()).encode())
    identity.update((torch_dir / "version.py").read_bytes())
    identity.update(sys.version.encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-ddp"
    return cache / f"recorder_kernels-{identity.hexdigest()[:16]}{importlib.machinery.EXTENSION_SUFFIXES[0]}"


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


def build() -> str | None:
    """Build the kernels for this torch unless cached (or not wanted); None if they are there,
    else why not.  One process builds at a time; the others wait for it and find its library."""
    if not wanted():
        return f"{ENV}=0"
    torch_dir = _torch_dir()
    if torch_dir is None:
        return "torch is not installed"
    target = library_path(torch_dir)
    if target.exists():
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while this one waited
            return None
        return _build(torch_dir, target)


def _build(torch_dir: Path, target: Path) -> str | None:
    # The ABI flag torch was built with: asked of torch itself, in a process of its own (the
    # controller does not import torch).
    try:
        abi = subprocess.run(
            [sys.executable, "-c", "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"could not ask torch how it was built: {error}"
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        output = Path(folder) / target.name
        try:
            done = subprocess.run(
                _compile_command(torch_dir, output, abi == "1"), capture_output=True, text=True, timeout=BUILD_TIMEOUT
            )
        except (OSError, subprocess.SubprocessError) as error:
            return f"no C++ compiler ran: {error}"
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).splitlines()
            errors = [line.strip() for line in lines if "error" in line] or [f"exit code {done.returncode}"]
            return "the C++ build failed: " + errors[0]
        os.replace(output, target)
    return None


def kernels() -> ModuleType | None:
    """The compiled kernels, loaded in this process (built first where they are not cached);
    None where there are none (:func:`why_not` says why)."""
    global _loaded, _why_not
    if _loaded is not None or _why_not is not None:
        return _loaded
    _why_not = build()
    torch_dir = _torch_dir()  # found, where build() found nothing to say
    if _why_not is None and torch_dir is not None:
        try:
            spec = importlib.util.spec_from_file_location(MODULE, library_path(torch_dir))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _loaded = module
        except Exception as error:  # built against another torch's C++ API, ...
            _why_not = f"the compiled kernels did not load: {error}"
    return _loaded


def why_not() -> str | None:
    """Why this process records the functional collectives in Python, if it does."""
    return _why_not

"""The package as installed from its wheel, not as this editable checkout: the wheel carries every
subpackage, py.typed and the licence, and a venv that has only the wheel (torch and pytest seen
from this environment) runs a ddp test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "pytest_ddp"
# Not part of the source a wheel is built from (caches, venvs, earlier builds).
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", "__pycache__", "build", "dist", "*.egg-info", ".*_cache", "ddp-reports"
)

INSTALLED_TEST = """
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pytest_ddp


@pytest.mark.ddp(world_size=2)
def test_collectives_on_the_installed_package():
    assert Path(pytest_ddp.__file__).is_relative_to(sys.prefix), pytest_ddp.__file__
    tensor = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [3.0, 3.0]
    reduced = funcol.all_reduce(tensor, "sum", dist.group.WORLD)
    if isinstance(reduced, funcol.AsyncCollectiveTensor):
        reduced = reduced.wait()
    assert reduced.tolist() == [6.0, 6.0]
    from pytest_ddp.record import backend_hook

    assert backend_hook._functional_library is not None  # the recorder's kernels hold the functional ops
"""


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installed_in_a_fresh_venv_runs_a_ddp_test(tmp_path: Path) -> None:
    # Built from a copy of the checkout (an in-tree build would write build/ and *.egg-info into
    # it), with this environment's setuptools (the test extra's): offline, a second or two.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist", str(source)], tmp_path)
    [wheel] = (tmp_path / "dist").glob("pytest_ddp-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [dist_info] = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    shipped = {
        path.relative_to(REPO).as_posix()
        for pattern in ("*.py", "py.typed")
        for path in PACKAGE.rglob(pattern)
        if "__pycache__" not in path.parts
    }
    subpackages = {path.parent for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}
    assert {(path / "__init__.py").relative_to(REPO).as_posix() for path in subpackages} <= names
    assert "pytest_ddp/py.typed" in shipped
    assert shipped <= names, sorted(shipped - names)
    assert f"{dist_info}/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata and "License-File: LICENSE" in metadata
    assert "[pytest11]\nddp = pytest_ddp.plugin" in entry_points

    # A fresh venv with the wheel installed, that sees this environment's packages (torch, pytest)
    # through a .pth file but not its editable pytest_ddp: the .pth files of a directory a .pth
    # file adds are not processed, so the editable install's finder is never loaded.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = str(venv / "bin" / "python")
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path).strip())
    seen = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "outer-environment.pth").write_text("".join(f"{folder}\n" for folder in seen))
    run([*pip, "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)], tmp_path)

    # Run from outside the checkout.
    work = tmp_path / "work"
    work.mkdir()
    (work / "test_installed.py").write_text(INSTALLED_TEST)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH" and not key.startswith("PYTEST_")}
    located = run([python, "-c", "import pytest_ddp; print(pytest_ddp.__file__)"], work, env).strip()
    assert Path(located).is_relative_to(site), located
    output = run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_installed.py"], work, env)
    assert "1 passed" in output, output

"""What pytest-ddp costs a session that has no ddp test: nothing, or within 5 %.

Each workload runs with the plugin (as installed) and without it (``-p no:ddp`` in
``PYTEST_ADDOPTS``, which reaches every nested pytest too: xdist's workers, pytester's
subprocesses), alternately, and the ratio of the medians is printed:

- ``pytest --collect-only`` of an empty folder;
- 200 plain tests;
- pytest-xdist's and pytest-timeout's own suites, from their source distributions (downloaded
  from the package registry into a temporary folder; ``--suites`` to include them).

    python benchmarks/unused_cost.py [--rounds 7] [--suites]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SUITES = {"pytest-xdist==3.8.0": "testing", "pytest-timeout==2.4.0": "test_pytest_timeout.py"}
PLAIN = "\n".join(f"def test_{i}():\n    assert {i} == {i}\n" for i in range(200))


def timed(args: list[str], cwd: Path, with_plugin: bool) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if not with_plugin:
        env["PYTEST_ADDOPTS"] = "-p no:ddp"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def compare(name: str, args: list[str], cwd: Path, rounds: int) -> float:
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for with_plugin in (True, False):
            times[with_plugin].append(timed(args, cwd, with_plugin))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"{name:34} with {on:7.2f} s  without {off:7.2f} s  ratio {on / off:.3f}  ({rounds} rounds)", flush=True)
    return on / off


def suite_folder(requirement: str, root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "-d", str(root), requirement], check=True)
    name = requirement.replace("-", "_").replace("==", "-")
    with tarfile.open(root / f"{name}.tar.gz") as archive:
        archive.extractall(root, filter="data")
    return root / name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--suites", action="store_true", help="also pytest-xdist's and pytest-timeout's suites")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        empty = root / "empty"
        empty.mkdir()
        compare("empty --collect-only", ["--collect-only"], empty, args.rounds)
        plain = root / "plain"
        plain.mkdir()
        (plain / "test_plain.py").write_text(PLAIN)
        compare("200 plain tests", [], plain, args.rounds)
        if args.suites:
            for requirement, tests in SUITES.items():
                folder = suite_folder(requirement, root)
                compare(f"{requirement}'s own suite", ["-p", "no:randomly", tests], folder, max(1, args.rounds // 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())

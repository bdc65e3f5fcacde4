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
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SUITES = {"pytest-xdist==3.8.0": "testing", "pytest-timeout==2.4.0": "test_pytest_timeout.py"}
# What a suite's tests import beyond pytest and the plugins (installed beside them, for both arms).
SUITE_NEEDS = {"pytest-timeout==2.4.0": ["pexpect"]}
PLAIN = "\n".join(f"def test_{i}():\n    assert {i} == {i}\n" for i in range(200))


def timed(args: list[str], cwd: Path, with_plugin: bool, path: str = "") -> tuple[float, str]:
    """Seconds the session took, and its last line (its outcomes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if path:
        env["PYTHONPATH"] = path
    if not with_plugin:
        env["PYTEST_ADDOPTS"] = "-p no:ddp"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    return time.perf_counter() - start, lines[-1] if lines else ""


def compare(name: str, args: list[str], cwd: Path, rounds: int, path: str = "") -> float:
    times: dict[bool, list[float]] = {True: [], False: []}
    outcomes: dict[bool, set[str]] = {True: set(), False: set()}
    for _ in range(rounds):
        for with_plugin in (True, False):
            took, outcome = timed(args, cwd, with_plugin, path)
            times[with_plugin].append(took)
            outcomes[with_plugin].add(re.sub(r" in [0-9.]+s.*", "", outcome))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"{name:34} with {on:7.2f} s  without {off:7.2f} s  ratio {on / off:.3f}  ({rounds} rounds)", flush=True)
    print(f"{'':34} outcomes with: {sorted(outcomes[True])}; without: {sorted(outcomes[False])}", flush=True)
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
                needs = root / f"{folder.name}-needs"
                if SUITE_NEEDS.get(requirement):
                    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(needs),
                                    *SUITE_NEEDS[requirement]], check=True)
                compare(f"{requirement}'s own suite", ["-p", "no:randomly", tests], folder, max(1, args.rounds // 3),
                        str(needs) if needs.exists() else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())

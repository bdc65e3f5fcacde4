"""The same outcomes in any order: ddp test files run in file order, reversed, and shuffled by
pytest-randomly (several seeds), alone and under ``-n 2``, each test's outcome compared with its
outcome in file order, alone.  Warm ranks carry a test's leftovers to the next one; a verdict that
depends on the order is one of those leftovers showing.

The inputs: the project's examples (examples/test_passing.py and examples/broken/test_broken.py,
whose failures are on purpose: their outcomes too must not move), and the unchanged pytorch test
files of ``../shared/torch-tests/`` under ``--ddp-adopt`` (two by default, one of each harness
kind; ``--all`` for all thirteen).  Each run is a fresh pytest in a copy of its folder.

    python benchmarks/any_order.py [FOLDER ... | --all] [--seeds 1 2 3] [--no-xdist] [--no-file-orders]

Minutes (every run starts its rank groups anew).  Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCH_TESTS = REPO.parent / "shared" / "torch-tests"
# pytest-randomly, installed apart by the Makefile (in the venv, it would shuffle every session).
RANDOMLY = Path(sys.prefix) / "randomly"
# A plugin of the reversed runs: the collected items, last first.
REVERSE = "def pytest_collection_modifyitems(items):\n    items.reverse()\n"
DEFAULT_TORCH_TESTS = ["tensor_init", "tensor_common_rules"]


@dataclass
class Suite:
    name: str
    files: list[Path]  # copied into the run's folder (a folder: its contents)
    args: list[str]


@dataclass
class Run:
    order: str  # "file", "reversed", "seed N"
    workers: int  # 0: alone
    outcomes: dict[str, str]
    seconds: float
    status: int


def suites(everything: bool, folders: list[str]) -> list[Suite]:
    examples = [REPO / "examples" / "test_passing.py", REPO / "examples" / "broken" / "test_broken.py"]
    found = [Suite("examples", examples, [])]
    names = sorted(p.name for p in TORCH_TESTS.iterdir() if p.is_dir()) if everything else folders
    found += [Suite(name, [TORCH_TESTS / name], ["--ddp-adopt"]) for name in names if (TORCH_TESTS / name).is_dir()]
    return found


def junit_outcomes(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return outcomes


def run_once(suite: Suite, order: str, workers: int, timeout: float) -> Run:
    with tempfile.TemporaryDirectory(prefix="ddp-order-") as tmp:
        folder = Path(tmp) / suite.name
        folder.mkdir()
        for source in suite.files:
            if source.is_dir():
                shutil.copytree(source, folder, dirs_exist_ok=True)
            else:
                shutil.copy(source, folder)
        (Path(tmp) / "reverse_items.py").write_text(REVERSE)
        args = [*suite.args, "-q", "-p", "no:cacheprovider", f"--junitxml={Path(tmp) / 'junit.xml'}"]
        pythonpath = [tmp, os.environ.get("PYTHONPATH", "")]
        if order == "reversed":
            args += ["-p", "reverse_items"]
        elif order.startswith("seed "):
            args += ["-p", "randomly", f"--randomly-seed={order.split()[1]}"]
            pythonpath.insert(0, str(RANDOMLY))
        if workers:
            args += ["-n", str(workers)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, pythonpath))}
        env.pop("PYTEST_ADDOPTS", None)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *args], cwd=folder, env=env, timeout=timeout,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        )  # fmt: skip
        seconds = time.monotonic() - started
        outcomes = junit_outcomes(Path(tmp) / "junit.xml")
        if not outcomes:
            print(done.stdout[-3000:], file=sys.stderr)
        return Run(order, workers, outcomes, seconds, done.returncode)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", default=DEFAULT_TORCH_TESTS, help="folders of ../shared/torch-tests")
    parser.add_argument("--all", action="store_true", help="every folder of ../shared/torch-tests")
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--no-xdist", action="store_true", help="alone only, not also under -n 2")
    parser.add_argument("--no-file-orders", action="store_true", help="shuffled only (file order is still run once)")
    parser.add_argument("--timeout", type=float, default=900.0)
    options = parser.parse_args()
    if options.seeds and not RANDOMLY.is_dir():
        sys.exit(f"pytest-randomly is not in {RANDOMLY} (make venv installs it there)")
    orders = ["file", *([] if options.no_file_orders else ["reversed"]), *(f"seed {seed}" for seed in options.seeds)]
    modes = [0] if options.no_xdist else [0, 2]
    print("| input | order | workers | tests | same as file order alone | differ | time |")
    print("|---|---|---|---|---|---|---|")
    differing = 0
    for suite in suites(options.all, options.folders):
        reference: dict[str, str] | None = None
        for workers in modes:
            for order in orders:
                run = run_once(suite, order, workers, options.timeout)
                if reference is None:
                    reference = run.outcomes
                moved = sorted(
                    f"{test}: {reference.get(test)} -> {outcome}"
                    for test, outcome in run.outcomes.items() if reference.get(test) != outcome
                )  # fmt: skip
                missing = sorted(set(reference) - set(run.outcomes))
                moved += [f"{test}: {reference[test]} -> not run" for test in missing]
                differing += bool(moved) or not run.outcomes
                same = len(run.outcomes) - len(moved) + len(missing)
                print(
                    f"| {suite.name} | {order} | {workers or '-'} | {len(run.outcomes)} | {same} | "
                    f"{'; '.join(moved) or ('no outcome' if not run.outcomes else '0')} | {run.seconds:.1f} s |",
                    flush=True,
                )
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())

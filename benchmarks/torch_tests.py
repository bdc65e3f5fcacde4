"""pytorch's own test files, unchanged, under torch's harness and under pytest-ddp (``--ddp-adopt``), in
one run: the wall time of each side, the ratio, and every test's outcome compared.

The files are those of ``../shared/torch-tests/`` (its README.md and SOURCES.md): ten on torch's
warm harness (``DTensorContinuousTestBase``: workers kept per class; 12 classes), three that spawn
per test (``DTensorTestBase`` + ``@with_comms``).  Each side runs every folder given (default: all) in one
pytest session, rooted at ../shared/torch-tests with one empty ini file of a temporary folder (the
folders' own ini files each root pytest in its folder); nothing is copied.  An outcome that differs
only by a difference docs/adopt.md names (torch's poison pill: the rest of a continuous class skipped
after a failure) is named, and does not count as a difference.

    python benchmarks/torch_tests.py [FOLDER ... | --warm] [--timeout SECONDS]

``--warm``: the folders on torch's warm harness alone (their file names a continuous base class).

Minutes (torch's harness starts each spawn-per-test test's 4 processes).  Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from adopt_speed import MEDIAN
from any_order import TORCH_TESTS

# What torch's MultiProcContinuousTest skips the rest of a class with, after a test of it failed.
POISON_PILL = "Previous test failed"
# torch's warm base classes: MultiProcContinuousTest and those built on it.
WARM_BASE = re.compile(r"\((\w*ContinuousTestBase|MultiProcContinuousTest|FSDPTestContinuous)\)")
NAMED = {POISON_PILL: "torch's poison pill (a skip after an earlier failure of the class; docs/adopt.md)"}


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed, failed, error, skipped
    message: str  # the skip's or the failure's, first line
    seconds: float  # junit's: setup, call and teardown

    def __str__(self) -> str:
        return self.outcome + (f" ({self.message[:90]})" if self.message and self.outcome != "passed" else "")


@dataclass
class Side:
    name: str
    wall: float
    outcomes: dict[str, Outcome]  # by "folder/file.py::Class::test"
    ddp_line: str  # pytest-ddp's summary line, if any
    tail: str  # the end of its output


def junit(path: Path) -> dict[str, Outcome]:
    found = {}
    for case in ET.parse(path).getroot().iter("testcase") if path.exists() else ():
        module, _, cls = (case.get("classname") or "").rpartition(".")
        test = f"{module.replace('.', '/')}.py::{cls}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "").strip().splitlines()[0] if child.get("message") else ""
        found[test] = Outcome(outcome, message, float(case.get("time") or 0))
    return found


def warm(folder: Path) -> bool:
    """Whether the folder's test file has a class on torch's warm harness (a continuous base class)."""
    return any(WARM_BASE.search(path.read_text()) for path in folder.glob("test_*.py"))


def run(name: str, plugin_args: list[str], folders: list[str], timeout: float) -> Side:
    """One pytest session of every folder, under one rootdir and one empty ini file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with tempfile.TemporaryDirectory(prefix="ddp-torch-tests-") as tmp:
        ini, report = Path(tmp, "pytest.ini"), Path(tmp, "junit.xml")
        ini.write_text("")
        args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(TORCH_TESTS), "-c", str(ini)]
        args += [f"--junitxml={report}", *plugin_args, *(str(TORCH_TESTS / folder) for folder in folders)]
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *args], cwd=tmp, env=env, timeout=timeout,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", check=False,
        )  # fmt: skip
        wall = time.perf_counter() - start
        outcomes = junit(report)
    ddp = next((m[0] for m in MEDIAN.finditer(done.stdout)), "")
    counts = Counter(outcome.outcome for outcome in outcomes.values())
    print(f"{name:24} {wall:7.1f} s  {len(outcomes)} tests {dict(sorted(counts.items()))}  {ddp}", flush=True)
    return Side(name, wall, outcomes, ddp, done.stdout[-3000:])


def compare(torch: Side, ddp: Side) -> tuple[list[str], list[str]]:
    """(differences, differences named): each a line per test whose outcome is not the same."""
    differ, named = [], []
    for test in sorted(set(torch.outcomes) | set(ddp.outcomes)):
        ours, theirs = torch.outcomes.get(test), ddp.outcomes.get(test)
        if ours is not None and theirs is not None and ours.outcome == theirs.outcome:
            continue
        line = f"{test}: torch's harness {ours or 'not run'}, pytest-ddp {theirs or 'not run'}"
        why = next((text for key, text in NAMED.items() if ours is not None and key in ours.message), None)
        if why is not None and theirs is not None:
            named.append(f"{line}: {why}")
        else:
            differ.append(line)
    return differ, named


def _counts(outcomes: dict[str, Outcome]) -> str:
    counts = Counter(outcome.outcome for outcome in outcomes.values())
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def per_folder(torch: Side, ddp: Side) -> None:
    """Each folder's outcomes and seconds (junit's, summed: a class's start is in its first test's)."""
    print("| folder | tests | torch's harness | pytest-ddp | torch's s | pytest-ddp s |")
    print("|---|---|---|---|---|---|")
    sides = (torch, ddp)
    for folder in sorted({test.split("/")[0] for side in sides for test in side.outcomes}):
        ours, theirs = ({t: o for t, o in s.outcomes.items() if t.startswith(f"{folder}/")} for s in sides)
        seconds = " | ".join(f"{sum(o.seconds for o in side.values()):.1f}" for side in (ours, theirs))
        print(f"| {folder} | {len(ours)} | {_counts(ours)} | {_counts(theirs)} | {seconds} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", help="folders of ../shared/torch-tests (default: all)")
    parser.add_argument("--warm", action="store_true", help="the folders on torch's warm harness alone")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds each side may take")
    options = parser.parse_args()
    folders = options.folders or sorted(
        p.parent.name for p in TORCH_TESTS.glob("*/pytest.ini") if not options.warm or warm(p.parent)
    )
    if not folders:
        sys.exit(f"no test folders in {TORCH_TESTS}")
    torch = run("torch's harness", ["-p", "no:ddp"], folders, options.timeout)
    ddp = run("pytest-ddp --ddp-adopt", ["--ddp-adopt"], folders, options.timeout)
    for side in (torch, ddp):
        if not side.outcomes:
            print(f"{side.name}: no outcomes; its output ends:\n{side.tail}", file=sys.stderr)
    per_folder(torch, ddp)
    differ, named = compare(torch, ddp)
    for line in named:
        print(f"  differs by a named difference: {line}")
    for line in differ:
        print(f"  DIFFERS: {line}")
    same = not differ and bool(torch.outcomes)
    print(
        f"outcomes {'the same' if same else 'DIFFER'} ({len(named)} by a named difference); pytest-ddp "
        f"{torch.wall / ddp.wall:.1f}x faster ({torch.wall:.1f} s against {ddp.wall:.1f} s: the whole "
        f"session, collection and starts included; {os.cpu_count()} cores)"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

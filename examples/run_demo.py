"""`make demo`: run the examples and show pytest-ddp at work.

1. examples/test_passing.py must pass.
2. examples/broken/ must fail, each test with the diagnosis listed below; its
   reports are printed, so you can see what a hang report looks like.

Exits 0 when both hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
EXPECTED = {  # test name -> (status, kind, culprits)
    "test_rank_raises_while_peer_waits": ("deadlock", "rank_exited", [1]),
    "test_rank_sleeps_past_the_timeout": ("timeout", "timeout", [1]),
    "test_unpicklable_object_in_all_gather_object": ("deadlock", "rank_exited", [0]),
    "test_only_half_the_ranks_call_all_reduce": ("deadlock", "partial", [2, 3]),
    "test_ranks_disagree_on_the_collective": ("deadlock", "mismatch", None),
    "test_mpi_rank_raises_before_the_barrier": ("deadlock", "rank_exited", [1]),
}


def pytest_run(*args: str) -> int:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    print("$", " ".join(command[1:]), flush=True)
    return subprocess.call(command, cwd=HERE)


def main() -> int:
    problems = []
    if pytest_run("-v", "test_passing.py") != 0:
        problems.append("examples/test_passing.py did not pass")
    with tempfile.TemporaryDirectory() as reports:
        pytest_run("-v", "broken", f"--ddp-report-dir={reports}")
        found = {}
        for path in Path(reports).glob("*.json"):
            if path.name.endswith(".trace.json"):
                continue  # the same report as a Chrome trace (and an .html page beside it)
            data = json.loads(path.read_text())
            found[data["test"].rsplit("::", 1)[-1]] = data
    for name, (status, kind, culprits) in EXPECTED.items():
        data = found.get(name)
        if data is None:
            problems.append(f"{name}: did not fail")
            continue
        got = (data["status"], data["kind"], data["culprits"])
        if got[:2] != (status, kind) or (culprits is not None and got[2] != culprits):
            problems.append(f"{name}: expected {status}/{kind}/{culprits}, got {got}")
    print()
    if problems:
        print("demo: NOT as expected:")
        for problem in problems:
            print("  -", problem)
        return 1
    print(f"demo: as expected: the passing examples passed, and all {len(EXPECTED)} broken ones "
          "failed with the right diagnosis (reports above).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

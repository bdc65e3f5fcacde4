"""torch's own distributed tests under torch's harness and under pytest-ddp (``--ddp-adopt``), in one
run: wall time of each, per-test outcomes compared, and the ratio.

The tests are the installed torch's: ``DistributedTest._DistTestBase``, the mixin torch's
test/distributed/test_distributed_spawn.py runs for every backend, with ``TestDistBackend`` (its
own ``_run``, init and file barrier), on Gloo with 2 ranks, as that file's six lines put them
together; nothing of torch's is copied.  ``-k`` picks the set (default: the collectives,
point-to-point, barriers, groups and destroys, 111 tests).  ``--fresh`` also runs pytest-ddp with
``--ddp-isolate`` (fresh ranks for every test), for the cost of a fresh start against a warm one.

    python benchmarks/adopt_speed.py [-k EXPR] [--fresh]

Slow (torch's harness starts every test's processes): minutes.  Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE = """
import torch
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
"""
SELECTION = (
    "test_all_reduce or test_all_gather or test_broadcast or test_barrier or test_gather or test_scatter "
    "or test_reduce or test_isend or test_irecv or test_get_rank or test_destroy or test_new_subgroups"
)
OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b")
MEDIAN = re.compile(r"ddp: (\d+) tests? on (\d+) rank groups? started; median (\d+) ms per test")


def run(name: str, args: list[str], folder: Path) -> tuple[float, dict[str, str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(BACKEND="gloo", WORLD_SIZE="2")
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *args],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
    )
    wall = time.perf_counter() - start
    outcomes = {m[1]: m[2] for line in done.stdout.splitlines() if (m := OUTCOME.match(line))}
    ddp = next((m[0] for m in MEDIAN.finditer(done.stdout)), "")
    counts = {o: list(outcomes.values()).count(o) for o in sorted(set(outcomes.values()))}
    print(f"{name:28} {wall:8.1f} s  {len(outcomes)} tests {counts}  {ddp}", flush=True)
    return wall, outcomes, ddp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=SELECTION, help="which of the mixin's tests (pytest's -k)")
    parser.add_argument("--fresh", action="store_true", help="also pytest-ddp with fresh ranks for every test")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_distributed_spawn.py").write_text(MODULE)
        selected = ["test_distributed_spawn.py", "-k", options.k]
        torch_wall, torch_outcomes, _ = run("torch's harness", ["-p", "no:ddp", *selected], Path(folder))
        ddp_wall, ddp_outcomes, _ = run("pytest-ddp --ddp-adopt", ["--ddp-adopt", *selected], Path(folder))
        if options.fresh:
            run("pytest-ddp, fresh ranks", ["--ddp-adopt", "--ddp-isolate", *selected], Path(folder))
    differ = sorted(k for k in set(torch_outcomes) | set(ddp_outcomes) if torch_outcomes.get(k) != ddp_outcomes.get(k))
    for test in differ:
        print(f"  differs: {test}: torch {torch_outcomes.get(test)}, pytest-ddp {ddp_outcomes.get(test)}")
    print(f"outcomes {'equal' if not differ else 'DIFFER'}; pytest-ddp {torch_wall / ddp_wall:.1f}x faster "
          f"(wall time of the whole session, collection and start included; {os.cpu_count()} cores)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-test overhead of pytest-ddp against its peers, measured in one run.

Ten trivial 4-rank tests (one all_reduce each) through:

- pytest-ddp, warm groups (the default) and ``--ddp-isolate`` (fresh ranks per test);
- torch's ``MultiProcessTestCase`` (fresh ranks per test);
- torch's ``MultiProcContinuousTest`` (ranks kept for the class);

plus a bare 4-rank spawn (``torch.multiprocessing``, import torch, Gloo init,
one all_reduce, destroy) as the floor for a first test, and a file with a
test that hangs (one rank asleep until the timeout) between two passing ones,
whose whole cost should stay within the timeout plus two cold starts.  Every
suite runs in its own pytest process; the controller's wall time per test is
taken from ``pytest_runtest_logstart`` to ``pytest_runtest_logfinish``.  Then
the unique memory (USS) of idle warm ranks.  Prints figures and ratios.

Timings on a shared 2-core machine drift by tens of percent from one minute
to the next, so the warm suite, ``MultiProcContinuousTest`` and the bare spawn
run in several interleaved rounds; each ratio is taken within a round and the
median over rounds is the figure.

    python benchmarks/overhead.py [--tests 10] [--world-size 4] [--rounds 5] [--warm-only]

``--warm-only --tests 200``: the rounds alone, on a longer suite, whose median is the steady
cost of a warm test (ten tests give nine samples on a shared machine).  ``--baseline DIR``: the
warm suite also runs, in each round, on another copy of the package (DIR holds its
``pytest_ddp``, put first on the path), so that a change is measured against the tree before it
in the same conditions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMING_CONFTEST = '''
import json, os, time
_start = {}
_times = []
def pytest_runtest_logstart(nodeid, location):
    _start[nodeid] = time.perf_counter()
def pytest_runtest_logfinish(nodeid, location):
    _times.append(time.perf_counter() - _start[nodeid])
def pytest_sessionfinish(session):
    # The controller's session only: not a rank's (torchrun's RANK, or MPI's PMI_RANK).
    if os.environ.get("BENCH_OUT") and "RANK" not in os.environ and "PMI_RANK" not in os.environ:
        with open(os.environ["BENCH_OUT"], "w") as f:
            json.dump(_times, f)
'''

DDP_SUITE = '''
import pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size={ws})
@pytest.mark.parametrize("i", range({n}))
def test_all_reduce(i, rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == {ws}
'''

HANG_SUITE = '''
import time, pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size={ws})
def test_before():
    dist.all_reduce(torch.ones(1))

@pytest.mark.ddp(world_size={ws}, timeout={timeout})
def test_hangs(rank):
    if rank == 1:
        time.sleep(3600)  # the others wait in the all_reduce until the timeout
    dist.all_reduce(torch.ones(1))

@pytest.mark.ddp(world_size={ws})
def test_after():
    dist.all_reduce(torch.ones(1))
'''

MULTI_PROCESS_SUITE = '''
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

class TestAllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return {ws}

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _one(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == self.world_size
        dist.destroy_process_group()

{methods}
'''

CONTINUOUS_SUITE = '''
import torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest

class TestAllReduce(MultiProcContinuousTest):
    world_size = {ws}

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

    def _one(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == self.world_size

{methods}
'''

BARE_SPAWN = '''
import sys, tempfile, time
import torch.multiprocessing as mp

def work(rank, world_size, path):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", store=dist.FileStore(path, world_size), rank=rank, world_size=world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()

if __name__ == "__main__":
    world_size = int(sys.argv[1])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:  # FileStore removes its file when done
        mp.start_processes(work, args=(world_size, folder + "/store"), nprocs=world_size, start_method="spawn")
    print(time.perf_counter() - start)
'''


def methods(n: int) -> str:
    return "\n".join(f"    def test_{i:02d}(self):\n        self._one()\n" for i in range(n))


def run_suite(folder: Path, source: str, *args: str, failures: int = 0, package: str | None = None) -> list[float]:
    """Run one suite in a fresh pytest process; the controller's time per test.
    ``failures``: how many of its tests are meant to fail; ``package``: a folder whose
    ``pytest_ddp`` is imported instead of the installed one."""
    folder.mkdir()
    (folder / "conftest.py").write_text(TIMING_CONFTEST)
    (folder / "test_suite.py").write_text(source)
    out = folder / "times.json"
    env = dict(os.environ, BENCH_OUT=str(out))
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *args]
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if result.returncode != (1 if failures else 0) or (failures and f"{failures} failed" not in result.stdout):
        print(result.stdout[-3000:], result.stderr[-3000:])
        raise SystemExit(f"suite in {folder.name} failed")
    return json.loads(out.read_text())


def bare_spawn(folder: Path, world_size: int) -> float:
    folder.mkdir()
    script = folder / "bare_spawn.py"
    script.write_text(BARE_SPAWN)
    result = subprocess.run([sys.executable, str(script), str(world_size)], capture_output=True, text=True, check=True)
    return float(result.stdout.split()[-1])


def idle_rank_uss(world_size: int) -> tuple[float, float]:
    """(mean USS, mean RSS) in MB of the ranks of a warm group between tests."""
    from pytest_ddp.groups.group import GroupConfig, RankGroup

    with tempfile.TemporaryDirectory() as folder:
        test = Path(folder) / "test_idle.py"
        test.write_text(
            "import pytest, torch, torch.distributed as dist\n\n"
            f"@pytest.mark.ddp(world_size={world_size})\ndef test_idle():\n    dist.barrier()\n"
        )
        pytest_args = ["-q", "-p", "no:cacheprovider", str(test)]
        group = RankGroup(GroupConfig(world_size, "gloo", True, pg_timeout=600, pytest_args=pytest_args))
        group.start(deadline=time.monotonic() + 120)
        try:
            uss, rss = [], []
            for pid in group.pids():
                fields = {}
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        parts = line.split()
                        if len(parts) >= 2 and parts[1].isdigit():
                            fields[parts[0].rstrip(":")] = int(parts[1])
                uss.append((fields["Private_Clean"] + fields["Private_Dirty"]) / 1024)
                rss.append(fields["Rss"] / 1024)
        finally:
            group.stop()
    return statistics.mean(uss), statistics.mean(rss)


def summarize(times: list[float]) -> dict[str, float]:
    return {"first": times[0], "after_first": statistics.median(times[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=10)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hang-timeout", type=float, default=5.0, help="timeout of the hanging test")
    parser.add_argument(
        "--warm-only", action="store_true",
        help="only the rounds (warm, MultiProcContinuousTest, bare spawn): for a long suite, --tests 200",
    )
    parser.add_argument(
        "--baseline", metavar="DIR", help="a folder holding another pytest_ddp, whose warm suite runs in each round too"
    )
    options = parser.parse_args()
    n, ws = options.tests, options.world_size
    ddp_suite = DDP_SUITE.format(ws=ws, n=n)
    continuous_suite = CONTINUOUS_SUITE.format(ws=ws, methods=methods(n))
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r in range(options.rounds):
            rounds.append(
                {
                    "spawn": {"first": bare_spawn(root / f"spawn{r}", ws)},
                    "warm": summarize(run_suite(root / f"warm{r}", ddp_suite)),
                    "mpct": summarize(run_suite(root / f"mpct{r}", continuous_suite)),
                }
            )
            if options.baseline:
                baseline = run_suite(root / f"baseline{r}", ddp_suite, package=os.path.abspath(options.baseline))
                rounds[-1]["baseline"] = summarize(baseline)
        if not options.warm_only:
            isolated = summarize(run_suite(root / "isolated", ddp_suite, "--ddp-isolate"))
            hang_file = run_suite(root / "hang", HANG_SUITE.format(ws=ws, timeout=options.hang_timeout), failures=1)
            mptc = summarize(run_suite(root / "mptc", MULTI_PROCESS_SUITE.format(ws=ws, methods=methods(n))))

    def median(suite: str, figure: str) -> float:
        return statistics.median(r[suite][figure] for r in rounds)

    def ratios(a: str, fa: str, b: str, fb: str) -> list[float]:
        return [r[a][fa] / r[b][fb] for r in rounds]

    warm_vs_mpct = ratios("warm", "after_first", "mpct", "after_first")
    first_vs_spawn = ratios("warm", "first", "spawn", "first")
    print(f"\n{n} trivial tests on {ws} ranks (Gloo), {os.cpu_count()} cores; seconds per test in the controller")
    print(f"(median over {options.rounds} rounds where a suite ran in each round)")
    print(f"{'suite':26} {'first test':>11} {'median after first':>19}")
    rows = [
        ("pytest-ddp warm", median("warm", "first"), median("warm", "after_first")),
        ("MultiProcContinuousTest", median("mpct", "first"), median("mpct", "after_first")),
    ]
    if not options.warm_only:
        rows[1:1] = [
            ("pytest-ddp isolated", isolated["first"], isolated["after_first"]),
            ("MultiProcessTestCase", mptc["first"], mptc["after_first"]),
        ]
    if options.baseline:
        rows.append(("baseline warm", median("baseline", "first"), median("baseline", "after_first")))
    for name, first, after in rows:
        print(f"{name:26} {first:11.3f} {after:19.4f}")
    print(f"{'bare spawn + Gloo init':26} {median('spawn', 'first'):11.3f}")

    def each(values: list[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    print("\nratios (goal in brackets):")
    print(
        f"  warm per test / MultiProcContinuousTest per test: {statistics.median(warm_vs_mpct):.2f}  [<= 1]"
        f"  (rounds: {each(warm_vs_mpct)})"
    )
    if options.baseline:
        warm_vs_baseline = ratios("warm", "after_first", "baseline", "after_first")
        baseline_vs_mpct = ratios("baseline", "after_first", "mpct", "after_first")
        print(
            f"  warm per test / baseline warm per test:           {statistics.median(warm_vs_baseline):.2f}"
            f"  (rounds: {each(warm_vs_baseline)})"
        )
        print(
            f"  baseline warm / MultiProcContinuousTest:          {statistics.median(baseline_vs_mpct):.2f}"
            f"  (rounds: {each(baseline_vs_mpct)})"
        )
    if options.warm_only:
        return
    mptc_vs_warm = mptc["after_first"] / median("warm", "after_first")
    print(f"  MultiProcessTestCase per test / warm per test:    {mptc_vs_warm:.0f}x  [>= 500x]")
    print(
        f"  warm first test / bare spawn:                     {statistics.median(first_vs_spawn):.2f}  [<= 1.3]"
        f"  (rounds: {each(first_vs_spawn)})"
    )
    cold_start = median("warm", "first")
    hang_bound = options.hang_timeout + 2 * cold_start
    print(
        f"  a hang between two passing tests, whole file / (timeout + 2 cold starts): "
        f"{sum(hang_file):.2f} s / ({options.hang_timeout:.0f} + 2 x {cold_start:.2f}) s = "
        f"{sum(hang_file) / hang_bound:.2f}  [<= 1]  (per test: {each(hang_file)} s)"
    )
    print(f"  fresh group per test (isolated, after the first): {isolated['after_first']:.3f} s  [<= 1 s]")
    uss, rss = idle_rank_uss(ws)
    print(f"  idle rank memory: USS {uss:.0f} MB, RSS {rss:.0f} MB  [USS <= 100 MB]")


if __name__ == "__main__":
    main()

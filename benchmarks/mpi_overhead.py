"""What an MPI group costs, against bare MPI and against Gloo, measured in one run.

- **First test**: the controller's wall time of the first ``backend="mpi"`` test
  on 4 ranks (launcher, stand-ins, ranks that import torch and pytest, collect,
  ``MPI_Init``, the test), against a bare ``mpiexec -n 4 python -c "import torch;
  from mpi4py import MPI"`` (MPICH's hydra and its gforker, both timed to their
  exit).  Goal: at most 1.3x the bare run.
- **Warm test**: the median wall time of ten trivial 4-rank tests on one warm MPI
  world (an allreduce each), against the same tests on a warm Gloo group.  Goal:
  at most 2x.

The controller's wall time per test is taken from ``pytest_runtest_logstart`` to
``pytest_runtest_logfinish``.  Timings on a shared 2-core machine drift, so the
measures run in interleaved rounds; each ratio is taken within a round and the
median over rounds is the figure.

    python benchmarks/mpi_overhead.py [--rounds 3] [--tests 10]
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

from overhead import TIMING_CONFTEST  # this folder is on sys.path: the script's own

from pytest_ddp.groups.mpi_group import find_launcher, mpi_unavailable

WORLD_SIZE = 4


MPI_SUITE = """
import pytest

@pytest.mark.ddp(world_size={ws}, backend="mpi")
@pytest.mark.parametrize("i", range({n}))
def test_allreduce(i, comm):
    assert comm.allreduce(1) == {ws}
"""

GLOO_SUITE = """
import pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size={ws})
@pytest.mark.parametrize("i", range({n}))
def test_all_reduce(i):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == {ws}
"""


def _suite_times(folder: Path, name: str, body: str) -> list[float]:
    test_file = folder / f"test_{name}.py"
    test_file.write_text(body)
    out = folder / f"{name}.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        cwd=folder, env=dict(os.environ, BENCH_OUT=str(out)), check=True, stdout=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())


def _bare(launcher: list[str]) -> float:
    begin = time.perf_counter()
    subprocess.run(
        [*launcher, "-n", str(WORLD_SIZE), sys.executable, "-c", "import torch; from mpi4py import MPI"],
        check=True, env=dict(os.environ, UCX_NET_DEVICES="lo"),
    )
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tests", type=int, default=10)
    options = parser.parse_args()
    if (reason := mpi_unavailable(None)) is not None:
        sys.exit(reason)
    gforker = find_launcher(None)
    hydra = find_launcher(str(Path(sys.executable).parent / "mpiexec"))
    assert gforker is not None and hydra is not None
    rows: dict[str, list[float]] = {k: [] for k in ("bare_hydra", "bare_gforker", "first", "warm_mpi", "warm_gloo")}
    first_ratios, warm_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "conftest.py").write_text(TIMING_CONFTEST)
        for _ in range(options.rounds):
            bare_hydra, bare_gforker = _bare(hydra), _bare(gforker)
            mpi = _suite_times(folder, "mpi", MPI_SUITE.format(ws=WORLD_SIZE, n=options.tests))
            gloo = _suite_times(folder, "gloo", GLOO_SUITE.format(ws=WORLD_SIZE, n=options.tests))
            warm_mpi, warm_gloo = statistics.median(mpi[1:]), statistics.median(gloo[1:])
            for key, value in zip(rows, (bare_hydra, bare_gforker, mpi[0], warm_mpi, warm_gloo)):
                rows[key].append(value)
            first_ratios.append(mpi[0] / min(bare_hydra, bare_gforker))
            warm_ratios.append(warm_mpi / warm_gloo)
    median = {key: statistics.median(values) for key, values in rows.items()}
    print(f"MPI groups, {WORLD_SIZE} ranks, {options.rounds} rounds (medians)")
    print(f"  bare mpiexec (hydra)  import torch + mpi4py: {median['bare_hydra'] * 1000:7.0f} ms")
    print(f"  bare mpiexec.gforker  import torch + mpi4py: {median['bare_gforker'] * 1000:7.0f} ms")
    print(f"  pytest-ddp first MPI test (cold world):       {median['first'] * 1000:7.0f} ms")
    print(f"    ratio to the faster bare run: {statistics.median(first_ratios):.2f}x (goal <= 1.3x)")
    print(f"  pytest-ddp warm MPI test:                     {median['warm_mpi'] * 1000:7.1f} ms")
    print(f"  pytest-ddp warm Gloo test:                    {median['warm_gloo'] * 1000:7.1f} ms")
    print(f"    ratio MPI / Gloo: {statistics.median(warm_ratios):.2f}x (goal <= 2x)")


if __name__ == "__main__":
    main()

"""What launched mode costs, against bare ``torchrun -m pytest`` without the plugin, in one run.

The same tests (4 ranks; each one DDP training step of a small model, or a
trivial all_reduce) run two ways, each in a network namespace of its own
(torchrun's store listens on every interface):

- **bare**: ``torchrun --standalone --nproc-per-node=4 -m pytest -p no:ddp``, a
  session fixture that joins the process group, every test run by every rank;
- **plugin**: the same command without ``-p no:ddp``, the tests marked
  ``@pytest.mark.ddp(world_size=4)``: launched mode.

**Per-test cost** is the difference between a session of ``--many`` tests and
one of ``--few``, divided by the difference in tests: the session's start (torch
imports, rendezvous) drops out.  Goal: plugin at most 1.2x bare.  Sessions drift
on a shared 2-core machine, so they run in interleaved rounds; each ratio is
taken within a round and the median over rounds is the figure.

Then a **two-node hang**: torchrun --nnodes=2 in two network namespaces, rank 3
skips an all_reduce; how long into the test the report diagnosed it (its headline's
``[ddp deadlock, partial, N s]``) is printed.

    python benchmarks/launched_overhead.py [--rounds 3] [--few 5] [--many 45] [--body ddp|trivial]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from launchers.nodes import TORCHRUN, TwoNodes, isolated_node_command, namespaces_unavailable  # noqa: E402

BODIES = {
    # One DDP step of a small MLP: what a distributed unit test typically does.
    "ddp": """
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(32, 256)).sum().backward()
        opt.step()
""",
    "trivial": """
    t = torch.ones(1)
    dist.all_reduce(t)
""",
}

BARE = """
import os, pytest, torch, torch.distributed as dist

@pytest.fixture(scope="session", autouse=True)
def group():
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()

@pytest.mark.parametrize("i", range({n}))
def test_step(i):
{body}
"""

PLUGIN = """
import pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size=4)
@pytest.mark.parametrize("i", range({n}))
def test_step(i):
{body}
"""

HANG = """
import pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size=4)
def test_hang(rank):
    if rank != 3:
        dist.all_reduce(torch.ones(1))
"""


def _session(folder: Path, source: str, bare: bool) -> float:
    (folder / "test_bench.py").write_text(source)
    command = [TORCHRUN, "--standalone", "--nproc-per-node=4", "--no-python", sys.executable,
               "-m", "pytest", "-q", "-p", "no:cacheprovider", *(["-p", "no:ddp"] if bare else [])]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(isolated_node_command(command), cwd=folder, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"session failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return elapsed


def per_test(rounds: int, few: int, many: int, body: str) -> None:
    indented = BODIES[body]
    ratios, costs = [], {"bare": [], "plugin": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for _ in range(rounds):
            round_costs = {}
            for name, template, bare in (("bare", BARE, True), ("plugin", PLUGIN, False)):
                small = _session(folder, template.format(n=few, body=indented), bare)
                large = _session(folder, template.format(n=many, body=indented), bare)
                round_costs[name] = (large - small) / (many - few)
                costs[name].append(round_costs[name])
                print(f"  {name:6s} {few} tests {small:6.2f} s, {many} tests {large:6.2f} s, "
                      f"per test {round_costs[name] * 1000:6.1f} ms", flush=True)  # fmt: skip
            ratios.append(round_costs["plugin"] / round_costs["bare"])
    print(f"per-test cost, body {body!r}: bare {statistics.median(costs['bare']) * 1000:.1f} ms, "
          f"plugin {statistics.median(costs['plugin']) * 1000:.1f} ms: "
          f"{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)}; goal 1.2x)")


def two_node_hang() -> None:
    with tempfile.TemporaryDirectory() as tmp, TwoNodes() as nodes:
        folder = Path(tmp)
        (folder / "test_hang.py").write_text(HANG)
        pytest_command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        agents = nodes.torchrun(pytest_command, folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = agents[0].communicate(timeout=240)[0]
        agents[1].communicate(timeout=240)
    found = re.search(r"\[ddp deadlock, \w+, ([0-9.]+) s\]", output)
    said = f"diagnosed {found.group(1)} s into the test" if found else "NOT DIAGNOSED"
    print(f"two nodes, rank 3 skips all_reduce #1: {said}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--few", type=int, default=5)
    parser.add_argument("--many", type=int, default=45)
    parser.add_argument("--body", choices=sorted(BODIES), action="append")
    args = parser.parse_args()
    if (why := namespaces_unavailable()) is not None:
        raise SystemExit(f"cannot run: {why}")
    for body in args.body or ["ddp", "trivial"]:
        per_test(args.rounds, args.few, args.many, body)
    two_node_hang()


if __name__ == "__main__":
    main()

"""The chaos gate (issue 45): many small ddp tests under ``pytest -n 4``, each with a fault drawn at
random, and per test the outcome its fault implies; then nothing left behind.

Not part of the test suite.  Inner pytest sessions, one after the other, run generated files of
``--per-session`` tests each, ``--tests`` in all (world size 2, every fifth or so 4), each drawn
from a seeded RNG as one of :data:`KINDS`: no fault, a slow rank (both must pass), a rank killed,
stopped (SIGSTOP to itself), raising, exiting (``os._exit``, ``sys.exit``), hanging outside any
collective (the plugin's ``faults.hang``, or ``time.sleep``), hanging in its fixture's teardown, or
sending SIGTERM to its xdist worker.  The plugin's own faults (:mod:`pytest_ddp.faults`) are used
where they express the fault, plain code otherwise.  Each test:

- its outcome in junitxml: passed for no fault and a slow rank; else failed, never a pass (an error
  for the hang in teardown, and for a SIGTERM'd worker's test, as xdist reports a crashed worker);
- its report in ``--ddp-report-dir`` (JSON, trace, HTML), with the verdict kind its fault implies
  (``rank_exited`` for a death or a raise, ``timeout`` for a stop or a hang) and the culprit rank alone;
- its duration in junitxml within ``--timeout`` + 2 s.

After each session: no process of it left (killed if found), no listening socket on a port its groups
used, no ``/tmp/pymp-*`` folder, no new ``/dev/shm`` entry, nothing in the run's TMPDIR but pytest's
basetemp (what benchmarks/torture.py lists, reused from there); and no two rank groups on one store
port at once (each rank logs its ``MASTER_PORT`` and group id, ``TORCHELASTIC_RUN_ID``, per test: two
groups whose tests on one port overlap in time are a clash).  Prints the counts per fault kind and
exits 1 on any wrong, missing or falsely passing test or anything left.

    python benchmarks/chaos.py [--tests 5000] [--per-session 250] [--seed 1] [--workers 4] [--timeout 2]
                               [--keep]
    python benchmarks/chaos.py --tests 0 --teardown [--runs 3]

``--teardown`` also measures an 8-rank group's teardown after a hang (in a pytest of its own, after
the chaos run; ``--tests 0``: alone): the time from the verdict (the report's ``ended``) to the last of
its 8 rank processes gone, polled from here; the issue wants at most 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.torture import MARK, RUN_ID, Census, processes  # noqa: E402
from pytest_ddp.report.writable import file_name  # noqa: E402

SLOW = 0.3  # seconds the slow rank sleeps before its all_reduce
TEST_FILE = "test_chaos.py"
SETTLE = 10.0  # seconds the run's processes get to end after it, before they count as left


@dataclass(frozen=True)
class Kind:
    """A fault a test is drawn with: how its culprit rank commits it, and what must come of it."""

    weight: int
    outcome: str  # the test's outcome in junitxml: passed, failed or error
    verdict: str | None  # the kind of the report's verdict; None: no report is due
    fault: str = ""  # the mark's fault ({rank}: the culprit), fired at its first all_reduce
    code: str = ""  # what the culprit does after the first barrier, before its all_reduce
    teardown: bool = False  # the culprit hangs in the teardown of the chaos fixture


KINDS: dict[str, Kind] = {
    "none": Kind(30, "passed", None),
    "slow": Kind(10, "passed", None, fault=f"faults.delay(rank={{rank}}, at='all_reduce', seconds={SLOW})"),
    "kill": Kind(8, "failed", "rank_exited", fault="faults.kill(rank={rank}, at='all_reduce')"),
    "stop": Kind(5, "failed", "timeout", code="os.kill(os.getpid(), signal.SIGSTOP)"),
    "raise": Kind(8, "failed", "rank_exited", fault="faults.raise_(rank={rank}, at='all_reduce')"),
    "exit": Kind(7, "failed", "rank_exited", fault="faults.exit(rank={rank}, at='all_reduce', code=3)"),
    "sys_exit": Kind(6, "failed", "rank_exited", code="sys.exit(3)"),
    "hang": Kind(5, "failed", "timeout", fault="faults.hang(rank={rank}, at='all_reduce')"),
    "sleep": Kind(5, "failed", "timeout", code="time.sleep(3600)"),
    "teardown_hang": Kind(5, "error", "timeout", teardown=True),
    # xdist reports the worker crashed (an error "failed on setup with worker 'gw1' crashed while
    # running ..."), and starts another; the ranks die with the worker.
    "xdist_sigterm": Kind(3, "error", None, code="os.kill(xdist_worker(), signal.SIGTERM)"),
}
FOUR_RANKS = 0.2  # the share of tests with 4 ranks


@dataclass(frozen=True)
class Case:
    """One generated test."""

    index: int
    kind: str
    world_size: int
    rank: int  # the culprit (the slow rank; any rank where there is no fault)

    @property
    def name(self) -> str:
        return f"test_{self.index:05d}_{self.kind}"


def plan(tests: int, seed: int) -> list[Case]:
    """``tests`` cases drawn from ``seed``: each a kind by KINDS' weights, a world size, a culprit."""
    rng = random.Random(seed)
    names, weights = list(KINDS), [kind.weight for kind in KINDS.values()]
    cases = []
    for index in range(tests):
        kind = rng.choices(names, weights)[0]
        world_size = 4 if rng.random() < FOUR_RANKS else 2
        cases.append(Case(index, kind, world_size, rng.randrange(world_size)))
    return cases


# -- the generated test file -----------------------------------------------------------------------

CONFTEST = '''
import json, os, time, pytest

def pytest_configure(config):
    config.addinivalue_line("markers", "chaos_teardown_hang(rank): that rank hangs in chaos's teardown")

@pytest.fixture
def chaos(request, rank):
    """Log this rank's test, pid, group and store port; hang in teardown where the mark says so."""
    line = {"test": request.node.name, "rank": rank, "pid": os.getpid(), "port": os.environ["MASTER_PORT"],
            "group": os.environ["TORCHELASTIC_RUN_ID"], "time": time.time()}
    with open(os.environ["CHAOS_LOG"], "a") as f:
        f.write(json.dumps(line) + "\\n")
    yield
    mark = request.node.get_closest_marker("chaos_teardown_hang")
    if mark is not None and mark.args[0] == rank:
        time.sleep(3600)
'''

HEADER = '''import os, signal, sys, time
import pytest, torch, torch.distributed as dist
from pytest_ddp import faults


def xdist_worker():
    """The xdist worker whose session runs this rank: the first process above it not the forkserver."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        raise RuntimeError("not under xdist")
    pid = os.getppid()
    while b"forkserver" in open(f"/proc/{pid}/cmdline", "rb").read():
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    return pid
'''


def test_source(case: Case) -> str:
    """The test function of ``case``."""
    kind = KINDS[case.kind]
    mark = f"@pytest.mark.ddp(world_size={case.world_size}"
    mark += f", faults=[{kind.fault.format(rank=case.rank)}])\n" if kind.fault else ")\n"
    if kind.teardown:
        mark += f"@pytest.mark.chaos_teardown_hang({case.rank})\n"
    code = f"    if rank == {case.rank}:\n        {kind.code}\n" if kind.code else ""
    return (
        f"\n\n{mark}def {case.name}(rank, chaos):\n    dist.barrier()\n{code}"
        f"    t = torch.ones(1)\n    dist.all_reduce(t)\n    assert t.item() == {case.world_size}\n"
    )


def file_source(cases: list[Case]) -> str:
    return HEADER + "".join(test_source(case) for case in cases)


# -- judging one test -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """A test's outcome in junitxml (passed, failed, error, skipped), its seconds and its message."""

    outcome: str
    seconds: float
    message: str = ""


def judge(
    case: Case, result: Result | None, report: dict[str, Any] | None, timeout: float
) -> tuple[str, str]:
    """(right, wrong, false pass or missing; why): ``report`` is the test's JSON report, or None
    where none was written (or one of its files is missing)."""
    kind = KINDS[case.kind]
    if result is None:
        return "missing", "no result in junitxml"
    if result.outcome == "passed" and kind.outcome != "passed":
        return "false pass", f"passed, where {kind.outcome} was due"
    if result.outcome != kind.outcome:
        return "wrong", f"{result.outcome} where {kind.outcome} was due: {result.message[:300]}"
    if result.seconds > timeout + 2:
        return "wrong", f"took {result.seconds:.2f} s, over its timeout {timeout:g} s + 2 s"
    if case.kind == "xdist_sigterm" and "crashed" not in result.message:
        return "wrong", f"not reported as a crashed worker: {result.message[:300]}"
    if kind.verdict is None:
        return "right", ""
    if report is None:
        return "missing", "no report (JSON, trace and HTML) in --ddp-report-dir"
    if report.get("kind") != kind.verdict or report.get("culprits") != [case.rank]:
        got = f"{report.get('kind')} naming {report.get('culprits')}"
        due = f"{kind.verdict} naming [{case.rank}]"
        return "wrong", f"verdict {got}, where {due} was due: {report.get('summary')}"
    return "right", ""


def junit_results(path: Path) -> dict[str, Result]:
    """Each test's result; a test named twice (an extra teardown error) keeps the worse outcome."""
    results: dict[str, Result] = {}
    if not path.exists():
        return results
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    for element in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("skipped", "failure", "error"):
            found = element.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = found.get("message") or ""
        name = element.get("name", "")
        seconds = float(element.get("time") or 0.0)
        before = results.get(name)
        if before is None or rank[outcome] > rank[before.outcome]:
            results[name] = Result(outcome, seconds + (before.seconds if before else 0.0), message)
    return results


def read_report(folder: Path, case: Case) -> dict[str, Any] | None:
    """The test's JSON report, if it and its trace and HTML page were written."""
    stem = folder / file_name(f"{TEST_FILE}::{case.name}")
    paths = [stem.with_name(stem.name + suffix) for suffix in (".json", ".trace.json", ".html")]
    if not all(path.exists() for path in paths):
        return None
    data: dict[str, Any] = json.loads(paths[0].read_text())
    return data


# -- what the run left, and its ports --------------------------------------------------------------


def port_clashes(log: list[dict[str, Any]]) -> list[str]:
    """Two groups whose tests on one store port overlap in time (each group's span on a port: from
    its first test's start there to its last's)."""
    spans: dict[tuple[str, str], list[float]] = {}
    for line in log:
        span = spans.setdefault((line["port"], line["group"]), [line["time"], line["time"]])
        span[0], span[1] = min(span[0], line["time"]), max(span[1], line["time"])
    clashes = []
    by_port: dict[str, list[tuple[float, float, str]]] = {}
    for (port, group), (first, last) in spans.items():
        by_port.setdefault(port, []).append((first, last, group))
    for port, groups in by_port.items():
        groups.sort()
        latest = groups[0]  # of the groups so far, the one whose span ends last
        for first, last, group in groups[1:]:
            if first <= latest[1]:
                clashes.append(f"port {port}: groups {latest[2]} and {group} at once")
            latest = max(latest, (first, last, group), key=lambda span: span[1])
    return clashes


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 3 and cols[3] == "0A":  # LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def zombies(census: Census) -> list[str]:
    """Dead ranks or keepers the run made that nobody reaped (the census leaves out zombies it cannot
    tell as the run's; here PID 1 reaps the orphans it inherits, a second or so late)."""
    return [
        f"zombie {pid} {p['name']!r} (parent {p['ppid']})" for pid, p in processes().items()
        if p["state"] == "Z" and p["name"].startswith("ddp-") and (pid, p["start"]) not in census.before
    ]


def leftovers(
    census: Census, tmpdir: Path, shm_before: set[str], log: list[dict[str, Any]], kinds: dict[str, str]
) -> dict[str, list[str]]:
    """What the run left, by the kind (``kinds``: test name -> kind) of the test whose rank it was
    ('' for the run), then killed and removed (census.check prints it)."""
    end = time.monotonic() + SETTLE
    while (census.suspects()[0] or zombies(census)) and time.monotonic() < end:
        time.sleep(0.2)
    kind_of = {line["pid"]: kinds.get(line["test"], "") for line in log}
    found: dict[str, list[str]] = {"": []}
    for pid, p in census.suspects()[0]:
        line = f"process {pid} {p['name']!r}: {p['cmdline'][:120]}"
        found.setdefault(kind_of.get(pid, ""), []).append(line)
    found[""] += zombies(census)
    used = {int(line["port"]) for line in log}
    found[""] += [f"listening port {port}" for port in sorted(used & listening_ports())]
    found[""] += [f"/dev/shm/{name}" for name in sorted(set(os.listdir("/dev/shm")) - shm_before)]
    found[""] += [f"{entry}" for entry in sorted(tmpdir.iterdir()) if not entry.name.startswith("pytest-of-")]
    if not census.check("chaos", {"chaos": (tmpdir, False)}, settle=0):
        found[""].append("(census: see its list above)")
    return {kind: items for kind, items in found.items() if items}


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the runs ----------------------------------------------------------------------------------


def inner_pytest(root: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TMPDIR=str(root / "tmp"), CHAOS_LOG=str(log), PYTHONUNBUFFERED="1")
    env[MARK] = RUN_ID
    (root / "tmp").mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args]
    with open(root / "pytest.log", "ab") as out:
        return subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def ended(proc: subprocess.Popen[bytes], limit: float) -> bool:
    """Whether the inner pytest ended within ``limit`` s; else it is interrupted as Ctrl-C does (its
    junitxml keeps the tests run so far), and killed 60 s later if still there."""
    try:
        proc.wait(timeout=limit)
        return True
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return False


def chaos(args: argparse.Namespace, root: Path) -> bool:
    """The run: the cases drawn, in pytest sessions of ``--per-session`` tests each, one after the
    other (a worker xdist starts again after a SIGTERM collects its whole session: in one session
    of 5,000 tests, those collections left 150 tests run in 23 minutes)."""
    root.mkdir()
    cases = plan(args.tests, args.seed)
    sessions = [cases[i : i + args.per_session] for i in range(0, len(cases), args.per_session)]
    print(f"== chaos: {args.tests} tests, seed {args.seed}, -n {args.workers}, timeout {args.timeout:g} s, "
          f"{len(sessions)} sessions", flush=True)
    counts: dict[str, dict[str, int]] = {kind: dict.fromkeys(COLUMNS, 0) for kind in KINDS}
    deadline, start, ok, run_leftovers = time.monotonic() + args.limit, time.monotonic(), True, 0
    for number, chunk in enumerate(sessions):
        left_for_it = deadline - time.monotonic()
        session_ok, left = session(args, root / f"session{number}", chunk, counts, left_for_it)
        ok &= session_ok
        run_leftovers += left
    wall = time.monotonic() - start
    done = len(cases) - sum(row["not run"] for row in counts.values())
    print(f"  all: {wall:.1f} s, {done / wall:.2f} tests/s, {done} tests run in {len(sessions)} sessions")
    print(table(counts, run_leftovers))
    return ok


def session(
    args: argparse.Namespace, root: Path, cases: list[Case], counts: dict[str, dict[str, int]], limit: float
) -> tuple[bool, int]:
    """One pytest session of these cases, judged into ``counts``: whether all went right, and what
    the session left that no test's kind owns."""
    root.mkdir()
    (root / "conftest.py").write_text(CONFTEST)
    (root / TEST_FILE).write_text(file_source(cases))
    census, shm_before = Census(root), set(os.listdir("/dev/shm"))
    log, reports, junit = root / "chaos.jsonl", root / "reports", root / "junit.xml"
    restarts = sum(case.kind == "xdist_sigterm" for case in cases) + args.workers
    start = time.monotonic()
    proc = inner_pytest(root, [
        "-n", str(args.workers), f"--max-worker-restart={restarts}", f"--ddp-timeout={args.timeout}",
        f"--ddp-report-dir={reports}", f"--junitxml={junit}", TEST_FILE,
    ], log)  # fmt: skip
    cut = not ended(proc, max(limit, 0))
    wall = time.monotonic() - start
    results, lines = junit_results(junit), read_log(log)
    wrong: list[tuple[Case, str, str]] = []
    for case in cases:
        status, why = judge(case, results.get(case.name), read_report(reports, case), args.timeout)
        if cut and case.name not in results:
            status = "not run"  # after the run was cut at --limit
        counts[case.kind]["tests"] += 1
        counts[case.kind][status] += 1
        if status not in ("right", "not run"):
            wrong.append((case, status, why))
    left = leftovers(census, root / "tmp", shm_before, lines, {case.name: case.kind for case in cases})
    for kind, items in left.items():
        if kind in counts:
            counts[kind]["leftovers"] += len(items)
    clashes = port_clashes(lines)
    done = len(cases) - sum(case.name not in results for case in cases) if cut else len(cases)
    cut_note = f"; CUT at --limit {args.limit:g} s, {done} tests run" if cut else ""
    print(f"  {root.name}: {len(cases)} tests, {wall:.1f} s, {done / wall:.2f} tests/s, "
          f"pytest exit {proc.returncode}{cut_note}", flush=True)
    for case, status, why in wrong[:20]:
        print(f"\n  {status}: {case.name} (world size {case.world_size}, culprit {case.rank}): {why}")
        print("    " + test_source(case).strip().replace("\n", "\n    "))
    for kind, items in left.items():
        print(f"  left behind ({kind or 'the run'}): " + "; ".join(items[:10]))
    for clash in clashes:
        print(f"  {clash}")
    if not clashes:
        ports = len({line['port'] for line in lines})
        groups = len({line['group'] for line in lines})
        print(f"    store ports: {ports} ports for {groups} groups, no two groups on one port at once")
    ok = not (wrong or left or clashes or cut or proc.returncode not in (0, 1))
    return ok, len(left.get("", []))


COLUMNS = ("tests", "right", "wrong", "false pass", "missing", "leftovers", "not run")


def table(counts: dict[str, dict[str, int]], run_leftovers: int) -> str:
    total = {column: sum(row[column] for row in counts.values()) for column in COLUMNS}
    total["leftovers"] += run_leftovers
    rows = [("kind", *COLUMNS)] + [(kind, *map(str, row.values())) for kind, row in counts.items()]
    rows.append(("all", *map(str, total.values())))
    return "\n".join("  " + row[0].ljust(14) + "".join(cell.rjust(11) for cell in row[1:]) for row in rows)


TEARDOWN_TEST = '''
import pytest, torch, torch.distributed as dist
from pytest_ddp import faults

@pytest.mark.ddp(world_size=8, faults=[faults.hang(rank=0, at="all_reduce")])
@pytest.mark.parametrize("run", range({runs}))
def test_hang(rank, chaos, run):
    t = torch.ones(1)
    dist.all_reduce(t)
'''


def dead(pid: int) -> bool:
    """Gone, or a zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def teardown(args: argparse.Namespace, root: Path) -> bool:
    """Each run's time from the verdict to the last of its 8 ranks gone; at most 2 s each."""
    root.mkdir()
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_teardown.py").write_text(TEARDOWN_TEST.format(runs=args.runs))
    census, shm_before = Census(root), set(os.listdir("/dev/shm"))
    log, reports = root / "chaos.jsonl", root / "reports"
    print(f"== teardown: {args.runs} tests of 8 ranks, rank 0 hangs, timeout {args.timeout:g} s", flush=True)
    proc = inner_pytest(root, [f"--ddp-timeout={args.timeout}", f"--ddp-report-dir={reports}",
                               "test_teardown.py"], log)
    gone: dict[str, float] = {}
    deadline = time.monotonic() + 60 * args.runs
    while proc.poll() is None and time.monotonic() < deadline:
        pids: dict[str, list[int]] = {}
        for line in read_log(log):
            pids.setdefault(line["test"], []).append(line["pid"])
        for test, ranks in pids.items():
            if test not in gone and len(ranks) == 8 and all(map(dead, ranks)):
                gone[test] = time.time()
        time.sleep(0.005)
    ended(proc, 0)
    figures = []
    for path in sorted(reports.glob("*.json")) if reports.exists() else []:
        if path.name.endswith(".trace.json"):
            continue
        data = json.loads(path.read_text())
        test = data["test"].split("::")[-1]
        if test in gone:
            figures.append(gone[test] - data["ended"])
            print(f"  {test}: verdict {data['kind']} after {data['elapsed']:.2f} s; "
                  f"8 ranks gone {figures[-1]:.3f} s after it")
    left = leftovers(census, root / "tmp", shm_before, read_log(log), {})
    ok = len(figures) == args.runs and max(figures) <= 2.0 and not left
    worst = max(figures, default=float("nan"))
    print(f"  teardown: max {worst:.3f} s of {len(figures)} runs (at most 2 s due)"
          + ("" if not left else f"; left behind: {left}"))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=5000, help="tests in the generated file (default 5000)")
    parser.add_argument("--seed", type=int, default=1, help="the RNG seed of the faults drawn (default 1)")
    parser.add_argument(
        "--per-session", type=int, default=250, help="tests in each pytest session of the run (default 250)"
    )
    parser.add_argument("--workers", type=int, default=4, help="xdist workers (default 4)")
    parser.add_argument("--timeout", type=float, default=2.0, help="--ddp-timeout, seconds (default 2)")
    parser.add_argument(
        "--limit", type=float, default=3600.0, help="seconds the chaos run may take (default 3600)"
    )
    parser.add_argument("--teardown", action="store_true", help="also measure an 8-rank group's teardown")
    parser.add_argument("--runs", type=int, default=3, help="--teardown: 8-rank tests that hang (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its tests and logs)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddp-chaos-"))
    ok = True
    try:
        if args.tests:
            ok &= chaos(args, root / "chaos")
        if args.teardown:
            ok &= teardown(args, root / "teardown")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("chaos: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

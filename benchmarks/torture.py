"""Torture run: the hostile run of issue "Nothing lost at the edges", and what it left behind.

Not part of the test suite (``make torture``). Each part runs an inner pytest
as a subprocess on a generated test file in a temporary directory, with a
TMPDIR of its own under it, then lists what the run left behind:

1. ``many``: ``--tests`` trivial tests (ddp world size 2, every 10th world
   size 4, every 5th a plain test) under ``pytest -n 4``, ``--rounds`` times;
2. ``output``: one 2-rank test whose ranks write ``--megabytes`` MB in all
   to fds 1 and 2; the run must not stall and each captured section must
   arrive whole (its size and its last line, from the controller's reports);
3. ``faults``: one ddp test per process fault (SIGKILL of a rank,
   ``os.abort()``, ``os._exit(3)``, ``raise SystemExit(2)``, fds 1 and 2
   closed, a segfault, a forked child left alive, a thread left running),
   each followed by a plain 2-rank test that must pass;
4. ``signals``: the controller killed by SIGINT, SIGTERM and SIGKILL while a
   ddp test runs (once its ranks exist);
5. ``limits``: three ddp tests (2, 4 and 2 ranks) under ``ulimit -n 64``, each
   passing or an error saying "Too many open files", never a stall or an
   INTERNALERROR; and one 32-rank test, passing or refused saying why.

After each part and at the end it lists the processes the run started that
are still alive (named ``ddp-rank*``/``ddp-keeper*``, or with ``pytest_ddp``
in their command line, or carrying this run's marker in their environment),
the ``/tmp/pymp-*`` folders it created, and the listening TCP sockets of its
processes; prints "left behind: nothing" or the list, kills what it listed
and exits 1 if anything was left. multiprocessing's ``pymp-*`` folder that a
controller killed without cleaning up leaves in its own TMPDIR is counted
apart (documented in docs/design.md, "Known limits") and does not fail the run.

    python benchmarks/torture.py [--tests 200] [--rounds 3] [--megabytes 200]

With the defaults (the issue's numbers: 200 tests, 3 rounds, 200 MB) the
whole run takes about 70 s on the 2-core development machine
(docs/benchmarks.md has the figures); ``--limit`` (300 s) bounds each inner
run, past which it counts as stalled.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

MARK = "PYTEST_DDP_TORTURE"

# Written in the inner run's folder: the controller's reports, one JSON line
# each (outcome and the size and tail of every captured section).
CONFTEST = """
import json, os

def pytest_runtest_logreport(report):
    path = os.environ.get("TORTURE_REPORTS")
    with open("/proc/self/comm") as f:
        in_rank = f.read().startswith("ddp-")
    if not path or in_rank or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    sections = {name: [len(text), text[-40:]] for name, text in report.sections}
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                            "sections": sections, "message": str(report.longrepr or "")[:2000]}) + "\\n")
"""

MANY_HEADER = "import pytest, torch, torch.distributed as dist\n"

MANY_DDP = """
@pytest.mark.ddp(world_size={ws})
def test_ddp_{i}(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == {ws}
"""

MANY_PLAIN = """
def test_plain_{i}():
    assert sum(range({i})) == {i} * ({i} - 1) // 2
"""

OUTPUT_TEST = """
import os, pytest, torch.distributed as dist

LINE = b"x" * 1023 + b"\\n"
CHUNK = LINE * 1024  # 1 MiB

@pytest.mark.ddp(world_size=2, timeout=600)
def test_output(rank):
    for fd, name in ((1, "stdout"), (2, "stderr")):
        for _ in range({chunks}):
            view = memoryview(CHUNK)
            while view:
                view = view[os.write(fd, view):]
        os.write(fd, f"END rank {{rank}} {{name}}\\n".encode())
    dist.barrier()
"""

FAULTS = {
    "sigkill": "os.kill(os.getpid(), signal.SIGKILL)",
    "abort": "os.abort()",
    "os_exit": "os._exit(3)",
    "system_exit": "raise SystemExit(2)",
    "close_fds": "os.close(1)\n        os.close(2)\n        print('after close', flush=True)",
    "segfault": "ctypes.string_at(0)",
    "forked_child": "pid = os.fork()\n        if pid == 0:\n            time.sleep(600)\n            os._exit(0)",
    "thread_left": "threading.Thread(target=time.sleep, args=(600,), daemon=True, name='left').start()",
}
# What pytest is to report for each fault's test: "failed" (call failed),
# "error" (teardown failed), or "passed+warning" (passed, with the plugin's
# LeftoverProcessWarning).
EXPECTED = {name: "failed" for name in FAULTS}
EXPECTED["forked_child"] = "passed+warning"
EXPECTED["thread_left"] = "error"

FAULTS_HEADER = "import ctypes, os, signal, threading, time, pytest, torch, torch.distributed as dist\n"
FAULT_TEST = """
@pytest.mark.ddp(world_size=2)
def test_{name}(rank):
    dist.barrier()
    if rank == 1:
        {body}
    dist.barrier()

@pytest.mark.ddp(world_size=2)
def test_after_{name}(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
"""

HANG_TEST = """
import time, pytest

@pytest.mark.ddp(world_size=2, timeout=600)
def test_hang(rank):
    time.sleep(3600)
"""


# -- processes, folders, sockets ------------------------------------------------


def _read(path: str, mode: str = "r") -> str | bytes | None:
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def processes() -> dict[int, dict]:
    """Every process we can see: pid -> name, start time, command line, cwd, whether it carries our marker."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        cmdline = (
            (_read(f"/proc/{pid}/cmdline", "rb") or b"")
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
        environ = _read(f"/proc/{pid}/environ", "rb") or b""
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        out[pid] = {
            "name": name,
            "start": fields[19],
            "state": fields[0],
            "ppid": int(fields[1]),
            "cmdline": cmdline,
            "cwd": cwd,
            "marked": f"{MARK}={RUN_ID}".encode() in environ,
        }
    return out


def listening_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A":  # LISTEN
                inodes.add(cols[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


class Census:
    """What existed before the run, to tell what the run left."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.before = {(pid, p["start"]) for pid, p in processes().items()}
        self.pymp_before = set(Path("/tmp").glob("pymp-*"))
        self.own = {os.getpid()}

    def ours(self, pid: int, p: dict) -> bool:
        return (
            p["marked"] or p["cwd"] == self.root or p["cwd"].startswith(self.root + "/")
        )

    def suspects(self) -> tuple[list[tuple[int, dict]], list[tuple[int, dict]]]:
        """(processes the run left, new ddp-looking processes that are not provably ours)."""
        left, foreign = [], []
        for pid, p in processes().items():
            if (
                pid in self.own
                or (pid, p["start"]) in self.before
                or (p["state"] == "Z"
                and not self.ours(pid, p))
            ):
                continue
            looks = (
                p["name"].startswith(("ddp-rank", "ddp-keeper"))
                or "pytest_ddp" in p["cmdline"]
            )
            if self.ours(pid, p):
                left.append((pid, p))
            elif looks:
                foreign.append((pid, p))
        return left, foreign

    def check(
        self, part: str, tmpdirs: dict[str, tuple[Path, bool]], settle: float = 10.0
    ) -> bool:
        """Print what the run left; kill it. True if nothing was left (documented pymp folders aside)."""
        end = time.monotonic() + settle
        while True:
            left, foreign = self.suspects()
            if not left or time.monotonic() > end:
                break
            time.sleep(0.2)
        listening = listening_inodes()
        sockets = [
            (pid, inode) for pid, _ in left for inode in socket_inodes(pid) & listening
        ]
        pymp = sorted(set(Path("/tmp").glob("pymp-*")) - self.pymp_before)
        documented, undocumented = [], []
        for label, (tmpdir, may_leave) in tmpdirs.items():
            for folder in sorted(tmpdir.glob("pymp-*")):
                (documented if may_leave else undocumented).append(
                    f"{folder} ({label})"
                )
        problems = (
            [
                f"process {pid} {p['name']!r} state {p['state']} cwd {p['cwd']}: {p['cmdline'][:160]}"
                for pid, p in left
            ]
            + [
                f"listening TCP socket inode {inode} of pid {pid}"
                for pid, inode in sockets
            ]
            + [f"folder {folder}" for folder in pymp]
            + [f"folder {folder}" for folder in undocumented]
        )
        if problems:
            print(f"  [{part}] left behind:")
            for line in problems:
                print(f"    - {line}")
        else:
            print(f"  [{part}] left behind: nothing")
        if documented:
            print(
                f"  [{part}] multiprocessing folders a killed controller left in its own TMPDIR "
                f"(documented, not counted): {len(documented)}"
            )
            for line in documented:
                print(f"    . {line}")
        for pid, p in foreign:
            print(
                f"  [{part}] note: new {p['name']!r} pid {pid} (cwd {p['cwd']}) is not this run's; left alone"
            )
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for folder in pymp:
            shutil.rmtree(folder, ignore_errors=True)
        return not problems


# -- inner runs --------------------------------------------------------------------


def inner_env(tmpdir: Path, reports: Path) -> dict[str, str]:
    tmpdir.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        TMPDIR=str(tmpdir),
        TORTURE_REPORTS=str(reports),
        PYTHONUNBUFFERED="1",
    )
    env[MARK] = RUN_ID
    return env


# The inner pytest every part runs.
PYTEST = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q")


def run_pytest(
    root: Path, label: str, test_file: str, source: str, args: list[str], limit: float, preexec_fn=None
) -> dict:
    """Run pytest on one generated file (``preexec_fn`` run in its process first); return outcome
    counts, reports, wall time, whether it stalled."""
    (root / test_file).write_text(source)
    reports = root / f"{label}.jsonl"
    log = root / f"{label}.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*PYTEST, "-rA", *args, test_file],
            cwd=root,
            env=inner_env(root / f"tmp-{label}", reports),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        stalled = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            stalled = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.monotonic() - start
    rows = (
        [json.loads(line) for line in reports.read_text().splitlines()]
        if reports.exists()
        else []
    )
    return {
        "wall": wall,
        "rc": proc.returncode,
        "stalled": stalled,
        "rows": rows,
        "counts": counts(rows),
        "log": log,
    }


def counts(rows: list[dict]) -> dict[str, int]:
    c: dict[str, int] = {}
    for r in rows:
        if r["when"] == "call" or r["outcome"] != "passed":
            key = (
                "error"
                if r["when"] != "call" and r["outcome"] == "failed"
                else r["outcome"]
            )
            c[key] = c.get(key, 0) + 1
    return c


def tail(log: Path, n: int = 15) -> str:
    lines = log.read_text(errors="replace").splitlines()
    return "\n".join("      | " + line[:200] for line in lines[-n:])


def part_many(root: Path, census: Census, args) -> bool:
    source = MANY_HEADER
    n_ddp = n_plain = 0
    for i in range(args.tests):
        if i % 5 == 4:
            source += MANY_PLAIN.format(i=i)
            n_plain += 1
        else:
            source += MANY_DDP.format(i=i, ws=4 if i % 10 == 0 else 2)
            n_ddp += 1
    ok = True
    print(
        f"== many: {args.tests} tests ({n_ddp} ddp, {n_plain} plain) under -n 4, {args.rounds} rounds"
    )
    for r in range(args.rounds):
        res = run_pytest(
            root, f"many{r}", "test_many.py", source, ["-n", "4"], limit=args.limit
        )
        good = (
            res["counts"] == {"passed": args.tests}
            and res["rc"] == 0
            and not res["stalled"]
        )
        print(
            f"  round {r + 1}: {res['wall']:.1f} s, rc {res['rc']}, {res['counts']}"
            + (" STALLED" if res["stalled"] else "")
            + ("" if good else "  <-- expected all passed")
        )
        if not good:
            print(tail(res["log"]))
        ok &= good
    ok &= census.check(
        "many", {f"many{r}": (root / f"tmp-many{r}", False) for r in range(args.rounds)}
    )
    return ok


def part_output(root: Path, census: Census, args) -> bool:
    chunks = max(1, args.megabytes // 4)
    per_stream = chunks * 1024 * 1024
    print(
        f"== output: 2 ranks write {4 * chunks} MiB in all (fd 1 and fd 2, {chunks} MiB each)"
    )
    res = run_pytest(
        root,
        "output",
        "test_output.py",
        OUTPUT_TEST.format(chunks=chunks),
        [],
        limit=args.limit,
    )
    sections = {}
    for r in res["rows"]:
        sections.update(r["sections"])
    ok = res["counts"] == {"passed": 1} and not res["stalled"]
    print(
        f"  {res['wall']:.1f} s, rc {res['rc']}, {res['counts']}"
        + (" STALLED" if res["stalled"] else "")
    )
    total = 0
    for rank in (0, 1):
        for stream in ("stdout", "stderr"):
            name = f"Captured {stream} (rank {rank})"
            marker = f"END rank {rank} {stream}\n"
            size, last = sections.get(name, [0, ""])
            total += size
            whole = size == per_stream + len(marker) and last.endswith(marker)
            ok &= whole
            print(
                f"  {name}: {size} characters, expected {per_stream + len(marker)}"
                + ("" if whole else f"  <-- truncated or altered, ends {last[-30:]!r}")
            )
    print(f"  captured in all: {total / 2**20:.1f} MiB")
    if not ok:
        print(tail(res["log"]))
    return census.check("output", {"output": (root / "tmp-output", False)}) and ok


def part_faults(root: Path, census: Census, args) -> bool:
    source = FAULTS_HEADER
    for name, body in FAULTS.items():
        source += FAULT_TEST.format(name=name, body=body)
    print(f"== faults: {len(FAULTS)} faulting tests, each followed by a passing one")
    res = run_pytest(
        root,
        "faults",
        "test_faults.py",
        source,
        ["--ddp-timeout", "60"],
        limit=args.limit,
    )
    print(
        f"  {res['wall']:.1f} s, rc {res['rc']}, {res['counts']}"
        + (" STALLED" if res["stalled"] else "")
    )
    log = res["log"].read_text(errors="replace")
    by_test: dict[str, dict[str, str]] = {}
    for r in res["rows"]:
        by_test.setdefault(r["nodeid"].split("::")[-1], {})[r["when"]] = (
            r["outcome"],
            r["message"],
        )
    ok = not res["stalled"]
    for name in FAULTS:
        phases = by_test.get(f"test_{name}", {})
        call = phases.get("call", ("missing", ""))[0]
        setup = phases.get("setup", ("missing", ""))[0]
        teardown = phases.get("teardown", ("missing", ""))[0]
        if setup == "failed" or teardown == "failed":
            got = "error"
        elif (
            call == "passed"
            and f"test_{name}" in log
            and "LeftoverProcessWarning" in log
            and name == "forked_child"
        ):
            got = "passed+warning"
        else:
            got = call
        after = by_test.get(f"test_after_{name}", {}).get("call", ("missing", ""))[0]
        good = got == EXPECTED[name] and after == "passed"
        ok &= good
        headline = ""
        for when in ("call", "teardown", "setup"):
            outcome, message = phases.get(when, ("", ""))
            if outcome == "failed":
                headline = next(
                    (line for line in message.splitlines() if line.startswith("ddp:")),
                    message.splitlines()[0] if message else "",
                )
                break
        print(
            f"  {name:13} {got:15} (expected {EXPECTED[name]}); next test {after}"
            + ("" if good else "  <--")
            + (f"\n      {headline[:200]}" if headline else "")
        )
    if not ok:
        print(tail(res["log"], 30))
    return census.check("faults", {"faults": (root / "tmp-faults", False)}) and ok


def part_signals(root: Path, census: Census, args) -> bool:
    ok = True
    print("== signals: the controller killed while a ddp test runs")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        label = f"sig-{sig.name}"
        run_dir = root / label
        run_dir.mkdir()
        (run_dir / "conftest.py").write_text(CONFTEST)
        (run_dir / "test_hang.py").write_text(HANG_TEST)
        tmpdir = root / f"tmp-{label}"
        start = time.monotonic()
        with open(root / f"{label}.log", "wb") as out:
            proc = subprocess.Popen(
                [*PYTEST, "test_hang.py"],
                cwd=run_dir,
                env=inner_env(tmpdir, root / f"{label}.jsonl"),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
            ranks: list[int] = []
            while (
                len(ranks) < 2
                and time.monotonic() - start < 120
                and proc.poll() is None
            ):
                ranks = [
                    pid
                    for pid, p in processes().items()
                    if p["name"].startswith("ddp-rank") and p["cwd"] == str(run_dir)
                ]
                time.sleep(0.1)
            ready = time.monotonic() - start
            proc.send_signal(sig)
            try:
                proc.wait(timeout=60)
                exited = True
            except subprocess.TimeoutExpired:
                exited = False
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # How long the ranks take to follow their controller.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and any(
            pid in processes() and processes()[pid]["state"] != "Z" for pid in ranks
        ):
            time.sleep(0.05)
        gone = time.monotonic() - t0
        good = len(ranks) == 2 and exited
        print(
            f"  {sig.name}: ranks {ranks} up after {ready:.1f} s; controller "
            + (f"exited rc {proc.returncode}" if exited else "DID NOT EXIT in 60 s")
            + f"; ranks gone {gone:.2f} s later"
            + ("" if good else "  <--")
        )
        ok &= good
        ok &= census.check(
            sig.name, {label: (tmpdir, sig == signal.SIGKILL)}
        )
    return ok


LIMITS_FDS_TEST = """
import pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size=2)
def test_two(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

@pytest.mark.ddp(world_size=4)
def test_four(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 4

@pytest.mark.ddp(world_size=2)
def test_two_again(rank):
    dist.barrier(group=dist.new_group([0, 1]))
"""

LIMITS_WIDE_TEST = """
import pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size=32, timeout=240)
def test_32(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 32
"""


def part_limits(root: Path, census: Census, args) -> bool:
    """``ulimit -n 64`` and a world of 32 ranks on this machine's cores."""
    print("== limits: three ddp tests under ulimit -n 64; one 32-rank test")
    res = run_pytest(
        root,
        "fds",
        "test_fds.py",
        LIMITS_FDS_TEST,
        [],
        limit=args.limit,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)),
    )
    log = res["log"].read_text(errors="replace")
    outcomes = {}
    for r in res["rows"]:
        name = r["nodeid"].split("::")[-1]
        if r["outcome"] == "failed" and r["when"] != "call":
            outcomes[name] = "error" + (": too many open files" if "Too many open files" in r["message"] else "")
        elif r["when"] == "call":
            outcomes.setdefault(name, r["outcome"])
    expected = {"passed", "error: too many open files"}
    ok = (
        not res["stalled"]
        and "INTERNALERROR" not in log
        and sorted(outcomes) == ["test_four", "test_two", "test_two_again"]
        and set(outcomes.values()) <= expected
    )
    print(
        f"  ulimit -n 64: {res['wall']:.1f} s, rc {res['rc']}, {outcomes}"
        + (" STALLED" if res["stalled"] else "")
        + (" INTERNALERROR" if "INTERNALERROR" in log else "")
        + ("" if ok else "  <-- expected each passed or a clear error")
    )
    if not ok:
        print(tail(res["log"], 30))
    wide = run_pytest(root, "wide", "test_wide.py", LIMITS_WIDE_TEST, [], limit=args.limit)
    refused = "this machine holds at most" in wide["log"].read_text(errors="replace")
    good = not wide["stalled"] and (wide["counts"] == {"passed": 1} or refused)
    print(
        f"  world_size=32 on {os.cpu_count()} cores: {wide['wall']:.1f} s, rc {wide['rc']}, "
        + ("refused" if refused else str(wide["counts"]))
        + (" STALLED" if wide["stalled"] else "")
        + ("" if good else "  <-- expected a pass or a clear refusal")
    )
    if not good:
        print(tail(wide["log"], 30))
    tmpdirs = {"fds": (root / "tmp-fds", False), "wide": (root / "tmp-wide", False)}
    return census.check("limits", tmpdirs) and ok and good


RUN_ID = uuid.uuid4().hex


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tests", type=int, default=200, help="tests in the -n 4 file (default 200)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of that file (default 3)"
    )
    parser.add_argument(
        "--megabytes",
        type=int,
        default=200,
        help="MB the output test writes in all (default 200)",
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=300,
        help="seconds an inner run may take before it counts as stalled",
    )
    parser.add_argument(
        "--parts",
        default="many,output,faults,signals,limits",
        help="comma-separated parts to run",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (its logs)"
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ddp-torture-"))
    (root / "conftest.py").write_text(CONFTEST)
    census = Census(root)
    parts = {
        "many": part_many,
        "output": part_output,
        "faults": part_faults,
        "signals": part_signals,
        "limits": part_limits,
    }
    results = {}
    start = time.monotonic()
    try:
        for name in args.parts.split(","):
            t0 = time.monotonic()
            results[name] = parts[name](root, census, args)
            print(
                f"  [{name}] {time.monotonic() - t0:.1f} s, {'ok' if results[name] else 'FAILED'}\n",
                flush=True,
            )
        print(f"== end, {time.monotonic() - start:.1f} s in all")
        results["end"] = census.check("end", {})
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    failed = [name for name, good in results.items() if not good]
    print(
        "torture: "
        + (
            "all parts ok, nothing left behind"
            if not failed
            else "FAILED: " + ", ".join(failed)
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

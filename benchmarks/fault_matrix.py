"""The injected-fault matrix (issue 27): every cell of tests/matrix/cells.py run on fresh ranks
and judged (tests/matrix/judge.py), and docs/matrix.md written from the results.

    .venv/bin/python benchmarks/fault_matrix.py [--families ...] [--kinds ...] [--worlds 2 4 8]
                                                [--positions first middle last] [--out docs/matrix.md]
    .venv/bin/python benchmarks/fault_matrix.py --rejudge   # the last run's records, judged again
    .venv/bin/python benchmarks/fault_matrix.py --merge --families p2p --kinds shape   # rerun some cells
    .venv/bin/python benchmarks/fault_matrix.py --merge --missing --worlds 8   # the cells not run yet
    .venv/bin/python benchmarks/fault_matrix.py --combine /tmp/later.json   # a later run's records replace

Without arguments it runs the whole matrix (all families, kinds, worlds and positions); with
some, the subset, which the table then says it is.  One line per cell is printed as it ends.
What each cell's run said is kept in docs/matrix.json beside the table, so that a change of a
cell's answer (tests/matrix/cells.py) is judged again without running the ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.matrix, for this process and the ranks it starts

from pytest_ddp.groups.mpi_group import mpi_unavailable  # noqa: E402
from tests.matrix import cells as matrix  # noqa: E402
from tests.matrix.judge import Judged, Record, judge, run_cell  # noqa: E402


def _seconds(values: list[float]) -> tuple[str, str]:
    if not values:
        return "-", "-"
    return f"{statistics.median(values):.2f}", f"{max(values):.2f}"


def table(judged: list[Judged], command: str, subset: str, took: float) -> str:
    """docs/matrix.md: the command, the subset run, one row per family x kind, the totals, the
    wrong cells and why, the absent cells and why."""
    lines = [
        "# The injected-fault matrix",
        "",
        "Regenerate this page (under the shared machine's lock, as every heavy run):",
        "",
        "```",
        "flock /tmp/ddp-heavy.lock .venv/bin/python benchmarks/fault_matrix.py",
        "```",
        "",
        "Each cell injects one failure kind into one family of code (tests/matrix/families.py) at the",
        "first, a middle or the last rank of a world of 2, 4 or 8, runs it on fresh ranks with",
        "`pytest_ddp.run()`, and checks the verdict against the cell's answer (tests/matrix/cells.py):",
        "the outcome, the diagnosis's kind, its culprit ranks exactly, and where the cell says so the",
        "call at fault (`Diagnosis.call`: op, sequence number, the line of the family's code). A slow",
        "rank (`delay`) is right only when the test passes. *False culprit*: a rank named at fault that",
        "is not. *Tie*: two ranks (of 2, or two peers) named as disagreeing, neither as likely, the",
        "culprit one of them (wrong, but no false accusation). *To verdict*: seconds from the moment the",
        "hang was certain (the last event of any rank: a call entered or left, a return, a death) to",
        "the verdict, median and max over the row's cells, on the machine as loaded as the run says;",
        "a hang outside any collective is never certain, and is judged at the test's timeout (no",
        "figure); a rank killed on purpose is judged once the grace (2 s) is over.",
        "",
        "Two ranks have no majority: where their calls differ the verdict names both (a tie), and one",
        "of them as likely only where its call departs from what its line always made, or came after",
        "its previous call in an order of lines no rank's calls took before, or where no way of its",
        "code from its call before to this one makes no call between, while the other's code has one",
        "(it skipped a call its code makes: an injected fault fires at its op's 2nd call, often in a",
        "loop's first round, before any rank went round it). Where the fault is written in the",
        "family's code instead (another step count, value or branch on the culprit: no `faults`), each",
        "rank did what its code says, and with no majority nothing tells whose way the code meant: at",
        "2 ranks a step less on one rank is a step more on the other (`partial` names the rank that",
        "returned, and the waiting rank too), and the same code with the other rank's way meant makes",
        "the same calls. The cells absent from the matrix, and why, are",
        "listed at the end; a cell's body is in tests/matrix/families.py, its answer in",
        "tests/matrix/cells.py (`expected`), its judging in tests/matrix/judge.py.",
        "",
        f"This run: {command}; {subset}; {len(judged)} cells, {took / 60:.0f} min of runs on this machine",
        "(2 cores, shared with other work).",
        "",
        "| family | kind | right | wrong | of which ties | false culprit | to verdict, median s | max s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows: dict[tuple[str, str], list[Judged]] = {}
    judged = sorted(judged, key=lambda j: (matrix.FAMILIES.index(j.cell.family), matrix.KINDS.index(j.cell.kind),
                                           j.cell.world, matrix.POSITIONS.index(j.cell.position)))
    for j in judged:
        rows.setdefault((j.cell.family, j.cell.kind), []).append(j)
    for (family, kind), group in rows.items():
        right = sum(j.right for j in group)
        median, worst = _seconds([j.record.latency for j in group if j.record.latency is not None])
        false = sum(j.false_culprit for j in group)
        ties = sum(j.tie for j in group)
        lines.append(f"| {family} | {kind} | {right} | {len(group) - right} | {ties} | {false} | {median} | {worst} |")
    for name, members in [("classic families", [j for j in judged if j.cell.family in matrix.CLASSIC_FAMILIES]),
                          ("all", judged)]:
        right = sum(j.right for j in members)
        median, worst = _seconds([j.record.latency for j in members if j.record.latency is not None])
        share = f"{100 * right / len(members):.1f}%" if members else "-"
        lines.append(f"| **total: {name}** | | **{right} ({share})** | **{len(members) - right}** | "
                     f"**{sum(j.tie for j in members)}** | **{sum(j.false_culprit for j in members)}** | "
                     f"{median} | {worst} |")
    counts = []
    for members in ([j for j in judged if j.cell.family in matrix.CLASSIC_FAMILIES], judged):
        untold = sum(j.tie and not j.cell.faults and j.cell.world == 2 for j in members)
        right, told = sum(j.right for j in members), len(members) - untold
        counts.append((untold, right, told, f"{100 * right / told if told else 0:.1f}%"))
    (classic_untold, *classic), (all_untold, *every) = counts
    lines += ["", "Counted apart, the ties of 2 ranks over a fault written in the family's code (each rank did",
              f"what its code says, and nothing in the run tells whose way it meant: {classic_untold} cells of the",
              f"classic families, {all_untold} in all), the matrix is right on {classic[0]} of {classic[1]} cells of",
              f"the classic families ({classic[2]}) and on {every[0]} of {every[1]} in all ({every[2]})."]
    wrong = [j for j in judged if not j.right]
    causes: dict[str, int] = {}
    for j in wrong:
        cause = j.cause or "not known: see the cell below"
        causes[cause] = causes.get(cause, 0) + 1
    lines += ["", "## What the wrong cells have in common", "", "| cells | why |", "|---|---|"]
    lines += [f"| {n} | {cause} |" for cause, n in sorted(causes.items(), key=lambda c: -c[1])]
    lines += ["", "## Wrong cells, and why", ""]
    if not wrong:
        lines.append("None.")
    else:
        lines += ["| cell | expected | got | why |", "|---|---|---|---|"]
        for j in wrong:
            e = j.cell.expected
            wanted = "passes" if not e.outcomes else f"{'/'.join(e.kinds)} {list(e.culprits)}"
            lines.append(f"| {j.cell.name} | {wanted} | {j.answer} | {j.why.replace('|', '/')} |")
    lines += ["", "## Cells the matrix leaves out, and why", "", "| family | kind | why |", "|---|---|---|"]
    for (family, kind), why in sorted(matrix.ABSENT.items()):
        lines.append(f"| {family} | {kind} | {why} |")
    return "\n".join(lines) + "\n"


def _quoted(command: str) -> str:
    return command if command.startswith("`") else f"`{command}`"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", choices=matrix.FAMILIES, default=list(matrix.FAMILIES))
    parser.add_argument("--kinds", nargs="+", choices=matrix.KINDS, default=list(matrix.KINDS))
    parser.add_argument("--worlds", nargs="+", type=int, choices=matrix.WORLDS, default=list(matrix.WORLDS))
    parser.add_argument("--positions", nargs="+", choices=matrix.POSITIONS, default=list(matrix.POSITIONS))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "matrix.md")
    parser.add_argument("--rejudge", action="store_true", help="judge the records of the last run again")
    parser.add_argument("--merge", action="store_true",
                        help="run the cells chosen and replace their records in the last run's (after a fix)")
    parser.add_argument("--missing", action="store_true",
                        help="with --merge: only the cells chosen that the last run has no record of")
    parser.add_argument("--combine", nargs="+", type=Path, default=[], metavar="JSON",
                        help="replace the last run's records by those of these runs (their --out's .json)")
    args = parser.parse_args()
    saved = args.out.with_suffix(".json")
    if args.rejudge or args.merge or args.combine:
        run = json.loads(saved.read_text())
        run["command"] = _quoted(run["command"])
    for other in args.combine:
        later = json.loads(other.read_text())
        run["records"].update(later["records"])
        run["command"] += f"; then, its records replacing those before: {_quoted(later['command'])}"
        run["seconds"] += later["seconds"]
    if args.combine:
        saved.write_text(json.dumps(run))
    if args.merge:
        chosen = matrix.cells(tuple(args.families), tuple(args.kinds), tuple(args.worlds), tuple(args.positions))
        if args.missing:
            chosen = [cell for cell in chosen if cell.name not in run["records"]]
        for cell in chosen:
            run["records"][cell.name] = dataclasses.asdict(run_cell(cell))
            print(f"{cell.name}: {judge(cell, Record(**run['records'][cell.name])).answer}", flush=True)
        run["command"] += f"; then `python benchmarks/fault_matrix.py {' '.join(sys.argv[1:])}`"
        saved.write_text(json.dumps(run))
    if args.rejudge or args.merge or args.combine:
        every = {cell.name: cell for cell in matrix.cells()}
        judged = [judge(every[name], Record(**record)) for name, record in run["records"].items() if name in every]
        subset = run["subset"]
        if subset == "the whole matrix" and len(judged) < len(every):
            subset = f"the whole matrix, cut short after {len(judged)} of its {len(every)} cells (run world by world)"
        args.out.write_text(table(judged, run["command"], subset, run["seconds"]))
        print(f"wrote {args.out}")
        return 0
    unavailable = mpi_unavailable(None)
    if unavailable is not None and "mpi" in args.families:  # as the MPI tests skip, saying why
        print(f"the mpi family is left out: {unavailable}", flush=True)
        args.families.remove("mpi")
    chosen = matrix.cells(tuple(args.families), tuple(args.kinds), tuple(args.worlds), tuple(args.positions))
    whole = (args.families, args.kinds, args.worlds, args.positions) == (
        list(matrix.FAMILIES), list(matrix.KINDS), list(matrix.WORLDS), list(matrix.POSITIONS))
    subset = "the whole matrix" if whole else (
        f"a subset: families {' '.join(args.families)}; kinds {' '.join(args.kinds)}; "
        f"worlds {' '.join(map(str, args.worlds))}; positions {' '.join(args.positions)}")
    command = "`" + ("python benchmarks/fault_matrix.py " + " ".join(sys.argv[1:])).strip() + "`"
    start = time.perf_counter()
    judged, records = [], {}
    for cell in chosen:
        record = run_cell(cell)
        records[cell.name] = dataclasses.asdict(record)
        j = judge(cell, record)
        judged.append(j)
        latency = "-" if record.latency is None else f"{record.latency:.2f}"
        print(f"{'ok   ' if j.right else 'WRONG'} {cell.name:<40} {record.wall:5.1f}s verdict+{latency:<5} "
              f"{j.answer} {j.why}", flush=True)
        took = time.perf_counter() - start
        saved.write_text(json.dumps({"command": command, "subset": subset, "seconds": took, "records": records}))
    args.out.write_text(table(judged, command, subset, time.perf_counter() - start))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

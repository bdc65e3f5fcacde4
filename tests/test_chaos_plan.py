"""The chaos gate's logic (benchmarks/chaos.py) on hand-made inputs: the faults drawn from a seed, the
test each becomes, and what each test's result and report must be.  No process is started: the gate
itself is run by hand (docs/benchmarks.md)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.chaos import KINDS, Case, Result, file_source, judge, plan, port_clashes  # noqa: E402


def test_plan_is_the_seeds_and_draws_every_kind_and_both_world_sizes() -> None:
    cases = plan(2000, seed=3)
    assert cases == plan(2000, seed=3) and cases != plan(2000, seed=4)
    assert {case.kind for case in cases} == set(KINDS)
    assert {case.world_size for case in cases} == {2, 4}
    assert all(0 <= case.rank < case.world_size for case in cases)


def test_each_case_becomes_one_test_with_its_fault_on_its_rank() -> None:
    cases = [Case(i, kind, 4, 3) for i, kind in enumerate(KINDS)]
    tree = ast.parse(file_source(cases))
    tests = {node.name: ast.unparse(node) for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert set(tests) == {case.name for case in cases} | {"xdist_worker"}
    source = {case.kind: tests[case.name] for case in cases}
    assert "faults.kill(rank=3, at='all_reduce')" in source["kill"]
    assert "if rank == 3:\n        os.kill(os.getpid(), signal.SIGSTOP)" in source["stop"]
    assert "chaos_teardown_hang(3)" in source["teardown_hang"]
    assert "faults" not in source["none"] and "if rank" not in source["none"]


def judged(kind: str, result: Result | None, report: dict | None = None) -> str:
    return judge(Case(7, kind, 2, 1), result, report, timeout=3.0)[0]


def test_a_test_without_a_fault_must_pass_within_its_timeout() -> None:
    assert judged("none", Result("passed", 0.1)) == "right"
    assert judged("slow", Result("passed", 0.4)) == "right"
    assert judged("slow", Result("failed", 0.4, "boom")) == "wrong"
    assert judged("none", Result("passed", 5.5)) == "wrong"
    assert judged("none", None) == "missing"


def test_a_faulty_test_needs_its_verdict_naming_its_culprit_alone() -> None:
    timeout = {"kind": "timeout", "culprits": [1]}
    assert judged("hang", Result("failed", 3.1), timeout) == "right"
    assert judged("teardown_hang", Result("error", 3.1), timeout) == "right"
    assert judged("hang", Result("passed", 0.1), timeout) == "false pass"
    assert judged("hang", Result("failed", 3.1), {"kind": "timeout", "culprits": [0, 1]}) == "wrong"
    assert judged("kill", Result("failed", 0.1), timeout) == "wrong"
    assert judged("kill", Result("failed", 0.1), {"kind": "rank_exited", "culprits": [1]}) == "right"
    assert judged("kill", Result("failed", 0.1), None) == "missing"
    assert judged("sleep", Result("failed", 5.01), timeout) == "wrong"  # over its timeout + 2 s


def test_a_sigterm_to_the_worker_is_a_crash_xdist_reports() -> None:
    crashed = "failed on setup with \"worker 'gw1' crashed while running 'test_chaos.py::test_x'\""
    assert judged("xdist_sigterm", Result("error", 0.0, crashed)) == "right"
    assert judged("xdist_sigterm", Result("error", 0.0, "rank 1 failed")) == "wrong"
    assert judged("xdist_sigterm", Result("passed", 0.1)) == "false pass"


def test_two_groups_on_one_port_clash_only_at_once() -> None:
    def line(port: str, group: str, time: float) -> dict:
        return {"port": port, "group": group, "time": time}

    one_after_another = [line("5", "a", 1.0), line("5", "a", 2.0), line("5", "b", 3.0), line("6", "c", 1.5)]
    assert port_clashes(one_after_another) == []
    assert port_clashes([*one_after_another, line("5", "a", 3.5)]) == ["port 5: groups a and b at once"]
    inside_a_long_one = [line("7", "a", 1.0), line("7", "a", 9.0), line("7", "b", 2.0), line("7", "c", 4.0)]
    assert port_clashes(inside_a_long_one) == [
        "port 7: groups a and b at once", "port 7: groups a and c at once"
    ]

"""The field corpus (benchmarks/field/) is whole: every case has its report's link, a fixed twin, an
expected verdict and one marked line, and the tests it becomes compile. No process is started: the
corpus is run by benchmarks/field_score.py."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.field import FAMILIES, MARK, corpus  # noqa: E402
from benchmarks.field_score import write_family  # noqa: E402

KINDS = {"rank_exited", "partial", "mismatch", "p2p_cycle", "p2p_unmatched", "init", "timeout", "failed"}
CASES = [(family, case) for family, found in corpus().items() for case in found]


def test_every_family_has_cases_and_names_are_unique() -> None:
    assert all(corpus()[family] for family in FAMILIES)
    names = [case.name for _, case in CASES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert any(case.held_out for _, case in CASES) and not all(case.held_out for _, case in CASES)


@pytest.mark.parametrize(("family", "case"), CASES, ids=[case.name for _, case in CASES])
def test_case_is_whole(family: str, case) -> None:
    assert case.url.startswith("https://github.com/") and ("/issues/" in case.url or "/pull/" in case.url)
    assert case.summary.strip() and case.name.isidentifier()
    assert case.body.count(MARK) == 1, "one marked line in the body"
    assert MARK not in case.twin and case.twin.strip() != case.body.strip()
    assert case.kind in KINDS and case.outcome == "failed"
    assert case.culprits and all(0 <= r < case.world_size for r in case.culprits)
    assert 2 <= case.world_size <= 4


@pytest.mark.parametrize("family", FAMILIES)
def test_family_file_compiles_with_its_marked_lines(family: str, tmp_path: Path) -> None:
    path, marked = write_family(tmp_path, family, corpus()[family])
    source = path.read_text()
    tests = {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    lines = source.splitlines()
    for case in corpus()[family]:
        assert {f"test_{case.name}", f"test_{case.name}_twin"} <= tests
        assert MARK in lines[marked[case.name] - 1]

"""The field corpus (benchmarks/field/) is whole: every case has its report's link, a fixed twin, an
expected verdict and one marked line, and the tests it becomes compile (as a ddp test, a plain torch
program and a MultiProcessTestCase); torch's tools' outputs are scored on what they name. No process
is started: the corpus is run by benchmarks/field_score.py."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.field import FAMILIES, MARK, Case, corpus  # noqa: E402
from benchmarks.field_score import backend, write_family  # noqa: E402
from benchmarks.field_tools import ToolRun, mptc_module, plain_program, score  # noqa: E402

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
    marks = [line for line in lines if line.startswith("@pytest.mark.ddp(")]
    assert len(marks) == 2 * len(corpus()[family])
    assert all(f"backend='{backend(family)}'" in mark for mark in marks) if backend(family) else True
    for case in corpus()[family]:
        assert {f"test_{case.name}", f"test_{case.name}_twin"} <= tests
        assert MARK in lines[marked[case.name] - 1]


@pytest.mark.parametrize("family", FAMILIES)
def test_case_as_torch_program_and_multiprocess_test_compiles(family: str, tmp_path: Path) -> None:
    for case in corpus()[family]:
        for source in (plain_program(case, tmp_path), mptc_module(case, tmp_path, 20)):
            ast.parse(source)
            assert source.count(MARK) == 1


# Outputs of torch's tools as they read on the field cases (ground truth, torch 2.13, gloo).
SPAWN_RAISED = """\
-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File "/tmp/x/plain_case.py", line 24, in case
    dist.all_gather_object(gathered, stats)  # <- culprit line
TypeError: cannot pickle '_thread.lock' object
"""
DETAIL_MISMATCH = """\
-- Process 2 terminated with the following error:
Traceback (most recent call last):
  File "/tmp/x/plain_case.py", line 27, in case
    dist.broadcast_object_list(state, src=0)  # <- culprit line
RuntimeError: Detected mismatch between collectives on ranks. Rank 2 is running collective: \
CollectiveFingerPrint(SequenceNumber=1, OpType=BROADCAST, TensorShape=[1]), but Rank 1 is running \
collective: CollectiveFingerPrint(SequenceNumber=1, OpType=BARRIER)
"""
MPTC_TIMEOUT = """\
ERROR    torch.testing._internal.common_distributed:common_distributed.py:1122 Process 1 timed out
E   RuntimeError: Process 0 terminated or timed out after 20.3 seconds
"""
FRTRACE_MISMATCH = """\
Collective sequence number: 2 has errors
collective: gloo:broadcast
error msg: Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: 'broadcast' \
does not match found collective type: 'barrier'
"""


def _case(culprits: tuple[int, ...], op: str) -> Case:
    return Case("c", "https://github.com/o/r/issues/1", "s", 3, "", "", "mismatch", culprits, op)


def test_torch_tools_scored_on_what_they_name() -> None:
    raised_run = ToolRun("detail", SPAWN_RAISED, 6.7, "plain_case.py", 24)
    raised = score(_case((1,), "all_gather_object"), raised_run)
    assert raised.right and "[1]" in raised.got
    # Both sides of DETAIL's mismatch: a tie, not right, no false culprit.
    mismatch_run = ToolRun("detail", DETAIL_MISMATCH, 7, "plain_case.py", 27)
    mismatch = score(_case((1,), "broadcast_object_list"), mismatch_run)
    assert (mismatch.right, mismatch.tie, mismatch.false_culprit) == (False, True, False)
    # The harness's message names the first process that had not ended, and no line.
    timeout = score(_case((1,), "barrier"), ToolRun("mptc", MPTC_TIMEOUT, 24, "test_mptc_c.py", 45))
    assert not timeout.right and timeout.false_culprit and "line" in timeout.why
    fr = score(_case((1,), "broadcast_object_list"), ToolRun("frtrace", FRTRACE_MISMATCH, 1.3, "", 0))
    assert fr.right
    assert not score(_case((1,), "all_reduce"), ToolRun("frtrace", FRTRACE_MISMATCH, 1.3, "", 0)).right
    assert not score(_case((1,), "all_reduce"), ToolRun("frtrace", "", 1.3, "", 0)).right
    assert score(_case((1,), "bcast"), ToolRun("frtrace", FRTRACE_MISMATCH, 1.3, "", 0)).right

"""The fast slice of the injected-fault matrix (tests/matrix/cells.py; the whole matrix is
benchmarks/fault_matrix.py, its table docs/matrix.md): the classic family's kinds and one
process fault in most other families, each cell on fresh ranks through ``pytest_ddp.run()``,
judged as the whole matrix judges it (kind, culprits, the call: op, number, line)."""

from __future__ import annotations

import pytest

from tests.matrix import cells as matrix
from tests.matrix.judge import judge, run_cell

FAST = [
    *matrix.cells(("classic",), ("extra", "op", "shape", "dtype", "raise", "kill", "exit", "oom", "delay",
                                 "init_world_size", "init_rank"), (4,), ("middle",)),
    *matrix.cells(("classic",), ("cycle",), (4,), ("last",)),
    *matrix.cells(("p2p",), ("unmatched_recv", "raise"), (4,), ("middle",)),
    *matrix.cells(("objects",), ("extra", "exit"), (4,), ("first",)),
    *matrix.cells(("ddp", "fsdp2", "dtensor", "functional", "tensor_parallel", "pipelining", "mpi"),
                  ("raise",), (2,), ("last",)),
    *matrix.cells(("ddp", "functional"), ("skip",), (4,), ("first",)),  # at 2 ranks a tie: a step more or less
]


@pytest.mark.parametrize("cell", FAST, ids=lambda cell: cell.name)
def test_the_cell_is_diagnosed_right(cell):
    judged = judge(cell, run_cell(cell))
    assert judged.right, f"{judged.answer}: {judged.why}"
    assert not judged.false_culprit

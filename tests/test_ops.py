"""The one table of operations, and the drifts it ended: read on hand-made calls, no processes."""

from __future__ import annotations

import ast
from pathlib import Path

import torch.distributed.distributed_c10d as c10d
from test_watchdog import call, ok, rank

from pytest_ddp import ops
from pytest_ddp.report import sequence_table

PACKAGE = Path(ops.__file__).parent


def test_every_python_op_is_a_torch_distributed_function() -> None:
    missing = [name for name, op in ops.OPS.items() if op.python and not hasattr(c10d, name)]
    assert missing == []


def test_every_op_the_ddp_view_records_is_in_the_table() -> None:
    """The view writes C++ names ("allreduce"); each must be a collective of the table."""
    tree = ast.parse((PACKAGE / "ddp_view.py").read_text())
    recorded = {
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_record"
        and isinstance(node.args[1], ast.Constant)
    }
    assert recorded == {"allreduce", "allgather", "broadcast"}
    assert all(ops.op(name).is_collective for name in recorded)


def test_no_other_module_lists_op_names() -> None:
    """Each operation fact lives in ops.py: no other module spells an op name as a string."""
    # "send" and "recv" are also the two directions; "broadcast" a word of the DDP view's API.
    names = set(ops.OPS) - {"send", "recv", "broadcast"}
    found = []
    for path in PACKAGE.glob("*.py"):
        if path.name in ("ops.py", "ddp_view.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert found == []


def test_batch_isend_irecv_pairs_with_no_single_call_and_has_no_collective_number() -> None:
    batch = call("batch_isend_irecv", 1, shape=None)
    assert (batch.is_p2p, batch.is_collective, batch.blocks) == (False, False, False)
    # Its label used to say "from any", as if it were a receive.
    assert batch.label == "batch_isend_irecv #1"


def test_directions_come_from_the_table() -> None:
    assert [call(name, 1, peer=0).is_recv for name in ("recv", "irecv", "recv_object_list")] == [True] * 3
    assert [call(name, 1, peer=0).is_recv for name in ("send", "isend", "send_object_list")] == [False] * 3


def test_uneven_all_to_all_is_not_marked_as_a_divergence_in_the_report() -> None:
    """The watchdog accepts all_to_all splits that differ; the report's table used to mark them."""
    states = [
        rank(0, ok("all_to_all_single", 1, shape=(3,)), ok("all_reduce", 2), finished=True),
        rank(1, ok("all_to_all_single", 1, shape=(5,)), ok("all_reduce", 2), finished=True),
    ]
    table = "\n".join(sequence_table(states))
    assert "all_to_all_single" in table and "ranks differ" not in table
    states[1].calls[1].shapes = [[8]]
    assert "ranks differ" in "\n".join(sequence_table(states))

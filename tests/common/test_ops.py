"""The one table of operations, and the drifts it ended: read on hand-made calls, no processes."""

from __future__ import annotations

import ast
from pathlib import Path

import torch.distributed.distributed_c10d as c10d
from snapshots import call, ok, rank

from pytest_ddp.common import ops
from pytest_ddp.report.sequences import group_sequences, table

PACKAGE = Path(ops.__file__).parent.parent


def test_every_python_op_is_a_torch_distributed_function() -> None:
    missing = {name for name, op in ops.OPS.items() if op.python and not hasattr(c10d, name)}
    # Newer than torch 2.8 (the first two) or than 2.13 (the last two).
    assert missing <= {"all_gather_single", "reduce_scatter_single", "gather_into_tensor", "gather_single"}


def test_every_c10d_operation_of_this_torch_is_hooked_and_named_in_the_table() -> None:
    """What reaches a backend goes through one of torch's c10d:: operations: all are hooked."""
    import torch

    torch_ops = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("c10d::")}
    assert torch_ops - {"check_for_nan"} <= set(ops.BACKEND_OPS)
    assert all(spec.op in ops.OPS for spec in ops.BACKEND_OPS.values())


def test_no_other_module_lists_op_names() -> None:
    """Each operation fact lives in ops.py: no other module spells an op name as a string."""
    # "send" and "recv" are also the two directions; "barrier" the name of a c10d:: operation.
    names = set(ops.OPS) - {"send", "recv", "barrier"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "ops.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
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
    text = "\n".join(table(group_sequences(states)))
    assert "all_to_all_single" in text and "ranks differ" not in text
    states[1].calls[1].shapes = [[8]]
    assert "ranks differ" in "\n".join(table(group_sequences(states)))


def test_ranks_that_meet_in_one_collective_from_different_lines_are_shown_with_their_sites() -> None:
    """A library's barrier (torchmetrics' compute) pairing with the test's own: not "barrier barrier"."""
    library = ok("barrier", 1, shape=None, site="t.py:30")
    library.caller = "torchmetrics/utilities.py:40"
    states = [rank(0, ok("barrier", 1, shape=None, site="t.py:20"), finished=True), rank(1, library, finished=True)]
    lines = table(group_sequences(states))
    assert lines[-1] == "  #1 called at t.py:20 (rank 0), t.py:30 via torchmetrics/utilities.py:40 (rank 1)"
    library.site, library.caller = "t.py:20", None
    assert " at " not in "\n".join(table(group_sequences(states)))  # same line: nothing to tell apart

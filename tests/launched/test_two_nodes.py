"""Launched mode across two machines: two torchrun agents (--nnodes=2) in two network
namespaces joined by a veth pair, each with its own /tmp, so the run crosses a network
and the ranks share no files but the test's folder (where the suite's exit statuses go)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from . import suite
from .nodes import TwoNodes, namespaces_unavailable
from .runs import OWN_BASETEMP


def _run_on_two_nodes(folder: Path, timeout: float = 240) -> tuple[suite.Result, str, list[str]]:
    """The session launched in ``folder``: rank 0's result, node 1's output, and what either node
    left in its TMPDIR (a folder of its own on each)."""
    if (why := namespaces_unavailable()) is not None:
        pytest.skip(why)
    tmp = [suite.private_tmp(), suite.private_tmp()]
    try:
        with TwoNodes() as nodes:
            agents = nodes.torchrun(
                [sys.executable, *suite.pytest_command("-rs")], folder, tmp, env=suite.launched_environment(),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            )  # fmt: skip
            outputs = [agent.communicate(timeout=timeout)[0] for agent in agents]
            codes = [agent.returncode for agent in agents]
        left_in_tmp = [name for node_tmp in tmp for name in suite.files_left_in(node_tmp)]
    finally:
        for node_tmp in tmp:
            shutil.rmtree(node_tmp, ignore_errors=True)
    first = suite.collect(folder, codes[0], outputs[0])
    assert codes[1] != 0, outputs[1]
    return first, outputs[1], left_in_tmp


def test_one_session_across_two_nodes(folder: Path) -> None:
    """torchrun's run of the suite (test_launched.py runs mpiexec's on one node)."""
    suite.write_suite(folder)
    result, second_node, left_in_tmp = _run_on_two_nodes(folder)
    suite.check_suite(result, folder)
    assert "launched by torchrun: 4 ranks on 2 nodes" in result.output
    # Node 1 runs ranks 2 and 3, whose pytest writes no report there.
    assert "short test summary info" not in second_node
    assert "(node1)" in result.output  # the other ranks' logs, named by their node
    # The suite fails: once one launched pytest exits non-zero, torchrun's agents end the others
    # still running with SIGTERM. Each left a ``pymp-*`` folder (its forkserver's socket) in
    # TMPDIR that way.
    assert left_in_tmp == [], result.output


def test_collections_that_differ_across_two_nodes(folder: Path) -> None:
    """torchrun's run of the collections that differ (test_slurm_launched.py runs srun's): every
    rank stopped, rank 2 named with its node, and each host told why, the other node's too."""
    suite.write_suite(folder, suite.DIFFERENT_COLLECTION + OWN_BASETEMP)
    result, _, _ = _run_on_two_nodes(folder)
    suite.check_collection_differs(result, stopped=True)
    assert "rank 2 (on node1)" in result.output
    suite.check_hosts_logged_why(folder, 4)

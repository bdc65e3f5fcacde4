"""Launched mode across two machines: two torchrun agents (--nnodes=2) in two network
namespaces joined by a veth pair, each with its own /tmp, so the run crosses a network
and the ranks share no files but the test's folder (where the suite's exit statuses go).

The two sessions (the suite, the collections that differ) run once, together, each on two
nodes of its own (tests/launchers/runs.py), and the tests read them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import suite
from .nodes import TwoNodes, namespaces_unavailable
from .runs import Shared, Started, together


def _start_on_two_nodes(folder: Path) -> Started:
    nodes = TwoNodes().__enter__()
    run = Started(folder, close=nodes.close)
    try:
        run.processes = nodes.torchrun(
            [sys.executable, *suite.pytest_command("-rs")], folder, env=suite.launched_environment(),
            stdouts=[run.output(), run.output()], stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    except BaseException:
        run.kill()
        raise
    return run


@pytest.fixture(scope="module")
def two_node_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Shared]:
    if (why := namespaces_unavailable()) is not None:
        pytest.skip(why)
    started: dict[str, Started | str] = {}
    for name, conftest in (("suite", ""), ("differ", suite.DIFFERENT_COLLECTION)):
        folder = tmp_path_factory.mktemp(f"two-nodes-{name}")
        suite.write_suite(folder, conftest)
        started[name] = _start_on_two_nodes(folder)
    runs = together(started)
    return {name: run for name, run in runs.items() if isinstance(run, Shared)}


def _node_1_failed(run: Shared) -> str:
    """Node 1's agent's output, once it is seen to have failed too."""
    code, output = run.ended[1]
    assert code != 0, output
    return output


def test_one_session_across_two_nodes(two_node_runs: dict[str, Shared]) -> None:
    run = two_node_runs["suite"]
    second_node = _node_1_failed(run)
    suite.check_suite(run.result, run.folder)
    assert "launched by torchrun: 4 ranks on 2 nodes" in run.result.output
    # Node 1 runs ranks 2 and 3, whose pytest writes no report there.
    assert "short test summary info" not in second_node
    assert "(node1)" in run.result.output  # the other ranks' logs, named by their node


def test_collections_that_differ_across_two_nodes(two_node_runs: dict[str, Shared]) -> None:
    run = two_node_runs["differ"]
    _node_1_failed(run)
    suite.check_collection_differs(run.result)
    assert "rank 2 (on node1)" in run.result.output

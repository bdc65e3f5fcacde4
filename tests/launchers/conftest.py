"""The launchers' fixtures: a launched session's folder, the "collections differ" sessions that
two files read, a SLURM cluster of the session's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from . import suite
from .runs import OWN_BASETEMP, Sessions
from .slurm import SlurmCluster, slurm_unavailable


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """The launched session's folder; no process of it may outlive the test."""
    yield tmp_path
    left = suite.wait_for_no_leftovers(str(tmp_path))
    assert not left, f"left behind: {left}"


@pytest.fixture(scope="session")
def collections_differ(tmp_path_factory: pytest.TempPathFactory) -> Sessions:
    """SUITE whose rank 2 drops a test (DIFFERENT_COLLECTION), under torchrun and under mpiexec
    (one after the other, 4 processes each), each launched pytest in a basetemp of its own: by
    launcher, the session (test_launched.py reads its report, test_host_protocol.py its hosts'
    logs) or why it could not run."""

    def prepare(folder: Path) -> None:
        suite.write_suite(folder, suite.DIFFERENT_COLLECTION + OWN_BASETEMP)

    return Sessions(lambda name: tmp_path_factory.mktemp(f"differ-{name}"), prepare, 4)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node SLURM cluster on loopback for the whole session, or a skip saying why not."""
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()

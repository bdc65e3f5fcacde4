"""The launchers' fixtures: a SLURM cluster of the session's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .slurm import SlurmCluster, slurm_unavailable


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

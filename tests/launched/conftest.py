"""The launchers' fixtures: a launched session's folder, a SLURM cluster of the session's own."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ddp.groups.spawn import SECRET_ENV
from pytest_ddp.launched.signals import ENDING_SIGNALS

from . import suite
from .slurm import SlurmCluster, slurm_unavailable


@pytest.fixture
def own_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For tests that make a launched world in this process: the world takes SIGINT and SIGTERM
    and its end the launcher's signals: give them back; no secret of the environment's."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    handlers = {number: signal.getsignal(number) for number in ENDING_SIGNALS}
    yield
    for number, handler in handlers.items():
        signal.signal(number, handler)


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """The launched session's folder; no process of it may outlive the test."""
    yield tmp_path
    left = suite.wait_for_no_leftovers(str(tmp_path))
    assert not left, f"left behind: {left}"


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

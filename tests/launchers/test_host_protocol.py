"""What a launched rank's pytest (a host) is told by rank 0's, as its log shows it (torchrun, one machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import suite
from .test_launched import _torchrun_unavailable, torchrun

# Each launched pytest in a basetemp of its own (its log is there), not one that the others wipe.
OWN_BASETEMP = '''
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if _rank.current() is None:
        rank = next(os.environ[name] for name in RANK_VARIABLES if name in os.environ)
        config.option.basetemp = os.path.abspath("basetemp" + rank)
'''


def test_a_host_logs_why_the_session_ended_when_collections_differ(folder: Path) -> None:
    if (why := _torchrun_unavailable()) is not None:
        pytest.skip(why)
    suite.write_suite(folder, suite.DIFFERENT_COLLECTION + OWN_BASETEMP)
    result = suite.run(torchrun(4), folder)
    suite.check_collection_differs(result)
    for rank in (1, 2, 3):
        log = (folder / f"basetemp{rank}" / f"ddp-rank{rank}.log").read_text()
        assert "ddp: the ranks collected different tests" in log and "test_needs_eight" in log, log

"""What a launched rank's pytest (a host) is told by rank 0's, as its log shows it (torchrun, one machine)."""

from __future__ import annotations

from . import suite
from .runs import Sessions, shared


def test_a_host_logs_why_the_session_ended_when_collections_differ(collections_differ: Sessions) -> None:
    # The session test_launched.py's test_collections_that_differ_stop_every_rank reads too
    # (tests/launchers/conftest.py), each launched pytest in a basetemp of its own.
    run = shared(collections_differ, "torchrun")
    suite.check_collection_differs(run.result)
    for rank in (1, 2, 3):
        log = (run.folder / f"basetemp{rank}" / f"ddp-rank{rank}.log").read_text()
        assert "ddp: the ranks collected different tests" in log and "test_needs_eight" in log, log

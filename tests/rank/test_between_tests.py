"""What a warm rank does between tests: the process ledger finds each process a test started and
ends it when its test (or the wider fixture that started it) is over, its scan of /proc reused while
the kernel made no task (rank/leftovers.py), and the environment is put back whatever a test did to
it (rank/session.py).

Real processes, the real /proc, the real os.environ; no ranks.
"""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from pytest_ddp.rank import leftovers
from pytest_ddp.rank.session import SavedEnvironment


def test_the_kernels_count_of_tasks_grows_with_each_thread_and_process() -> None:
    # The ground truth the ledger's reuse of a scan rests on (checked again in every rank).
    before = leftovers.forks_made()
    assert before is not None
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    after_thread = leftovers.forks_made()
    assert after_thread is not None and after_thread > before
    subprocess.run(["true"], check=True)
    after_process = leftovers.forks_made()
    assert after_process is not None and after_process > after_thread


@pytest.fixture
def ledger():
    ledger = leftovers.ProcessLedger()
    ledger.start()
    started: list[subprocess.Popen[bytes]] = []
    yield ledger, started
    for process in started:
        process.kill()
        process.wait()


def test_the_ledger_never_misses_a_process_born_since_its_last_look(ledger) -> None:
    ledger, started = ledger
    first = ledger.alive()
    assert ledger.alive() == first
    started.append(subprocess.Popen(["sleep", "600"]))
    assert started[0].pid in ledger.alive()
    assert ledger.to_end(set()) == [started[0].pid]


def test_a_process_that_ended_since_the_last_look_is_not_ended_or_named(
    ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, started = ledger
    before = set(ledger.alive())
    started.append(subprocess.Popen(["sleep", "600"]))
    ledger.after_setup(before, frozenset({"module"}))
    started[0].kill()
    started[0].wait()
    # No task made since, as far as the ledger can tell (another process's fork would hide the
    # case): its last scan, which still lists the reaped process, is what it would reuse.
    monkeypatch.setattr(leftovers, "forks_made", lambda: ledger._scanned_at)
    assert started[0].pid in ledger.alive()
    assert ledger.to_end(set()) == []


def test_a_process_a_wider_fixture_started_is_kept_until_its_node_is_torn_down(ledger) -> None:
    ledger, started = ledger
    before = set(ledger.alive())
    started.append(subprocess.Popen(["sleep", "600"]))
    ledger.after_setup(before, frozenset({"module", "item"}))
    assert ledger.to_end({"module"}) == []  # the next test of the module: still set up
    assert ledger.to_end({"module"}) == []
    assert ledger.to_end(set()) == [started[0].pid]  # the module was torn down


def test_the_environment_is_put_back_whatever_a_test_did_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DDP_KEPT", "1")
    monkeypatch.setenv("PYTEST_DDP_REMOVED", "2")
    monkeypatch.delenv("PYTEST_DDP_ADDED", raising=False)
    monkeypatch.setenv("PYTEST_DDP_SET", "0")
    saved = SavedEnvironment()
    saved.restore()  # nothing changed
    assert os.environ["PYTEST_DDP_KEPT"] == "1"
    os.environ["PYTEST_DDP_KEPT"] = "changed"
    del os.environ["PYTEST_DDP_REMOVED"]
    os.environ["PYTEST_DDP_ADDED"] = "3"
    saved.restore()
    assert (os.environ["PYTEST_DDP_KEPT"], os.environ["PYTEST_DDP_REMOVED"]) == ("1", "2")
    assert "PYTEST_DDP_ADDED" not in os.environ
    os.environ["PYTEST_DDP_KEPT"] = "changed"  # and back: nothing to do
    os.environ["PYTEST_DDP_KEPT"] = "1"
    saved.restore()
    assert os.environ["PYTEST_DDP_KEPT"] == "1"
    os.environ["PYTEST_DDP_SET"] = "4"  # what the rank sets for later tests (a fresh store's port)
    saved.set("PYTEST_DDP_SET", "4")
    os.environ["PYTEST_DDP_SET"] = "5"
    saved.restore()
    assert os.environ["PYTEST_DDP_SET"] == "4"

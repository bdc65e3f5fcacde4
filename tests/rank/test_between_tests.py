"""What a warm rank does between tests: the process ledger finds each process a test started and
ends it when its test (or the wider fixture that started it) is over, its scan of /proc reused while
the kernel made no task (rank/leftovers.py), the environment is put back whatever a test did to
it (rank/session.py), and so is the rest of the process's state (rank/restore.py).

Real processes, the real /proc, the real os.environ; no ranks.
"""

from __future__ import annotations

import os
import subprocess
import threading
import types

import pytest

from pytest_ddp.rank import leftovers, restore
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


def test_what_a_test_changed_in_its_process_is_put_back(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process: rank/restore.py's snapshot, changed as tests/rank/test_warm_state.py's tests
    # change a rank (whose pairs prove it on real ranks), and put back.
    import logging
    import random
    import sys

    import torch
    import torch.distributed as dist

    monkeypatch.setattr(dist, "all_reduce", dist.all_reduce)  # undone here too if a check fails
    restorer = restore.Restorer(os.path.realpath(os.path.dirname(tmp_path)) + os.sep)
    saved = restorer.take()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(torch.get_num_threads() + 1)
    random.seed(7)
    draw = random.random()
    os.chdir(tmp_path)
    sys.path.append(str(tmp_path))
    (tmp_path / "ddp_written.py").write_text("")
    import ddp_written  # noqa: F401

    sys.modules["ddp_planted"] = types.ModuleType("ddp_planted")
    logging.getLogger().addHandler(logging.NullHandler())
    dist.all_reduce = print  # type: ignore[assignment]
    dist.Backend.register_backend("ddpunit", lambda *args: None, devices=["cpu"])
    restorer.restore(saved)
    assert torch.get_default_dtype() == torch.float32 and restorer.take().flags == saved.flags
    random.seed(7)
    assert random.random() == draw  # as the seed left it: put back
    assert os.getcwd() == saved.cwd and sys.path == saved.path
    assert "ddp_written" not in sys.modules and "ddp_planted" not in sys.modules
    assert not any(type(h) is logging.NullHandler for h in logging.getLogger().handlers)
    assert dist.all_reduce is not print
    assert "ddpunit" not in dist.Backend.backend_list and not hasattr(dist.Backend, "DDPUNIT")


def test_a_wider_fixtures_changes_stay_until_it_is_torn_down(tmp_path) -> None:
    import torch

    stack: dict[object, object] = {}
    session = types.SimpleNamespace(_setupstate=types.SimpleNamespace(stack=stack))
    item = type("Item", (), {"session": session})()  # a node: hashable, as pytest's
    restorer = restore.Restorer(os.path.realpath(tmp_path) + os.sep)

    def run(setup: object, call: object, teardown: object) -> None:
        for hook, body in ((restorer.pytest_runtest_setup, setup), (restorer.pytest_runtest_teardown, teardown)):
            phase = hook(item)
            next(phase)
            body()
            with pytest.raises(StopIteration):
                phase.send(None)
            if hook is restorer.pytest_runtest_setup:
                call()

    def module_setup() -> None:
        stack.update({"module": None, item: None})
        torch.set_default_dtype(torch.float64)

    try:
        run(module_setup, lambda: torch.set_default_dtype(torch.float16), lambda: stack.pop(item))
        assert torch.get_default_dtype() == torch.float64  # the module's, not the test's
        run(lambda: stack.update({item: None}), lambda: None, lambda: stack.clear())
        assert torch.get_default_dtype() == torch.float32  # the module is torn down: as before it
    finally:
        torch.set_default_dtype(torch.float32)


def test_only_a_module_from_pytests_temporary_folder_counts_as_written_by_a_test(tmp_path) -> None:
    """A venv may live in the system's temporary folder (a CI runner's /tmp): its modules are not a
    test's, and importing them again (torch's _inductor.test_operators) fails."""
    basetemp, venv = tmp_path / "basetemp", tmp_path / "venv"

    def module_at(path) -> types.ModuleType:
        module = types.ModuleType("m")
        module.__spec__ = types.SimpleNamespace(origin=str(path))  # type: ignore[assignment]
        return module

    written_under = os.path.realpath(basetemp) + os.sep
    assert restore._written_by_a_test(module_at(basetemp / "test_x0" / "planted.py"), written_under)
    assert not restore._written_by_a_test(module_at(venv / "site-packages" / "torch" / "x.py"), written_under)
    assert not restore._written_by_a_test(module_at(basetemp / "m.py"), "")  # no tmpdir plugin

"""What a warm rank does between tests: the process ledger finds each process a test started, its
scan of /proc reused while the kernel made no task (rank/leftovers.py); the environment is put back
whatever a test did to it, and so is the rest of the process's state, until a wider fixture that
changed it or started a process is torn down (rank/restore.py).  The rank's session (rank/session.py),
driven in this process, tears down the fixtures kept for an item sent elsewhere before the next
item, and tells a thread that raises there or in a test's phases.

Real processes, the real /proc, the real os.environ; no ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
import warnings

import pytest

from pytest_ddp.common.protocol import Done, Fatal, Report, RunItem, SessionEnd, TestStart, ThreadRaised
from pytest_ddp.rank import leftovers, restore, session


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
    started.append(subprocess.Popen(["sleep", "600"]))
    assert started[0].pid in ledger.alive()
    started[0].kill()
    started[0].wait()
    # No task made since, as far as the ledger can tell (another process's fork would hide the
    # case): its last scan, which still lists the reaped process, is what it would reuse.
    monkeypatch.setattr(leftovers, "forks_made", lambda: ledger._scanned_at)
    assert started[0].pid in ledger.alive()
    assert ledger.to_end(set()) == []


def test_the_environment_is_put_back_whatever_a_test_did_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_DDP_KEPT", "1")
    monkeypatch.setenv("PYTEST_DDP_REMOVED", "2")
    monkeypatch.delenv("PYTEST_DDP_ADDED", raising=False)
    monkeypatch.setenv("PYTEST_DDP_SET", "0")
    saved = dict(os.environ)
    restore.environment(saved)  # nothing changed
    assert os.environ["PYTEST_DDP_KEPT"] == "1"
    os.environ["PYTEST_DDP_KEPT"] = "changed"
    del os.environ["PYTEST_DDP_REMOVED"]
    os.environ["PYTEST_DDP_ADDED"] = "3"
    restore.environment(saved)
    assert (os.environ["PYTEST_DDP_KEPT"], os.environ["PYTEST_DDP_REMOVED"]) == ("1", "2")
    assert "PYTEST_DDP_ADDED" not in os.environ
    os.environ["PYTEST_DDP_KEPT"] = "changed"  # and back: nothing to do
    os.environ["PYTEST_DDP_KEPT"] = "1"
    restore.environment(saved)
    assert os.environ["PYTEST_DDP_KEPT"] == "1"
    os.environ["PYTEST_DDP_SET"] = "4"  # what the rank sets for later tests (a fresh store's port)
    saved["PYTEST_DDP_SET"] = "4"
    os.environ["PYTEST_DDP_SET"] = "5"
    restore.environment(saved)
    assert os.environ["PYTEST_DDP_SET"] == "4"


def test_what_a_test_changed_in_its_process_is_put_back(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process: rank/restore.py's snapshot, changed as tests/rank/test_warm_state.py's tests
    # change a rank (whose pairs prove it on real ranks), and put back.
    import logging
    import random

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
    assert torch.get_default_dtype() == torch.float32 and str(tmp_path) not in sys.path
    assert restorer.take().settings == saved.settings  # the working directory too, and torch's flags
    random.seed(7)
    assert random.random() == draw  # as the seed left it: put back
    assert "ddp_written" not in sys.modules and "ddp_planted" not in sys.modules
    assert not any(type(h) is logging.NullHandler for h in logging.getLogger().handlers)
    assert dist.all_reduce is not print
    assert "ddpunit" not in dist.Backend.backend_list and not hasattr(dist.Backend, "DDPUNIT")


class _Item:
    """A test item as the restorer reads it: a node (hashable), its session's set-up nodes (pytest's
    ``SetupState.stack``: a node's finalizers, one added by each fixture set up in its scope)."""

    path, location = "test_x.py", ("test_x.py", 0, "test_x")

    def __init__(self) -> None:
        self.stack: dict[object, tuple[list[object], None]] = {}
        setupstate = types.SimpleNamespace(stack=self.stack, teardown_exact=self.teardown_exact)
        self.session = types.SimpleNamespace(_setupstate=setupstate)

    def teardown_exact(self, nextitem: None) -> None:
        """Every node torn down, as pytest's SetupState does after the last item."""
        self.stack.clear()

    def set_up(self, node: object) -> None:
        """A fixture of ``node``'s scope set up (``node`` set up first where it is not)."""
        self.stack.setdefault(node, ([], None))[0].append(print)


def _run(restorer: restore.Restorer, item: _Item, setup, call, teardown) -> None:
    """A test's setup, call and teardown, each phase inside the restorer's hooks as in a rank."""
    for hook, body in ((restorer.pytest_runtest_setup, setup), (restorer.pytest_runtest_teardown, teardown)):
        phase = hook(item)
        next(phase)
        body()
        with pytest.raises(StopIteration):
            phase.send(None)
        if hook is restorer.pytest_runtest_setup:
            call()


def test_a_wider_fixtures_changes_stay_until_it_is_torn_down(tmp_path) -> None:
    import torch

    item = _Item()
    restorer = restore.Restorer(os.path.realpath(tmp_path) + os.sep)

    def module_setup() -> None:
        item.set_up("module")
        item.set_up(item)
        torch.set_default_dtype(torch.float64)

    def second_setup() -> None:  # a module fixture first set up by the module's second test
        item.set_up(item)
        item.set_up("module")
        sys.path.append("/module-fixture")

    try:
        test_changes = lambda: torch.set_default_dtype(torch.float16)
        _run(restorer, item, module_setup, test_changes, lambda: item.stack.pop(item))
        assert torch.get_default_dtype() == torch.float64  # the module's, not the test's
        _run(restorer, item, second_setup, lambda: None, lambda: item.stack.pop(item))
        assert "/module-fixture" in sys.path and torch.get_default_dtype() == torch.float64
        _run(restorer, item, lambda: item.set_up(item), lambda: None, item.stack.clear)
        assert torch.get_default_dtype() == torch.float32  # the module is torn down: as before it
        assert "/module-fixture" not in sys.path
    finally:
        torch.set_default_dtype(torch.float32)


# The rank's own teardowns (its next item went elsewhere, or the group stops: rank/session.py) go
# through the restorer too, which ends the fixture's process then, not after a later test.
@pytest.mark.parametrize("torn_down_by", ["the next test", "the rank"])
def test_a_process_a_wider_fixture_started_is_ended_once_it_is_torn_down(tmp_path, torn_down_by) -> None:
    item = _Item()
    restorer = restore.Restorer(os.path.realpath(tmp_path) + os.sep)
    started: list[subprocess.Popen[bytes]] = []

    def module_setup() -> None:
        item.set_up("module")
        started.append(subprocess.Popen(["sleep", "600"]))

    try:
        _run(restorer, item, module_setup, lambda: None, lambda: None)
        assert started[0].poll() is None  # the next test of the module: still set up
        ended = rf"ended: pid {started[0].pid} \(sleep 600\)$"
        with pytest.warns(leftovers.LeftoverProcessWarning, match=ended):
            if torn_down_by == "the rank":
                restorer.teardown_exact(item, None)
            else:
                _run(restorer, item, lambda: None, lambda: None, item.stack.clear)
        assert item.stack == {} and started[0].poll() is not None  # ended with its module, and reaped
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_the_rank_is_put_back_when_the_users_filters_make_the_leftover_warning_an_error(tmp_path) -> None:
    import torch

    item = _Item()
    restorer = restore.Restorer(os.path.realpath(tmp_path) + os.sep)
    started: list[subprocess.Popen[bytes]] = []

    def call() -> None:
        started.append(subprocess.Popen(["sleep", "600"]))
        torch.set_default_dtype(torch.float16)

    setup = restorer.pytest_runtest_setup(item)
    next(setup)
    item.set_up(item)
    with pytest.raises(StopIteration):
        setup.send(None)
    try:
        call()
        teardown = restorer.pytest_runtest_teardown(item)
        next(teardown)
        item.stack.pop(item)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # filterwarnings = error, -W error
            with pytest.raises(leftovers.LeftoverProcessWarning):
                teardown.send(None)
        assert torch.get_default_dtype() == torch.float32  # put back all the same
        assert restorer.test is None
    finally:
        torch.set_default_dtype(torch.float32)
        for process in started:
            process.kill()
            process.wait()


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


class _Channel:
    """A rank's channel as its session uses it: the controller's commands, the events it is told."""

    def __init__(self, commands: list[RunItem]) -> None:
        self.commands_left = commands
        self.events: list[object] = []

    def commands(self, accepted: type) -> list[RunItem]:
        return self.commands_left

    def event(self, event: object, wake: bool = False) -> None:
        self.events.append(event)

    def start_test(self, test_id: str, faults: tuple[object, ...]) -> None:
        self.events.append(TestStart(test_id))

    def test_done(self, threads_left: list[dict[str, str]], interrupted: object = None) -> None:
        self.events.append(Done(threads_left=threads_left))


# A module fixture's body and what its teardown raises: an error of its own, or the restorer's warning
# that it ended the fixture's process, which the user's filters make an error.
KEPT = {
    "raises": ("yield\n    raise RuntimeError('the teardown failed')", "RuntimeError: the teardown failed"),
    "leaves a process": (
        "subprocess.Popen(['sleep', '600'])\n    yield",
        "LeftoverProcessWarning: processes the test left running were ended: pid",
    ),
}


@pytest.mark.parametrize("teardown", KEPT)
def test_a_failed_teardown_of_fixtures_kept_for_an_item_run_elsewhere_fails_the_next_items_setup(
    pytester: pytest.Pytester, teardown: str
) -> None:
    """The group's next item went to another xdist worker, so the rank tears its module's fixtures
    down itself, before its next item: what that raises is that item's setup error, and the session
    goes on (it was an INTERNALERROR, which ended the rank)."""
    body, error = KEPT[teardown]
    kept_module = f"import subprocess, pytest\n\n@pytest.fixture(scope='module')\ndef kept():\n    {body}\n"
    kept_module += "\ndef test_a(kept):\n    pass\n\ndef test_b(kept):\n    pass\n"
    plain = "def test_it():\n    pass\n"
    pytester.makepyfile(test_first=plain, test_kept=kept_module, test_other=plain)
    # The first test sets the session's nodes up: what test_a's setup starts is its module's alone.
    first = RunItem("test_first.py::test_it", "test_kept.py::test_a")
    kept = RunItem("test_kept.py::test_a", "test_kept.py::test_b")  # test_b: sent elsewhere
    channel = _Channel([first, kept, RunItem("test_other.py::test_it")])
    restorer = restore.Restorer()
    plugins = [session.RankSession(channel, restorer), restorer]
    pytester.inline_run("-p", "no:cacheprovider", "-W", "error::pytest.PytestWarning", plugins=plugins)
    reports = [(e.when, e.outcome) for e in channel.events if isinstance(e, Report)]
    passed = [("setup", "passed"), ("call", "passed"), ("teardown", "passed")]
    assert reports == [*passed, *passed, ("setup", "failed"), ("teardown", "passed")]
    failed = next(e for e in channel.events if isinstance(e, Report) and e.outcome == "failed")
    assert error in str(failed.data)
    assert not [e for e in channel.events if isinstance(e, Fatal)]
    assert isinstance(channel.events[-1], SessionEnd) and channel.events[-1].outcome == "passed"


THREADS = """
import threading, pytest

def thread_raises(name):
    thread = threading.Thread(target=lambda: 1 / 0, name=name)
    thread.start()
    thread.join()

@pytest.fixture(scope="module")
def kept():
    yield
    thread_raises("kept's teardown")

@pytest.fixture
def each():
    thread_raises("setup")
    yield
    thread_raises("teardown")

def test_a(kept, each):
    thread_raises("call")

def test_b(kept):
    pass
"""


def test_a_thread_that_raises_in_each_phase_and_in_the_teardown_of_kept_fixtures_is_told(
    pytester: pytest.Pytester,
) -> None:
    """Told to the controller as it happens, under the test that is running: the kept fixtures' teardown
    is the next item's (under pytest 8.0 to 8.3, setup's was not told: rank/session.py's _interruptible)."""
    pytester.makepyfile(test_threads=THREADS, test_other="def test_it():\n    pass\n")
    kept = RunItem("test_threads.py::test_a", "test_threads.py::test_b")  # test_b: sent elsewhere
    channel = _Channel([kept, RunItem("test_other.py::test_it")])
    restorer = restore.Restorer()
    pytester.inline_run("-p", "no:cacheprovider", plugins=[session.RankSession(channel, restorer), restorer])
    said = [
        event.id if isinstance(event, TestStart) else f"thread {event.thread}"
        for event in channel.events
        if isinstance(event, (TestStart, ThreadRaised))
    ]
    assert said == [
        "test_threads.py::test_a", "thread setup", "thread call", "thread teardown",
        "test_other.py::test_it", "thread kept's teardown",
    ]

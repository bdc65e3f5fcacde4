"""What a test leaves in its rank's process: put back or ended after its teardown, so that the next
test on the warm rank sees what a fresh rank would, in any order (docs/design.md, "What a test leaves
in a warm rank", lists each piece of state and what is done about it).

Each piece is compared (or, the RNGs, set) in microseconds; only what differs is put back, so a test
that undoes its own change costs nothing more.  A wider fixture (a module's, a class's, the
session's) set up in a test's setup owns what that setup changed, the processes it started and the
default group it made, until it is torn down.  os.environ is put back before each test instead
(:func:`environment`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_ddp.rank import default_group, leftovers

Setting = tuple[Callable[[], Any], Callable[[Any], Any]]  # (read, write)
# (owner, its names, which of the names a test adds are dropped)
Namespace = tuple[Any, dict[str, Any], Callable[[Any], bool]]


def _settings() -> list[Setting]:
    """Each process-wide setting a test may change: the working directory, sys.path,
    ``logging.disable``, and torch's modes, flags and backend tables where torch is imported."""
    settings: list[Setting] = [
        (os.getcwd, os.chdir),
        (lambda: list(sys.path), _set_path),
        (lambda: logging.root.manager.disable, logging.disable),
    ]
    if "torch" not in sys.modules:
        return settings
    import torch

    backends = torch.backends

    def attribute(owner: Any, name: str) -> Setting:
        return lambda: getattr(owner, name), lambda value: setattr(owner, name, value)

    settings += [
        (torch.get_default_dtype, torch.set_default_dtype),
        (torch.is_grad_enabled, torch.set_grad_enabled),
        (
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda value: torch.set_anomaly_enabled(*value),
        ),
        (
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1]),
        ),
        (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        (torch.get_num_threads, torch.set_num_threads),
        attribute(backends.cudnn, "enabled"),
        attribute(backends.cudnn, "benchmark"),
        attribute(backends.cudnn, "deterministic"),
        attribute(backends.cudnn, "allow_tf32"),
        attribute(backends.mkldnn, "enabled"),
        attribute(backends.cuda.matmul, "allow_tf32"),
    ]
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is not None:
        tables = [getattr(c10d.Backend, name) for name in _BACKEND_TABLES]
        settings += [(table.copy, functools.partial(_refill, table)) for table in tables]
    return settings


def _set_path(value: list[str]) -> None:
    sys.path[:] = value


def _refill(table: Any, saved: Any) -> None:
    """Emptied and filled in place: torch's functions hold these objects."""
    table.clear()
    if isinstance(table, dict):
        table.update(saved)
    else:
        table.extend(saved)


# What Backend.register_backend fills in, besides an attribute of Backend named after the backend.
_BACKEND_TABLES = (
    "backend_list", "default_device_backend_map", "backend_type_map", "backend_capability", "_plugins",
)  # fmt: skip


@dataclass
class Snapshot:
    """A rank's process-wide state at one moment (torch's, where torch is imported)."""

    settings: list[Any]
    rngs: list[tuple[Callable[[Any], Any], Any]]  # (setter, state)
    modules: dict[str, Any]
    loggers: list[tuple[logging.Logger, int, list[logging.Handler], bool, bool]]
    namespaces: list[Namespace]


@dataclass
class _Scope:
    """A wider node a test's setup set a fixture up in, and what it owns until it is torn down."""

    before: Snapshot  # the state before that setup
    processes: set[int] = field(default_factory=set)  # started in that setup


class Restorer:
    """The rank session's plugin that puts back what each test changed and ends what it started."""

    def __init__(self, written_under: str | None = None) -> None:
        self.settings: list[Setting] | None = None  # at the first test
        self.processes: leftovers.ProcessLedger | None = None  # at the first test: the rest are not a test's
        self.test: Snapshot | None = None  # the state the running test must leave
        self.clean: Snapshot | None = None  # the state the last test's end put back
        self.wider: dict[Any, _Scope] = {}  # in the order first grown: the earliest state first
        # pytest's temporary folder (tmp_path, tmp_path_factory): a module imported from there was
        # written by a test, and a later test that writes one of the same name must import its own.
        # Not the system's temporary folder: a venv may live there (a CI runner's /tmp).
        self.written_under = written_under  # None: taken from the first test's config

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest's log capture, which adds handlers
    def pytest_runtest_setup(self, item: Any) -> Any:
        if self.written_under is None:
            factory = getattr(item.config, "_tmp_path_factory", None)
            self.written_under = os.path.realpath(factory.getbasetemp()) + os.sep if factory else ""
        if self.processes is None:
            self.processes = leftovers.ProcessLedger()
        processes = self.processes
        before = _finalizers(item)
        running = set(processes.alive())
        # What the last test's end put back is still there: renewing a process group between
        # tests (rank/default_group.py) changes nothing taken here.
        snapshot = self.clean or self.take()
        try:
            return (yield)
        finally:
            # A fixture set up adds a finalizer to its scope's node (a node set up, its own).
            after = _finalizers(item)
            wider = [node for node in after if node is not item and after[node] > before.get(node, -1)]
            started = set(processes.alive()) - running - processes.kept
            for node in wider:
                self.wider.setdefault(node, _Scope(snapshot)).processes.update(started)
            if wider:
                default_group.outlives_test()
            self.test = self.take() if wider else snapshot

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: Any) -> Any:
        try:
            return (yield)
        finally:
            self._put_back(item)

    def teardown_exact(self, item: Any, nextitem: Any) -> None:
        """pytest's teardown of the nodes set up that ``nextitem`` does not need (None: every one),
        outside a test's (rank/session.py), ending and putting back what they left as a test's."""
        try:
            item.session._setupstate.teardown_exact(nextitem)
        finally:
            self._put_back(item)

    def _put_back(self, item: Any) -> None:
        """After a teardown: end the processes left, put back what the test or the nodes torn down changed."""
        try:
            self._end_processes(item)  # its warning raises where the user's filters make it an error
        finally:
            if not self._torn_down(item) and self.test is not None:
                self.restore(self.test)
            self.test = None

    def _end_processes(self, item: Any) -> None:
        """End the processes the test left, but those a wider node still set up owns, and name them."""
        stack = item.session._setupstate.stack
        owned = {pid for node, scope in self.wider.items() if node in stack for pid in scope.processes}
        ending = self.processes.to_end(owned) if self.processes is not None else []
        if ending:
            described = ", ".join(leftovers.describe(pid) for pid in ending)
            leftovers.end_processes(ending)
            message = f"processes the test left running were ended: {described}"
            category = leftovers.LeftoverProcessWarning
            warnings.warn_explicit(category(message), category, str(item.path), item.location[1] + 1)

    def _torn_down(self, item: Any) -> bool:
        """Put back what was there before the first of the wider nodes torn down since; whether any was."""
        stack = item.session._setupstate.stack
        gone = [node for node in self.wider if node not in stack]
        if gone:
            self.restore(self.wider[gone[0]].before)
        for node in gone:
            del self.wider[node]
        return bool(gone)

    def take(self) -> Snapshot:
        if self.settings is None:
            self.settings = _settings()
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        return Snapshot(
            settings=[read() for read, _ in self.settings],
            rngs=_rngs(),
            modules=dict(sys.modules),
            loggers=[
                (logger, logger.level, list(logger.handlers), logger.propagate, logger.disabled)
                for logger in loggers
                if isinstance(logger, logging.Logger)  # not a PlaceHolder
            ],
            namespaces=_namespaces(),
        )

    def restore(self, saved: Snapshot) -> None:
        self.clean = saved
        for (read, write), value in zip(self.settings or [], saved.settings, strict=True):
            if read() != value:
                write(value)
        for write, state in saved.rngs:
            write(state)
        _restore_modules(saved.modules, self.written_under or "")
        _restore_loggers(saved)
        for owner, names, added in saved.namespaces:
            _restore_names(owner, names, added)


def environment(saved: dict[str, str]) -> None:
    """Put os.environ back as ``saved``."""
    for key in [key for key in os.environ if key not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _finalizers(item: Any) -> dict[Any, int]:
    """How many finalizers each node set up holds."""
    return {node: len(finalizers) for node, (finalizers, _) in item.session._setupstate.stack.items()}


def _rngs() -> list[tuple[Callable[[Any], Any], Any]]:
    import random

    rngs: list[tuple[Callable[[Any], Any], Any]] = [(random.setstate, random.getstate())]
    torch = sys.modules.get("torch")
    if torch is not None:
        rngs.append((torch.set_rng_state, torch.get_rng_state()))
        if torch.cuda.is_initialized():
            rngs.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        rngs.append((numpy.random.set_state, numpy.random.get_state()))
    return rngs


def _restore_modules(saved: dict[str, Any], written_under: str) -> None:
    """Drop the modules a test planted (no import made them: no spec) or imported from pytest's
    temporary folder (``written_under``), and put back a module a planted one replaced.  Others a
    test imported stay, as they would in one pytest process: importing some (an extension) twice
    fails."""
    if sys.modules == saved:
        return
    for name, module in list(sys.modules.items()):
        if saved.get(name) is module:
            continue
        if name in saved and getattr(module, "__spec__", None) is None:
            sys.modules[name] = saved[name]
        elif name not in saved and _written_by_a_test(module, written_under):
            del sys.modules[name]
    # What stays is kept from now on: the next test compares equal at once (a module imported
    # lazily once would otherwise send every later test down this loop).
    saved.clear()
    saved.update(sys.modules)


def _written_by_a_test(module: Any, written_under: str) -> bool:
    if getattr(module, "__spec__", None) is None:
        return True
    origin = getattr(module.__spec__, "origin", None) or ""
    return bool(written_under) and os.path.realpath(origin).startswith(written_under)


def _restore_loggers(saved: Snapshot) -> None:
    """Loggers that were there get their level, handlers and flags back; one a test made keeps
    what it was given (a module imported meanwhile may have made it, and stays)."""
    for logger, level, handlers, propagate, disabled in saved.loggers:
        if logger.level != level:
            logger.setLevel(level)
        if logger.handlers != handlers:
            logger.handlers[:] = handlers
        logger.propagate, logger.disabled = propagate, disabled


def _namespaces() -> list[Namespace]:
    """torch.distributed's and distributed_c10d's functions and classes (torch rebinds its other
    globals itself: a group count), and Backend's attributes (register_backend adds one per backend)."""
    found: list[Namespace] = []
    for name in ("torch.distributed", "torch.distributed.distributed_c10d"):
        module = sys.modules.get(name)
        if module is not None:
            functions = {key: value for key, value in vars(module).items() if callable(value)}
            found.append((module, functions, callable))
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is not None:
        found.append((c10d.Backend, dict(vars(c10d.Backend)), lambda value: True))
    return found


def _restore_names(owner: Any, saved: dict[str, Any], added: Callable[[Any], bool]) -> None:
    """Put back a name a test replaced or deleted; drop one it added (not a submodule: importing one
    adds it)."""
    namespace = vars(owner)
    for name, value in saved.items():
        if namespace.get(name) is not value:
            setattr(owner, name, value)
    for name in [name for name, value in namespace.items() if name not in saved and added(value)]:
        delattr(owner, name)

"""What a test changes in its rank's process and leaves: put back after its teardown, so that the
next test on the warm rank sees what a fresh rank would, in any order.

Taken before a test's setup, put back after its teardown: torch's default dtype, grad and anomaly
modes, deterministic and backend flags, its thread count, the RNGs (torch's, ``random``'s,
numpy's), the working directory, ``sys.path``, modules a test planted in ``sys.modules`` or
imported from pytest's temporary folder, logging's levels and handlers, ``torch.distributed``'s
functions and registered backends.  Each is compared (or, the RNGs, set) in microseconds; only what
differs is put back, so a test that undoes its own change costs nothing more.  A wider fixture
(a module's, a class's) set up in a test's setup owns what that setup changed, until it is torn
down.  os.environ: :class:`pytest_ddp.rank.session.SavedEnvironment`; a default process group a
test ended or made: :mod:`pytest_ddp.rank.default_group`.  Subgroups and store keys stay, as in
one pytest process: libraries cache their groups across tests (docs/design.md says why).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest


def _flags() -> list[tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """(read, write) of each of torch's process-wide modes and flags a test may set."""
    import torch

    backends = torch.backends

    def attribute(owner: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
        return lambda: getattr(owner, name), lambda value: setattr(owner, name, value)

    return [
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


# What Backend.register_backend fills in, besides an attribute of Backend named after the backend.
_BACKEND_TABLES = (
    "backend_list", "default_device_backend_map", "backend_type_map", "backend_capability", "_plugins",
)  # fmt: skip


@dataclass
class Snapshot:
    """A rank's process-wide state at one moment (torch's, where torch is imported)."""

    flags: list[Any]
    rngs: list[tuple[Callable[[Any], Any], Any]]  # (setter, state)
    cwd: str
    path: list[str]
    modules: dict[str, Any]
    loggers: list[tuple[logging.Logger, int, list[logging.Handler], bool, bool]]
    logging_disabled: int
    functions: list[tuple[Any, dict[str, Any]]]  # (module, its callables)
    backends: list[tuple[str, Any]]  # (name, copy) of Backend's tables, and its attribute names


class Restorer:
    """The rank session's plugin that takes a :class:`Snapshot` around each test and puts it back."""

    def __init__(self, written_under: str | None = None) -> None:
        self.flags: list[tuple[Callable[[], Any], Callable[[Any], Any]]] | None = None  # at the first test
        self.test: Snapshot | None = None  # the state the running test must leave
        self.clean: Snapshot | None = None  # the state the last test's end put back
        self.wider: dict[Any, Snapshot] = {}  # a wider node -> the state before its setup
        # pytest's temporary folder (tmp_path, tmp_path_factory): a module imported from there was
        # written by a test, and a later test that writes one of the same name must import its own.
        # Not the system's temporary folder: a venv may live there (a CI runner's /tmp).
        self.written_under = written_under  # None: taken from the first test's config

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest's log capture, which adds handlers
    def pytest_runtest_setup(self, item: Any) -> Any:
        self._torn_down(item)  # kept for a next test that went elsewhere (rank/session.py)
        if self.written_under is None:
            factory = getattr(item.config, "_tmp_path_factory", None)
            self.written_under = os.path.realpath(factory.getbasetemp()) + os.sep if factory else ""
        before = set(item.session._setupstate.stack)
        # What the last test's end put back is still there: renewing a process group between
        # tests (rank/default_group.py) changes nothing taken here.
        snapshot = self.clean or self.take()
        try:
            return (yield)
        finally:
            stack = item.session._setupstate.stack
            grown = [node for node in stack if node not in before and node is not item]
            for node in grown:
                self.wider[node] = snapshot
            self.test = self.take() if grown else snapshot

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: Any) -> Any:
        try:
            return (yield)
        finally:
            if not self._torn_down(item) and self.test is not None:
                self.restore(self.test)
            self.test = None

    def _torn_down(self, item: Any) -> bool:
        """Put back what was there before the outermost wider node torn down since; whether any was."""
        stack = item.session._setupstate.stack
        gone = [node for node in self.wider if node not in stack]
        if gone:
            self.restore(self.wider[gone[0]])  # the first set up: the outermost
        for node in gone:
            del self.wider[node]
        return bool(gone)

    def take(self) -> Snapshot:
        if self.flags is None:
            self.flags = _flags() if "torch" in sys.modules else []
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        return Snapshot(
            flags=[read() for read, _ in self.flags],
            rngs=_rngs(),
            cwd=os.getcwd(),
            path=list(sys.path),
            modules=dict(sys.modules),
            loggers=[
                (logger, logger.level, list(logger.handlers), logger.propagate, logger.disabled)
                for logger in loggers
                if isinstance(logger, logging.Logger)  # not a PlaceHolder
            ],
            logging_disabled=logging.root.manager.disable,
            functions=[(module, _callables(module)) for module in _distributed()],
            backends=_backends(),
        )

    def restore(self, saved: Snapshot) -> None:
        self.clean = saved
        for (read, write), value in zip(self.flags or [], saved.flags, strict=True):
            if read() != value:
                write(value)
        for write, state in saved.rngs:
            write(state)
        if os.getcwd() != saved.cwd:
            os.chdir(saved.cwd)
        if sys.path != saved.path:
            sys.path[:] = saved.path
        _restore_modules(saved.modules, self.written_under or "")
        _restore_logging(saved)
        for module, callables in saved.functions:
            _restore_callables(module, callables)
        _restore_backends(saved.backends)


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


def _restore_logging(saved: Snapshot) -> None:
    """Loggers that were there get their level, handlers and flags back; one a test made keeps
    what it was given (a module imported meanwhile may have made it, and stays)."""
    manager = logging.Logger.manager
    if manager.disable != saved.logging_disabled:
        logging.disable(saved.logging_disabled)
    for logger, level, handlers, propagate, disabled in saved.loggers:
        if logger.level != level:
            logger.setLevel(level)
        if logger.handlers != handlers:
            logger.handlers[:] = handlers
        logger.propagate, logger.disabled = propagate, disabled


def _distributed() -> list[Any]:
    return [sys.modules[name] for name in ("torch.distributed", "torch.distributed.distributed_c10d")
            if name in sys.modules]  # fmt: skip


def _callables(module: Any) -> dict[str, Any]:
    """A module's functions and classes: torch rebinds its other globals itself (a group count)."""
    return {name: value for name, value in vars(module).items() if callable(value)}


def _restore_callables(module: Any, saved: dict[str, Any]) -> None:
    """Put back a function or class a test replaced or deleted; drop one it added (not a
    submodule: importing one adds it)."""
    namespace = vars(module)
    for name, value in saved.items():
        if namespace.get(name) is not value:
            setattr(module, name, value)
    for name in [name for name, value in namespace.items() if name not in saved and callable(value)]:
        del namespace[name]


def _backends() -> list[tuple[str, Any]]:
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return []
    backend = c10d.Backend
    tables = [(name, getattr(backend, name).copy()) for name in _BACKEND_TABLES]
    return [*tables, ("", set(vars(backend)))]


def _restore_backends(saved: list[tuple[str, Any]]) -> None:
    """Forget a backend a test registered (Backend.register_backend fills these tables)."""
    if not saved:
        return
    backend = sys.modules["torch.distributed.distributed_c10d"].Backend
    for name, table in saved[:-1]:
        current = getattr(backend, name)
        if current != table:  # emptied and filled in place: torch's functions hold these objects
            current.clear()
            if isinstance(current, dict):
                current.update(table)
            else:
                current.extend(table)
    for name in set(vars(backend)) - saved[-1][1]:
        delattr(backend, name)

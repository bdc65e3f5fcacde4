"""torch's distributed test classes in a rank: what torch's harness does in the processes it spawns
happens in the ranks instead, and what its main process does, in each rank together.

``MultiProcessTestCase``: ``_spawn_processes`` makes this process the one torch would spawn for its
rank, ``_join_processes`` runs what the child runs (``cls._run``, so a class's own ``_run`` holds),
then every rank draws the main process's verdict (:func:`process_test`).

``MultiProcContinuousTest``: the class's ``_init_pg`` makes its group as its first test sets up,
until the class is torn down; its queues are the rank's own :class:`_Worker`.  No poison pill: a
failed test does not skip the rest of its class.

A rank's end, as the verdicts read it: ``{"end": "ok" | "error" | "skip" | "exit", "code": exit
code, "reason": first line}``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import tempfile
import unittest
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_ddp.adopt.exchange import exchange
from pytest_ddp.common.ops import BROADCAST_OBJECTS, GATHER_OBJECTS
from pytest_ddp.rank import default_group
from pytest_ddp.rank.context import rank_context

# A rank's own variables, which a spawned process of torch's does not take from the main one.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "ROLE_RANK", "GROUP_RANK")


class AdoptError(RuntimeError):
    """An adopted class does what pytest-ddp cannot honour on warm ranks: names the class and the feature."""


class AdoptedFailure(AssertionError):
    """The test fails under torch's harness for what another rank did, or for an exit code."""


class AdoptedExitWarning(UserWarning):
    """A rank other than 0 exited with a code torch's harness does not read."""


def install() -> None:
    """Patch torch's harness classes in this rank (once: a second patch would wrap the first
    ``_no_poison_pill``): a rank runs adopted classes only."""
    from torch.testing._internal import common_distributed

    process: Any = common_distributed.MultiProcessTestCase
    if process._join_processes is _join:  # patched already
        return
    process._spawn_processes = _spawn
    process._start_processes = _spawn
    process._join_processes = _join
    continuous: Any = common_distributed.MultiProcContinuousTest
    continuous._spawn_processes = classmethod(_join_class_group)
    ensure = continuous._ensure_processes_spawned.__func__
    continuous._ensure_processes_spawned = classmethod(functools.partial(_no_poison_pill, ensure))


def _check_world_size(cls: type, world_size: int) -> None:
    group = rank_context().world_size
    if world_size != group:
        raise AdoptError(
            f"{cls.__qualname__}: world_size is {world_size} in the rank, {group} when it was collected: "
            "pytest-ddp runs an adopted test on the world size its class has at collection"
        )


def _rendezvous_file() -> str:
    """A new file in the group's folder, for a FileStore every rank of the group opens."""
    folder = Path(rank_context().group_dir or tempfile.gettempdir()) / "adopted"
    folder.mkdir(exist_ok=True)
    handle, path = tempfile.mkstemp(prefix="store-", dir=folder)
    os.close(handle)
    os.remove(path)  # a FileStore starts on no file (or an empty one)
    return path


def _skip_message(code: Any) -> str | None:
    """The skip of torch's harness that an exit code stands for (``TEST_SKIPS``), if any."""
    from torch.testing._internal.common_distributed import TEST_SKIPS

    return next((skip.message for skip in TEST_SKIPS.values() if skip.exit_code == code), None)


def _expects_failure(test: Any, fn: Any) -> bool:
    expecting = "__unittest_expecting_failure__"
    return bool(getattr(fn, expecting, False) or getattr(test, expecting, False))


@dataclass(frozen=True)
class Verdict:
    """What torch's harness makes of a test from how each of its processes ended."""

    outcome: str  # "passed", "skipped", "failed"
    reason: str = ""
    culprits: tuple[int, ...] = ()  # where it failed, the ranks at fault


def process_test(ends: list[dict[str, Any]], any_exit_code: bool = False) -> Verdict:
    """``MultiProcessTestCase``'s main process (``_check_return_codes``): a rank that raised fails the
    test; else rank 0's exit code decides, and no other's: a skip code skips the test, a code other
    than 0 fails it (unless the test may end with any code, ``skip_return_code_checks``)."""
    errored = tuple(rank for rank, end in enumerate(ends) if end["end"] == "error")
    if errored:
        return Verdict("failed", ends[errored[0]]["reason"], errored)
    first = ends[0]
    if any_exit_code:
        return Verdict("passed")
    if first["end"] == "skip":
        return Verdict("skipped", first["reason"])
    if first["end"] == "exit":
        return Verdict("failed", f"rank 0 exited with code {first['code']}; torch's harness expects 0", (0,))
    return Verdict("passed")


def continuous_test(ends: list[dict[str, Any]]) -> Verdict:
    """``MultiProcContinuousTest``'s main process (``_worker_run_main_wait``): the first rank, in rank
    order, whose test did not pass decides: its skip skips the test, its error fails it."""
    for end in ends:
        if end["end"] == "skip":
            return Verdict("skipped", end["reason"])
        if end["end"] != "ok":
            culprits = tuple(rank for rank, other in enumerate(ends) if other["end"] in ("error", "exit"))
            return Verdict("failed", end["reason"], culprits)
    return Verdict("passed")


def _abide(found: Verdict, error: BaseException | None, expects_failure: bool) -> None:
    """This rank's part of torch's verdict: the ranks at fault fail with their own error, the others
    too where a failure is expected; a skip skips every rank."""
    if found.outcome == "skipped":
        raise unittest.SkipTest(found.reason)
    if found.outcome != "failed":
        return
    if rank_context().rank in found.culprits:
        if error is not None:
            raise error.with_traceback(error.__traceback__)
        raise AdoptedFailure(found.reason)
    if expects_failure:
        raise AdoptedFailure(f"rank {found.culprits[0]} failed: {found.reason}")


@contextlib.contextmanager
def as_in_a_spawned_process() -> Iterator[None]:
    """The loggers as a process torch's harness spawns has them, until the block ends: each that does
    not propagate without the root logger's handlers, which pytest's logging plugin (9.1 on) puts on it
    too (torch's ``test_get_or_create_logger`` asserts ``c10d``'s holds only its own).  The root logger
    keeps them, so the test's log still reaches the rank's report."""
    root = logging.getLogger()
    shared = list(root.handlers)
    taken: list[tuple[logging.Logger, list[logging.Handler]]] = []
    for logger in list(root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and not logger.propagate:
            handlers = [handler for handler in logger.handlers if handler in shared]
            for handler in handlers:
                logger.removeHandler(handler)
            if handlers:
                taken.append((logger, handlers))
    try:
        yield
    finally:
        for logger, handlers in taken:
            for handler in handlers:
                logger.addHandler(handler)


# -- MultiProcessTestCase ----------------------------------------------------------


def _spawn(self: Any, proc: Any = None) -> None:
    """Instead of spawning (or starting ``proc``, a class's own ``_spawn_processes``): be one of the
    processes, with rank 0's environment and rendezvous file."""
    _check_world_size(type(self), int(self.world_size))
    made = getattr(self, "file_name", None) or ""  # setUp's temporary file, made on every rank here
    in_tmp = os.path.dirname(made) == tempfile.gettempdir() and os.path.isfile(made)
    if in_tmp and not os.path.getsize(made):
        os.remove(made)
    mine = None
    if rank_context().rank == 0:
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
        mine = {"env": env, "file": _rendezvous_file()}
    [main] = exchange(BROADCAST_OBJECTS, mine, root=0)
    for name in [name for name in os.environ if name not in main["env"] and name not in RANK_VARIABLES]:
        del os.environ[name]
    os.environ.update(main["env"])
    self.file_name = main["file"]


def _join(self: Any, fn: Any) -> None:
    """What torch's child for this rank does, then the main process's verdict on every rank's end."""
    cls = type(self)
    if fn in self.special_return_code_checks:
        raise AdoptError(
            f"{cls.__qualname__}: special_return_code_checks (a test that expects its process to end with a "
            "given exit code or signal) needs a process of its own: run it without --ddp-adopt"
        )
    rank = rank_context().rank
    ours, theirs = multiprocessing.Pipe()
    error: BaseException | None = None
    end: dict[str, Any] = {"end": "ok", "code": 0, "reason": ""}
    try:
        with as_in_a_spawned_process():
            fake_pg = getattr(self, "fake_pg", False)
            cls._run(rank, self._current_test_name(), self.file_name, theirs, fake_pg=fake_pg)
    except SystemExit as exc:
        end, error = _child_end(exc, cls.TEST_ERROR_EXIT_CODE)
    except Exception as exc:  # out of the class's _run, before or after run_test: torch's child dies of it
        end, error = {"end": "error", "code": 1, "reason": _first_line(exc)}, exc
    finally:
        ours.close()
        theirs.close()
    ends = exchange(GATHER_OBJECTS, end)
    _abide(process_test(ends, fn in self.skip_return_code_checks), error, _expects_failure(self, fn))
    if end["end"] == "exit" and rank != 0:
        text = f"rank {rank} exited with code {end['code']}, which torch's harness does not read"
        warnings.warn(AdoptedExitWarning(text), stacklevel=1)


def _child_end(exc: SystemExit, error_code: int) -> tuple[dict[str, Any], BaseException | None]:
    """How torch's child ended with this exit, and the test's own exception where it had one: run_test
    turns the test's exception into exit code 10, a SkipTest into 86, and keeps it as the context."""
    code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    context = exc.__context__
    if isinstance(context, unittest.SkipTest):
        return {"end": "skip", "code": code, "reason": str(context)}, None
    if code == error_code and context is not None:
        return {"end": "error", "code": code, "reason": _first_line(context)}, context
    message = _skip_message(code)
    if message is not None:
        return {"end": "skip", "code": code, "reason": message}, None
    return {"end": "ok" if code == 0 else "exit", "code": code, "reason": f"exit code {code}"}, None


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


# -- MultiProcContinuousTest -----------------------------------------------------------


class _Worker:
    """The class's worker for this rank, in the rank: its task and completion queue, and the
    process joined at the class's end."""

    def __init__(self, cls: Any, init_skip: str | None) -> None:
        self.cls = cls
        self.init_skip = init_skip  # the class's _init_pg exited with a skip code: every test of it skips
        self.ended: Any = None

    def put(self, test_id: str | None) -> None:
        if test_id is not None:  # None: the class is over, and join() ends it
            self.ended = _run_continuous(self.cls, test_id, self.init_skip)

    def get(self, timeout: float | None = None) -> Any:
        return self.ended

    def join(self, timeout: float | None = None) -> None:
        """The class is over: its group ends, as its worker ends it."""
        import torch.distributed as dist

        cls = self.cls
        group = getattr(cls, "pg", None)
        ours = group is not None and dist.is_initialized()
        if ours and dist.distributed_c10d._get_default_group() is group:
            dist.destroy_process_group()
        cls.pg = None
        cls._processes_spawned = False  # set up again (a rerun), the class joins a group again


def _join_class_group(cls: Any, world_size: int) -> None:
    """Instead of spawning the class's workers: be one, and join the class's group for its life."""
    _check_world_size(cls, world_size)
    rank = rank_context().rank
    cls.rank = rank
    [cls.rdvz_file] = exchange(BROADCAST_OBJECTS, _rendezvous_file() if rank == 0 else None, root=0)
    init_skip = None
    try:
        with as_in_a_spawned_process():
            cls._init_pg(rank, world_size, cls.rdvz_file)
    except SystemExit as exc:  # the class's _init_pg found the machine short
        init_skip = _skip_message(exc.code)
        if init_skip is None:
            raise
    else:
        default_group.outlives_test()
    worker = _Worker(cls, init_skip)
    cls.processes, cls.task_queues, cls.completion_queues = [worker], [worker], [worker]


def _run_continuous(cls: Any, test_id: str, init_skip: str | None) -> Any:
    """What torch's worker loop does for one test, then what the completion queue would hold: the
    test's id where every rank's end passes it, else what to raise."""
    error: BaseException | None = None
    end: dict[str, Any] = {"end": "ok", "code": 0, "reason": ""}
    try:
        if init_skip is not None:
            end = {"end": "skip", "code": 0, "reason": init_skip}
        else:
            with as_in_a_spawned_process():
                cls._run_test_given_id(test_id)
    except SystemExit as exc:
        message = _skip_message(exc.code)
        reason = message or f"exit code {exc.code}"
        end = {"end": "skip" if message else "error", "code": exc.code, "reason": reason}
        error = None if message else AdoptedFailure(f"the test exited with code {exc.code}")
    except Exception as exc:
        end, error = {"end": "error", "code": 1, "reason": _first_line(exc)}, exc
        if isinstance(exc, unittest.SkipTest):  # torch's worker loop sends it as an error: the test fails
            text = f"the test raised SkipTest({exc}), which torch's worker loop sends as an error"
            error = AdoptedFailure(text)
            error.__cause__ = exc
    found = continuous_test(exchange(GATHER_OBJECTS, end))
    test = getattr(cls, test_id.rsplit(".", 1)[-1], None)
    try:
        _abide(found, error, _expects_failure(cls, test))
    except BaseException as exc:
        return exc
    return test_id


def _no_poison_pill(ensure: Any, cls: Any) -> None:
    """Each test of the class runs, whatever the ones before did (torch skips the rest after a failure)."""
    cls.poison_pill = False
    ensure(cls)

"""--ddp-adopt: torch's distributed test classes, run as they are on warm ranks, with the outcomes
torch's own harness gives them.

The inner sessions run in subprocesses: they import torch's test harness, which pytester's
in-process runs would import again in the same process.  TORCH_OUTCOMES is what torch's harness
gave these files (plain pytest, each test spawning its processes); the slow test measures it again.
The files run with --ddp-adopt alone run in one session (the ``adopted`` fixture), each test
reading its file's part: a session each would import torch and start a forkserver once more.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import Session, failure_section, line_of, sessions_together
from pytest_ddp.adopt.torch_classes import Verdict, as_in_a_spawned_process, continuous_test, process_test

PROCESS_CLASSES = """
import logging
import sys
import unittest

import torch
import torch.distributed as dist
from torch.distributed.c10d_logger import _c10d_logger
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_distributed import (
    TEST_SKIPS,
    DistributedTestBase,
    MultiProcessTestCase,
    skip_if_lt_x_gpu,
)
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms

OWN = logging.getLogger("own")  # a logger of the test's own that does not propagate
OWN.propagate = False
OWN.addHandler(logging.NullHandler())


class Collectives(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

    def test_all_reduce(self):
        self._init()
        t = torch.ones(2) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 3.0))

    @parametrize("n", [1, 3])
    def test_broadcast(self, n):
        self._init()
        t = torch.full((n,), float(self.rank))
        dist.broadcast(t, src=1)
        self.assertEqual(t, torch.ones(n))

    def test_fails_on_rank1(self):
        self._init()
        dist.barrier()
        self.assertEqual(self.rank, 0, "rank 1 differs")

    @skip_if_lt_x_gpu(2)
    def test_needs_gpus(self):
        self._init()

    def test_skip_test(self):
        raise unittest.SkipTest("not here")

    @unittest.expectedFailure
    def test_expected_failure_on_rank1(self):
        self.assertEqual(self.rank, 0)

    @unittest.expectedFailure
    def test_unexpected_success(self):
        pass

    def test_exit_with_a_skip_code(self):
        sys.exit(TEST_SKIPS["small_worldsize"].exit_code)

    def test_rank0_exits_with_a_skip_code(self):
        if self.rank == 0:
            sys.exit(TEST_SKIPS["odd_worldsize"].exit_code)

    def test_rank1_exits_with_a_skip_code(self):
        if self.rank == 1:
            sys.exit(TEST_SKIPS["odd_worldsize"].exit_code)

    def test_rank0_exits_3(self):
        if self.rank == 0:
            sys.exit(3)

    def test_rank1_exits_3(self):
        if self.rank == 1:
            sys.exit(3)

    def test_subgroup_and_destroy(self):
        self._init()
        sub = dist.new_group([0, 1])
        t = torch.ones(1)
        dist.all_reduce(t, group=sub)
        self.assertEqual(t.item(), 2.0)
        dist.destroy_process_group()

    def test_non_propagating_loggers_hold_their_own_handlers(self):
        # as torch's test_c10d_logger.py's test_get_or_create_logger asserts of c10d's
        self.assertEqual([type(handler) for handler in _c10d_logger.handlers], [logging.NullHandler])
        self.assertEqual([type(handler) for handler in OWN.handlers], [logging.NullHandler])


instantiate_parametrized_tests(Collectives)


class Tensors(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_shard_and_gather(self):
        full = torch.arange(8.0).reshape(4, 2)
        d = distribute_tensor(full, self.build_device_mesh(), [Shard(0)])
        self.assertEqual(d.to_local().shape, (2, 2))
        self.assertEqual(d.full_tensor(), full)

    @with_comms
    def test_replicate(self):
        d = distribute_tensor(torch.ones(3), self.build_device_mesh(), [Replicate()])
        self.assertEqual(d.to_local(), torch.ones(3))

    @with_comms
    def test_wrong_shape(self):
        d = distribute_tensor(torch.ones(4), self.build_device_mesh(), [Shard(0)])
        self.assertEqual(d.to_local().shape, (4,))


class Objects(DistributedTestBase):
    @property
    def world_size(self):
        return 2

    def test_all_gather_object(self, device):
        self.create_pg(device)
        out = [None] * self.world_size
        dist.all_gather_object(out, {"rank": self.rank})
        self.assertEqual(out, [{"rank": 0}, {"rank": 1}])


instantiate_device_type_tests(Objects, globals(), only_for="cpu")
"""

CONTINUOUS_CLASS = """
import logging
import os

import torch
import torch.distributed as dist
from torch.distributed.c10d_logger import _c10d_logger
from torch.testing._internal.common_distributed import MultiProcContinuousTest


class Continuous(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

    @classmethod
    def opts(cls, high_priority_stream=False):
        with open(os.path.join(os.environ["LOG_DIR"], f"opts{cls.rank}"), "a") as f:
            f.write("x")  # read once per rank: the class's group is made once
        return None

    def test_a(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)

    def test_b_fails(self):
        self.assertEqual(dist.get_rank(), 0)

    def test_c_after_a_failure(self):  # no poison pill: it runs
        self.assertIs(self.pg, dist.distributed_c10d._get_default_group())
        self.assertEqual(dist.get_backend(), "gloo")
        self.assertEqual(self.rank, dist.get_rank())

    def test_d_skip_test_in_a_worker(self):  # torch's worker loop sends a SkipTest as an error
        self.skipTest("not here")

    def test_e_loggers_as_in_a_worker(self):  # a spawned worker: c10d's logger holds its own handler alone
        self.assertEqual([type(handler) for handler in _c10d_logger.handlers], [logging.NullHandler])


def test_after_the_class():  # its group was ended with the class
    assert not dist.is_initialized()
"""

# What torch's own harness gives these tests (plain pytest, torch spawning each test's processes):
# measured again by test_the_outcomes_are_torch_harness_own.
TORCH_OUTCOMES = {
    "test_process_classes.py::Collectives::test_all_reduce": "PASSED",
    "test_process_classes.py::Collectives::test_broadcast_n_1": "PASSED",
    "test_process_classes.py::Collectives::test_broadcast_n_3": "PASSED",
    "test_process_classes.py::Collectives::test_fails_on_rank1": "FAILED",
    "test_process_classes.py::Collectives::test_needs_gpus": "SKIPPED",
    "test_process_classes.py::Collectives::test_skip_test": "SKIPPED",
    "test_process_classes.py::Collectives::test_expected_failure_on_rank1": "XFAIL",
    "test_process_classes.py::Collectives::test_unexpected_success": "FAILED",
    "test_process_classes.py::Collectives::test_exit_with_a_skip_code": "SKIPPED",
    "test_process_classes.py::Collectives::test_rank0_exits_with_a_skip_code": "SKIPPED",
    "test_process_classes.py::Collectives::test_rank1_exits_with_a_skip_code": "PASSED",
    "test_process_classes.py::Collectives::test_rank0_exits_3": "FAILED",
    "test_process_classes.py::Collectives::test_rank1_exits_3": "PASSED",
    "test_process_classes.py::Collectives::test_subgroup_and_destroy": "PASSED",
    "test_process_classes.py::Collectives::test_non_propagating_loggers_hold_their_own_handlers": "PASSED",
    "test_process_classes.py::Tensors::test_shard_and_gather": "PASSED",
    "test_process_classes.py::Tensors::test_replicate": "PASSED",
    "test_process_classes.py::Tensors::test_wrong_shape": "FAILED",
    "test_process_classes.py::ObjectsCPU::test_all_gather_object_cpu": "PASSED",
}

OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b")


def outcomes(result: pytest.RunResult, module: str | None = None) -> dict[str, str]:
    """Each test's outcome in a ``-v`` run (those of ``module``, a file of a session of several)."""
    found = {m[1]: m[2] for line in result.outlines if (m := OUTCOME.match(line))}
    return {test: outcome for test, outcome in found.items() if module is None or test.startswith(f"{module}::")}


def run(pytester: pytest.Pytester, *args: str, timeout: float = 300) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", *args, timeout=timeout)


HANGS = """
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

class Hangs(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_ranks_differ(self):
        dist.init_process_group("gloo", init_method=f"file://{self.file_name}",
                                rank=self.rank, world_size=2)
        if self.rank == 0:
            dist.all_reduce(torch.ones(1))
        else:
            dist.recv(torch.zeros(1), src=0)
"""

EXPECTS_A_CRASH = """
from torch.testing._internal.common_distributed import MultiProcessTestCase

class ExpectsACrash(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self.special_return_code_checks = {self.test_aborts.__wrapped__: -6}
        self._spawn_processes()

    def test_aborts(self):
        pass
"""

MARKED = """
import os
import pytest
from torch.testing._internal.common_distributed import MultiProcessTestCase

class InARank:
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_in_a_rank(self):  # not in a process torch spawned in a rank
        assert "PYTEST_DDP_SHARED_ROOT" in os.environ

@pytest.mark.ddp(world_size=3)
class Contradicts(InARank, MultiProcessTestCase):
    pass

@pytest.mark.ddp(world_size=2, init=True)
class InitsTwice(InARank, MultiProcessTestCase):
    pass

@pytest.mark.ddp(world_size=2, timeout=60)
class Agrees(InARank, MultiProcessTestCase):
    pass

@pytest.mark.ddp(timeout=60)
class Unsized(InARank, MultiProcessTestCase):
    pass
"""

OWN = """
import os
from torch.testing._internal.common_distributed import MultiProcessTestCase

class Own(MultiProcessTestCase):
    world_size = 1  # one process torch spawns (each imports torch) shows whose it is

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):  # as torch's own tests do: MultiProcessTestCase leaves the file setUp made
        super().tearDown()
        os.remove(self.file_name)

    def test_spawned(self):
        assert "PYTEST_DDP_SHARED_ROOT" not in os.environ  # a process torch spawned
"""


SKIPPED_BY_THEIR_HARNESS = """
import unittest

import pytest
from torch.testing._internal.common_distributed import (
    MultiProcContinuousTest,
    MultiProcessTestCase,
    requires_nccl,
    skip_if_lt_x_gpu,
)


class Spawns(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()


@unittest.skipIf(True, "no devices here")
class SkippedClass(Spawns):
    def test_a(self):
        pass


class SkippedTests(Spawns):
    @requires_nccl()
    def test_needs_nccl(self):
        pass

    @skip_if_lt_x_gpu(2)  # torch's harness starts the processes, and each exits with a skip code
    def test_needs_gpus(self):
        pass

    @pytest.mark.skipif("True", reason="not here")
    def test_pytest_skipif(self):
        pass

    def test_runs(self):
        pass


class NoBackend(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "nccl"

    @classmethod
    def device_type(cls):
        return "cpu"

    def test_c(self):
        pass
"""

# What torch's harness gives them (test_the_outcomes_are_torch_harness_own measures it again).
SKIPPED_OUTCOMES = {
    **{
        f"test_skipped.py::{test}": "SKIPPED"
        for test in (
            "SkippedClass::test_a",
            "SkippedTests::test_needs_nccl",
            "SkippedTests::test_needs_gpus",
            "SkippedTests::test_pytest_skipif",
            "NoBackend::test_c",
        )
    },
    "test_skipped.py::SkippedTests::test_runs": "PASSED",
}


def test_a_test_its_own_harness_skips_starts_no_rank(adopted) -> None:
    """Skipped as under torch's harness (a class-level skip, a missing backend, too few GPUs, a skip
    mark), and none of them ran on a rank (ran_on_one_group: the session's one group ran the
    module's test_runs alone); nor did Collectives.test_needs_gpus (ADOPTED_RANK_TESTS)."""
    assert outcomes(adopted.result, "test_skipped.py") == SKIPPED_OUTCOMES
    adopted.ran_on_one_group("test_skipped.py")


def test_torch_harness_classes_run_on_warm_ranks_with_torchs_outcomes(adopted) -> None:
    """The session has no --ddp-adopt: one line of its pytest.ini, ``ddp_adopt = true``, adopts, in
    the session and in its ranks (the option itself: tests/config/test_settings.py)."""
    assert outcomes(adopted.result, "test_process_classes.py") == TORCH_OUTCOMES
    adopted.ran_on_one_group("test_process_classes.py")
    # Nothing left behind, by this file or any other of the session (torch keeps its compiler's
    # cache there, as it does under its own harness).
    assert [path.name for path in adopted.tmpdir.iterdir() if not path.name.startswith("torchinductor_")] == []


@pytest.mark.slow
def test_the_outcomes_are_torch_harness_own(pytester) -> None:
    pytester.makepyfile(test_process_classes=PROCESS_CLASSES, test_skipped=SKIPPED_BY_THEIR_HARNESS)
    result = run(pytester, "-p", "no:ddp", timeout=900)
    assert outcomes(result, "test_process_classes.py") == TORCH_OUTCOMES
    assert outcomes(result, "test_skipped.py") == SKIPPED_OUTCOMES


CONTINUOUS_OUTCOMES = {
    "test_continuous.py::Continuous::test_a": "PASSED",
    "test_continuous.py::Continuous::test_b_fails": "FAILED",
    "test_continuous.py::Continuous::test_c_after_a_failure": "PASSED",
    "test_continuous.py::Continuous::test_d_skip_test_in_a_worker": "FAILED",
    "test_continuous.py::Continuous::test_e_loggers_as_in_a_worker": "PASSED",
    "test_continuous.py::test_after_the_class": "PASSED",
}


def test_a_continuous_class_makes_its_group_once_and_a_failure_skips_nothing(adopted) -> None:
    assert outcomes(adopted.result, "test_continuous.py") == CONTINUOUS_OUTCOMES
    assert (adopted.log_dir / "opts0").read_text() == (adopted.log_dir / "opts1").read_text() == "x"
    failure_section(adopted.result, "Continuous.test_b_fails").fnmatch_lines(
        ["AssertionError: Scalars are not equal! (rank 1). *ddp failed*"]
    )
    adopted.ran_on_one_group("test_continuous.py")  # its 5 tests; not test_after_the_class


def test_a_deadlock_in_an_adopted_test_is_reported_at_once_with_every_ranks_stack(adopted) -> None:
    path = adopted.folder / "test_hang.py"
    assert outcomes(adopted.result, "test_hang.py") == {"test_hang.py::Hangs::test_ranks_differ": "FAILED"}
    failure_section(adopted.result, "Hangs.test_ranks_differ").fnmatch_lines(
        [
            "*deadlock*",
            f"*rank 0*all_reduce #1 (test_hang.py:{line_of(path, 'all_reduce')})*",
            f"*rank 1*recv #1 from 0 (test_hang.py:{line_of(path, 'dist.recv')})*",
            "*Python stacks*",
        ]
    )
    assert "timed out" not in adopted.result.stdout.str()


def test_what_cannot_be_honoured_fails_naming_the_class_and_the_feature(adopted) -> None:
    assert outcomes(adopted.result, "test_code.py") == {"test_code.py::ExpectsACrash::test_aborts": "FAILED"}
    failure_section(adopted.result, "ExpectsACrash.test_aborts").fnmatch_lines(
        ["*AdoptError: ExpectsACrash: special_return_code_checks*"]
    )


def test_an_own_mark_gives_its_arguments_and_one_that_contradicts_the_class_is_its_error(adopted) -> None:
    assert outcomes(adopted.result, "test_marks.py") == {
        "test_marks.py::Contradicts::test_in_a_rank": "ERROR",
        "test_marks.py::InitsTwice::test_in_a_rank": "ERROR",
        "test_marks.py::Agrees::test_in_a_rank": "PASSED",
        "test_marks.py::Unsized::test_in_a_rank": "PASSED",
    }
    adopted.result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of Contradicts.test_in_a_rank*",
            "*@pytest.mark.ddp(world_size=3) contradicts Contradicts's own world_size, 2,*",
            "*ERROR at setup of InitsTwice.test_in_a_rank*",
            "*@pytest.mark.ddp(init=True): InitsTwice makes its own process group*",
        ]
    )
    adopted.ran_on_one_group("test_marks.py")  # the two that agree, on the ranks; no others


def test_without_the_option_torchs_harness_runs_its_own_way(pytester) -> None:
    pytester.makepyfile(test_own=OWN)
    result = run(pytester)
    assert outcomes(result) == {"test_own.py::Own::test_spawned": "PASSED"}
    assert "ddp:" not in result.stdout.str()


DIST_BACKEND_SPAWN = """
# As torch's test/distributed/test_distributed_spawn.py: the installed torch's mixin of distributed
# tests, run by TestDistBackend's own _run (its init, its file barrier in the folder setUp makes).
import torch
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
"""
# A set of the mixin's tests (collectives, point-to-point, subgroups, objects), and what torch's harness gives them
# on a machine without CUDA (test_the_mixins_outcomes_are_torch_harness_own measures it again).
DIST_BACKEND_SELECTION = (
    "test_all_reduce_sum or test_broadcast or test_all_gather_object or test_barrier_full_group or test_gather_object "
    "or test_destroy or test_isend or test_irecv or test_new_subgroups_by_enumeration"
)
_PASSED = (
    "test_all_gather_object_default_pg test_all_gather_object_subgroup test_all_reduce_sum "
    "test_all_reduce_sum_async test_all_reduce_sum_complex test_barrier_full_group test_broadcast "
    "test_broadcast_full_group test_destroy_full_group test_destroy_group test_irecv test_isend "
    "test_isend_autograd_profiler test_isend_torch_profiler "
)
_SKIPPED = (  # CUDA, world size 2, or a backend that is not gloo
    "test_all_reduce_sum_cuda test_all_reduce_sum_cuda_async test_all_reduce_sum_cuda_complex "
    "test_barrier_full_group_cuda test_broadcast_cuda test_broadcast_group test_broadcast_object_list "
    "test_gather_object test_gather_object_subgroup test_new_subgroups_by_enumeration "
    "test_new_subgroups_by_enumeration_input_rank_exceeds_world_size "
    "test_new_subgroups_by_enumeration_negative_input_rank "
)
_SKIPPED_WITHOUT_A_RANK = (  # of those, by a unittest skip decorator: left to pytest under --ddp-adopt
    "test_broadcast_object_list test_gather_object test_gather_object_subgroup test_new_subgroups_by_enumeration "
    "test_new_subgroups_by_enumeration_input_rank_exceeds_world_size"
)
DIST_BACKEND_OUTCOMES = {
    f"test_distributed_spawn.py::TestDistBackendWithSpawn::{name}": outcome
    for names, outcome in ((_PASSED, "PASSED"), (_SKIPPED, "SKIPPED"))
    for name in names.split()
}


def test_torchs_own_distributed_mixin_runs_on_warm_ranks_with_torchs_outcomes(adopted) -> None:
    assert outcomes(adopted.result, "test_distributed_spawn.py") == DIST_BACKEND_OUTCOMES
    adopted.ran_on_one_group("test_distributed_spawn.py")


@pytest.mark.slow
def test_the_mixins_outcomes_are_torch_harness_own(pytester, monkeypatch) -> None:
    monkeypatch.setenv("BACKEND", "gloo")
    monkeypatch.setenv("WORLD_SIZE", "2")
    pytester.makepyfile(test_distributed_spawn=DIST_BACKEND_SPAWN)
    assert outcomes(run(pytester, "-p", "no:ddp", "-k", DIST_BACKEND_SELECTION, timeout=1800)) == DIST_BACKEND_OUTCOMES


# -- the loggers as torch's spawned process has them, on hand-made loggers ------------------


def test_the_root_loggers_handlers_are_off_the_non_propagating_loggers_for_the_block_and_back_after() -> None:
    root, quiet, loud = logging.getLogger(), logging.getLogger("adopt.quiet"), logging.getLogger("adopt.loud")
    pytests, own = logging.NullHandler(), logging.NullHandler()  # as pytest's on root, and the logger's own
    quiet.propagate = False
    root.addHandler(pytests)
    quiet.addHandler(own)
    quiet.addHandler(pytests)
    loud.addHandler(pytests)  # it propagates: what it holds is its own business
    try:
        with as_in_a_spawned_process():
            assert quiet.handlers == [own]
            assert pytests in root.handlers and loud.handlers == [pytests]
        assert quiet.handlers == [own, pytests]
    finally:
        root.removeHandler(pytests)
        quiet.handlers.clear()
        loud.handlers.clear()
        quiet.propagate = True


# -- torch's main-process verdicts, on hand-made ends ---------------------------------


def _end(end: str, code: int = 0, reason: str = "") -> dict[str, object]:
    return {"end": end, "code": code, "reason": reason}


OK, ERROR, SKIP, EXIT3 = _end("ok"), _end("error", 10, "AssertionError: x"), _end("skip", 86, "why"), _end("exit", 3)


@pytest.mark.parametrize(
    "ends, expected",
    [
        ([OK, OK], Verdict("passed")),
        ([OK, ERROR], Verdict("failed", "AssertionError: x", (1,))),
        ([SKIP, ERROR], Verdict("failed", "AssertionError: x", (1,))),  # errors come first
        ([SKIP, OK], Verdict("skipped", "why")),  # rank 0's exit code decides
        ([OK, SKIP], Verdict("passed")),
        ([EXIT3, OK], Verdict("failed", "rank 0 exited with code 3; torch's harness expects 0", (0,))),
        ([OK, EXIT3], Verdict("passed")),  # no other rank's code is read
    ],
)
def test_multi_process_test_case_verdict(ends, expected) -> None:
    assert process_test(ends) == expected


def test_a_test_that_may_exit_with_any_code_passes_unless_a_rank_raised() -> None:
    assert process_test([EXIT3, SKIP], any_exit_code=True) == Verdict("passed")
    assert process_test([EXIT3, ERROR], any_exit_code=True).outcome == "failed"


@pytest.mark.parametrize(
    "ends, expected",
    [
        ([OK, OK], Verdict("passed")),
        ([OK, SKIP], Verdict("skipped", "why")),  # the first rank that did not pass decides
        ([SKIP, ERROR], Verdict("skipped", "why")),
        ([ERROR, SKIP], Verdict("failed", "AssertionError: x", (0,))),
        ([ERROR, ERROR], Verdict("failed", "AssertionError: x", (0, 1))),
    ],
)
def test_continuous_test_verdict(ends, expected) -> None:
    assert continuous_test(ends) == expected


# A DeepSpeed-style harness, shaped as DeepSpeed's tests/unit/common.py and conftest.py shape theirs
# (DistributedExec's launchers, _dist_run, _dist_destroy; DistributedTest; the conftest's
# pytest_runtest_call), written here with torch.distributed in place of deepspeed.comm.
DEEPSPEED_CONFTEST = """
import inspect
import multiprocessing as mp
import os
import tempfile

import pytest
import torch.distributed as dist
from _pytest.outcomes import Skipped


class DistributedExec:
    world_size = 2
    backend = "gloo"
    requires_cuda_env = False
    reuse_dist_env = False
    non_daemonic_procs = False

    def _get_fixture_kwargs(self, request, func):
        kwargs = {}
        for name in inspect.getfullargspec(func).args[1:]:
            kwargs[name] = request.getfixturevalue(name)
        return kwargs

    def _launch_with_file_store(self, request, world_size):
        folder = request.getfixturevalue("tmpdir")
        for procs in [world_size] if isinstance(world_size, int) else world_size:
            with tempfile.NamedTemporaryFile(delete=False, dir=str(folder), suffix="_filestore") as f:
                init_method = f"file://{f.name}"
            self._launch_procs(procs, init_method)

    def _launch_procs(self, num_procs, init_method):
        if self.non_daemonic_procs:
            self._launch_non_daemonic_procs(num_procs, init_method)
        else:
            self._launch_daemonic_procs(num_procs, init_method)

    def _launch_daemonic_procs(self, num_procs, init_method):
        pool = mp.get_context("spawn").Pool(processes=num_procs)
        try:
            skips = pool.starmap(self._dist_run, [(rank, num_procs, "0", init_method) for rank in range(num_procs)])
        finally:
            if not self.reuse_dist_env:
                pool.starmap(self._dist_destroy, [() for _ in range(num_procs)])
            pool.close()
            pool.join()
        if any(skips):
            pytest.skip(skips[0])

    def _launch_non_daemonic_procs(self, num_procs, init_method):
        raise NotImplementedError

    def _dist_run(self, local_rank, num_procs, master_port, init_method, skip_msg=""):
        os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(num_procs))
        dist.init_process_group(self.backend, init_method=init_method, rank=local_rank, world_size=num_procs)
        dist.barrier()
        try:
            self.run(**self._fixture_kwargs)
        except Skipped as e:
            skip_msg = e.msg
        return skip_msg

    def _dist_destroy(self):
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


class DistributedTest(DistributedExec):
    is_dist_test = True

    def run(self, **fixture_kwargs):
        self._current_test(**fixture_kwargs)

    def __call__(self, request):
        self._current_test = getattr(self, request.function.__name__)
        self._fixture_kwargs = self._get_fixture_kwargs(request, self._current_test)
        self._launch_with_file_store(request, self.world_size)


def pytest_runtest_call(item):
    if getattr(item.cls, "is_dist_test", False):
        item.cls()(item._request)
        item.runtest = lambda: True
"""

DEEPSPEED_TESTS = """
import os

import pytest
import torch
import torch.distributed as dist

from conftest import DistributedTest


@pytest.fixture
def value():
    return 3


class TestCollectives(DistributedTest):
    world_size = 2

    def test_all_reduce(self, value):
        t = torch.ones(1) * value
        dist.all_reduce(t)
        assert t.item() == 2 * value

    def test_skips(self):
        pytest.skip("not on this machine")

    def test_fails_on_rank_1(self):
        dist.barrier()
        assert int(os.environ["RANK"]) == 0
"""
DEEPSPEED_OUTCOMES = {
    "test_ds.py::TestCollectives::test_all_reduce": "PASSED",
    "test_ds.py::TestCollectives::test_skips": "SKIPPED",
    "test_ds.py::TestCollectives::test_fails_on_rank_1": "FAILED",
}


def test_deepspeed_style_classes_run_on_warm_ranks(adopted) -> None:
    assert outcomes(adopted.result, "test_ds.py") == DEEPSPEED_OUTCOMES
    failure_section(adopted.result, "TestCollectives.test_fails_on_rank_1").fnmatch_lines(
        ["AssertionError: assert 1 == 0 (rank 1). *ddp failed*"]
    )
    adopted.ran_on_one_group("test_ds.py")


@pytest.mark.slow
def test_deepspeed_style_outcomes_are_their_harness_own(pytester) -> None:
    pytester.makeconftest(DEEPSPEED_CONFTEST)
    pytester.makepyfile(test_ds=DEEPSPEED_TESTS)
    assert outcomes(run(pytester, "-p", "no:ddp")) == DEEPSPEED_OUTCOMES


# -- the --ddp-adopt session of the tests above -------------------------------------

# The adopted session's ini file: one line adopts, no option.
ADOPT_INI = "[pytest]\nddp_adopt = true\n"

# A plugin of the --ddp-adopt session: each rank writes the node id of each test it runs to a file
# of its own (by its pid), so that each file's tests are seen to run on the ranks of the one group.
RAN_ON = """
import os

def pytest_runtest_setup(item):
    if "PYTEST_DDP_SHARED_ROOT" in os.environ:  # in a rank (not in a process torch spawned)
        with open(os.path.join(os.environ["RAN_DIR"], str(os.getpid())), "a") as f:
            f.write(item.nodeid + "\\n")
"""


@dataclass
class Adopted:
    """The --ddp-adopt session of every file below, and the folders it was given."""

    result: pytest.RunResult
    folder: Path  # its files
    tmpdir: Path  # its TMPDIR
    log_dir: Path  # $LOG_DIR, for the continuous class
    ran_dir: Path  # $RAN_DIR, for RAN_ON

    def ran_on_one_group(self, module: str) -> None:
        """The tests of ``module`` that run on ranks (ADOPTED_RANK_TESTS), and no other, ran on the
        session's one group of 2 ranks: what ``ddp: N tests on 1 rank group started`` says of a
        session of that file alone."""
        ran = [path.read_text().splitlines() for path in sorted(self.ran_dir.iterdir())]  # by rank
        assert [sorted(test for test in tests if test.startswith(f"{module}::")) for tests in ran] == [
            sorted(ADOPTED_RANK_TESTS[module])
        ] * 2
        total = sum(map(len, ADOPTED_RANK_TESTS.values()))
        self.result.stdout.fnmatch_lines([f"*ddp: {total} tests on 1 rank group started*"])


# The files of the --ddp-adopt session, in the order it runs them (the deadlock last: it stops the
# group), each with its tests that run on the ranks.
ADOPTED_RANK_TESTS = {
    # Collectives.test_needs_gpus: skipped by its skip_if_lt_x_gpu(2), with no rank started
    "test_process_classes.py": [test for test in TORCH_OUTCOMES if not test.endswith("::test_needs_gpus")],
    "test_skipped.py": ["test_skipped.py::SkippedTests::test_runs"],
    "test_continuous.py": [test for test in CONTINUOUS_OUTCOMES if "::Continuous::" in test],  # its class's
    # less those its unittest skip decorators skip, with no rank started
    "test_distributed_spawn.py": [
        test for test in DIST_BACKEND_OUTCOMES if test.rpartition("::")[2] not in _SKIPPED_WITHOUT_A_RANK.split()
    ],
    "test_ds.py": list(DEEPSPEED_OUTCOMES),
    "test_marks.py": ["test_marks.py::Agrees::test_in_a_rank", "test_marks.py::Unsized::test_in_a_rank"],
    "test_code.py": ["test_code.py::ExpectsACrash::test_aborts"],
    "test_hang.py": ["test_hang.py::Hangs::test_ranks_differ"],
}


@pytest.fixture(scope="module")
def adopted(tmp_path_factory: pytest.TempPathFactory) -> Adopted:
    """One --ddp-adopt session of the files of the tests above that run with that option alone, each
    test reading its file's part: a session each would import torch and its harness, and start a
    forkserver and a rank group, of its own."""
    folder = tmp_path_factory.mktemp("adopt")
    tmpdir, log_dir, ran_dir = (folder / name for name in ("tmp", "log", "ran"))
    for path in tmpdir, log_dir, ran_dir:
        path.mkdir()
    files = {
        "test_process_classes.py": PROCESS_CLASSES,
        "test_skipped.py": SKIPPED_BY_THEIR_HARNESS,
        "test_continuous.py": CONTINUOUS_CLASS,
        "test_distributed_spawn.py": DIST_BACKEND_SPAWN,
        "conftest.py": DEEPSPEED_CONFTEST,
        "test_ds.py": DEEPSPEED_TESTS,
        "test_marks.py": MARKED,
        "test_code.py": EXPECTS_A_CRASH,
        "test_hang.py": HANGS,
        "ran_on.py": RAN_ON,
        "pytest.ini": ADOPT_INI,
    }
    # MultiProcessTestCase.setUp makes a file in TMPDIR per rank; the continuous class writes in LOG_DIR;
    # TestDistBackend reads BACKEND and WORLD_SIZE. The mixin's -k selection applies to its file alone;
    # --ddp-timeout=300: the deadlock's report must come before any timeout.
    env = {
        "TMPDIR": str(tmpdir),
        "LOG_DIR": str(log_dir),
        "RAN_DIR": str(ran_dir),
        "BACKEND": "gloo",
        "WORLD_SIZE": "2",
    }
    selection = f"({DIST_BACKEND_SELECTION}) or not TestDistBackendWithSpawn"
    args = ("-v", "-p", "ran_on", "--ddp-timeout=300", "-k", selection, *ADOPTED_RANK_TESTS)
    result = sessions_together(folder, {"s": Session(files, args, env)}, timeout=300)["s"]
    return Adopted(result, folder / "s", tmpdir, log_dir, ran_dir)

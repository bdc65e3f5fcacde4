"""DeepSpeed's checks before it launches, as --ddp-adopt reads them (pure, on hand-made accelerators):
a class its harness skips there is left to it, and no rank starts.  torch's skips, on real classes:
test_adopt.py's ``test_a_test_its_own_harness_skips_starts_no_rank``."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from pytest_ddp.adopt.collect import deepspeed_skips


def accelerators(available: bool, devices: int) -> Callable[[], SimpleNamespace]:
    """A stand-in for DeepSpeed's ``get_accelerator``, as its harness module imports it."""
    accelerator = SimpleNamespace(is_available=lambda: available, device_count=lambda: devices)
    return lambda: accelerator


class NeedsAccelerator:
    requires_cuda_env = True


class RunsOnCpu:
    requires_cuda_env = False


@pytest.mark.parametrize(
    "cls, world_size, accelerator, skips",
    [
        (NeedsAccelerator, 2, accelerators(False, 0), True),
        (RunsOnCpu, 2, accelerators(False, 0), False),
        (RunsOnCpu, 2, accelerators(True, 1), True),  # DeepSpeed's CPU accelerator: a device per NUMA node
        (NeedsAccelerator, 2, accelerators(True, 2), False),
        (NeedsAccelerator, 4, accelerators(True, 2), True),
    ],
)
def test_deepspeed_skips_where_its_launcher_would(cls, world_size, accelerator, skips) -> None:
    assert deepspeed_skips(cls, world_size, accelerator) is skips


def test_a_copy_of_deepspeeds_harness_without_deepspeed_is_left_to_the_ranks() -> None:
    assert deepspeed_skips(NeedsAccelerator, 2, None) is False

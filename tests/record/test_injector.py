"""The fault injector's actions inside a rank (record/injector.py), on their own."""

from __future__ import annotations

import resource

import pytest

from pytest_ddp import faults
from pytest_ddp.record import injector


def test_oom_without_a_size_says_what_it_could_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # It lowers the address-space limit to what the process has, plus headroom: unread, no limit is set.
    limits = resource.getrlimit(resource.RLIMIT_AS)
    monkeypatch.setattr(injector.procfs, "status", lambda: {"Name": "python"})
    with pytest.raises(OSError, match=r"^no VmSize in /proc/self/status"):
        injector._exhaust_memory(faults.oom(rank=0, at="all_reduce"))
    assert resource.getrlimit(resource.RLIMIT_AS) == limits

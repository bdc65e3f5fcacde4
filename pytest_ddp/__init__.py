"""pytest-ddp: run pytest tests on N real torch.distributed ranks, and diagnose their hangs.

Mark a test ``@pytest.mark.ddp(world_size=4)`` to run it on 4 ranks; call
:func:`run` to run a function on fresh ranks and inspect what happened.

The public names are imported on first use: pytest loads this package with the plugin in every
session, and a session without ddp tests must not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_ddp import faults
    from pytest_ddp.api import Diagnosis, RankResult, Result, run

__all__ = ["Diagnosis", "RankResult", "Result", "faults", "run"]
__version__ = "0.1.0"

def __getattr__(name: str) -> Any:
    if name == "faults":
        return importlib.import_module("pytest_ddp.faults")
    if name in __all__:  # the others are pytest_ddp.api's
        return getattr(importlib.import_module("pytest_ddp.api"), name)
    raise AttributeError(f"module 'pytest_ddp' has no attribute {name!r}")

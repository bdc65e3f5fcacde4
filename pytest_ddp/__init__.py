"""pytest-ddp: run pytest tests on N real torch.distributed ranks, and diagnose their hangs.

Mark a test ``@pytest.mark.ddp(world_size=4)`` to run it on 4 ranks; call
:func:`run` to run a function on fresh ranks and inspect what happened.
"""

from pytest_ddp import faults
from pytest_ddp.api import Diagnosis, RankResult, Result, run

__all__ = ["Diagnosis", "RankResult", "Result", "faults", "run"]
__version__ = "0.1.0"

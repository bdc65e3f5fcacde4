"""Imported last by the forkserver, after torch and pytest: import the torch modules the session's
collection imported (the file ``PRELOAD_ENV`` names), guard its socket, and freeze its heap.

``gc.freeze()`` keeps the collector off every object alive now: forked ranks neither walk torch's
objects in a full collection nor copy the pages the collector would have touched.
"""

import gc
import importlib
import os
import sys
from pathlib import Path

from pytest_ddp.common.protocol import PRELOAD_ENV
from pytest_ddp.groups import forkserver_guard


def _import_listed() -> list[str]:
    """Import the torch modules the file names (then removed); the torch modules that imported."""
    names: list[str] = []
    if PRELOAD_ENV in os.environ:
        listed = Path(os.environ[PRELOAD_ENV])
        try:
            names = listed.read_text().split()
            listed.unlink()
        except OSError:
            pass
    before = set(sys.modules)
    for name in (name for name in names if name.startswith("torch.")):
        try:
            importlib.import_module(name)
        except (Exception, SystemExit):  # the rank imports it again, and meets the error there
            pass
    return [name for name in sys.modules if name.startswith("torch.") and name not in before]


os.environ[PRELOAD_ENV] = ",".join(_import_listed())  # what the ranks' recorder rebinds
forkserver_guard.guard()
gc.freeze()

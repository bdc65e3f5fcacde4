"""Imported last by the forkserver, after torch and pytest: import the torch modules the session's
collection imported (``PRELOAD_ENV``), guard its socket, and freeze its heap.

``gc.freeze()`` keeps the collector off every object alive now: forked ranks neither walk torch's
objects in a full collection nor copy the pages the collector would have touched.
"""

import gc
import importlib
import os
import sys

from pytest_ddp.common.protocol import PRELOAD_ENV
from pytest_ddp.groups import forkserver_guard

_before = set(sys.modules)
for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
    try:
        importlib.import_module(name)
    except (Exception, SystemExit):  # the rank imports it again, and meets the error there
        pass
_imported = [name for name in sys.modules if name.startswith("torch.") and name not in _before]
os.environ[PRELOAD_ENV] = ",".join(_imported)  # what the ranks' recorder rebinds
del _before, _imported

forkserver_guard.guard()
gc.freeze()

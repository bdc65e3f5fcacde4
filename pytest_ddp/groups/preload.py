"""Imported last by the forkserver, after torch and pytest: guard its socket, and freeze its heap.

``gc.freeze()`` keeps the collector off every object alive now: forked ranks neither walk torch's
objects in a full collection nor copy the pages the collector would have touched.
"""

import gc

from pytest_ddp.groups import forkserver_guard

forkserver_guard.guard()
gc.freeze()

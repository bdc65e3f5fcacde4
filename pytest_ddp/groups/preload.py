"""Imported last by the forkserver, after torch and pytest: freeze its heap.

``gc.freeze()`` moves every object alive now into a generation the garbage
collector never walks.  Ranks forked afterwards neither pay for walking
torch's objects in a full collection (pytest runs one as each rank's session
ends) nor copy the memory pages those objects live on when the collector
would have touched them.
"""

import gc

gc.freeze()

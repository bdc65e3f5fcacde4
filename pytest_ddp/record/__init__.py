"""Inside a rank: records every torch.distributed and mpi4py call, and fires injected faults.
Imports only common (and the public faults module).
"""

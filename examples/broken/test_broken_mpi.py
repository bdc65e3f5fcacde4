"""An MPI test broken on purpose (mpi4py, `backend="mpi"`): the seed article's
barrier after an exception, which hangs forever under a bare `mpiexec`.

`make demo` runs it with the others and checks its diagnosis.
"""

import pytest
import torch


@pytest.mark.ddp(world_size=2, backend="mpi")
def test_mpi_rank_raises_before_the_barrier(comm, rank):
    batch = torch.arange(4.0) + rank
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    total = torch.zeros(4)
    comm.Allreduce(batch, total)
    comm.Barrier()

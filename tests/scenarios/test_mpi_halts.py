"""The halts of the MPI seed article (PyTorch code talking through mpi4py), each diagnosed.

What bare MPICH does in each (measured under a bare ``mpiexec -n 4``: docs/scenarios.md, "MPI through
mpi4py"): the small any-source case exits 0 while losing messages, the others hang for ever, and a
killed rank makes mpiexec kill the rest.  Torch tensors go straight to mpi4py's buffer calls.
"""

import os
import signal
import time

import pytest
import torch

import pytest_ddp
from pytest_ddp.groups.mpi_group import mpi_unavailable

pytestmark = pytest.mark.skipif(mpi_unavailable(None) is not None, reason=str(mpi_unavailable(None)))


def _world():
    from mpi4py import MPI

    return MPI, MPI.COMM_WORLD


def any_source_receive(rank: int, count: int) -> None:
    """Rank 0 receives once from any source; every other rank sends it ``count`` int64."""
    MPI, comm = _world()
    if rank == 0:
        comm.Recv(torch.zeros(count, dtype=torch.int64), source=MPI.ANY_SOURCE)
    else:
        comm.Send(torch.full((count,), rank, dtype=torch.int64), dest=0)


def barrier_after_slow_rank(rank: int) -> None:
    _, comm = _world()
    if rank == 1:
        time.sleep(1.0)  # slow is not a deadlock
    comm.Barrier()


def barrier_after_exception(rank: int) -> None:
    _, comm = _world()
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    comm.Barrier()


def allreduce_by_half(rank: int) -> None:
    _, comm = _world()
    if rank < 2:
        comm.allreduce(rank)


def killed_mid_collective(rank: int) -> None:
    _, comm = _world()
    comm.Barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.Allreduce(torch.ones(4), torch.zeros(4))


def receive_into_too_small_buffer(rank: int) -> None:
    _, comm = _world()
    if rank == 0:
        comm.Send(torch.ones(100), dest=1)
    else:
        comm.Recv(torch.zeros(10), source=0)


def mismatched_tags(rank: int) -> None:
    _, comm = _world()
    if rank == 0:
        comm.Send(torch.ones(10), dest=1, tag=1)
    else:
        comm.Recv(torch.zeros(10), source=0, tag=2)


def test_any_source_receive_of_small_messages_loses_the_others():
    """Under mpiexec it exits 0; here the two messages nobody received fail it."""
    result = pytest_ddp.run(any_source_receive, world_size=4, backend="mpi", args=(10,))
    assert result.outcome == "passed"  # every rank returned: MPI buffered the small sends
    assert len(result.unreceived_messages) == 2
    assert all("Send #1 to 0 (tag 0)" in line and "sent, never received" in line for line in result.unreceived_messages)


def test_any_source_receive_of_large_messages_blocks_the_other_senders():
    result = pytest_ddp.run(any_source_receive, world_size=3, backend="mpi", args=(1_000_000,), timeout=60)
    assert result.outcome == "deadlock" and result.diagnosis is not None
    # Rank 0 returned after one message; the sender it did not receive from blocks in its Send.
    assert (result.diagnosis.kind, result.diagnosis.culprits) == ("partial", [0])
    assert result.diagnosis.collective == "mpi.Send"
    assert "waits in Send #1 to 0 (tag 0)" in result.diagnosis.text


def test_barrier_after_an_exception_names_the_raiser():
    result = pytest_ddp.run(barrier_after_exception, world_size=2, backend="mpi", timeout=60)
    assert result.outcome == "deadlock" and result.diagnosis is not None
    assert (result.diagnosis.kind, result.diagnosis.culprits, result.diagnosis.waiting) == ("rank_exited", [1], [0])
    assert "rank 1 failed (ValueError: bad batch on rank 1); rank 0 waits in Barrier #1" in result.diagnosis.text


def test_allreduce_by_half_the_world_names_the_other_half():
    result = pytest_ddp.run(allreduce_by_half, world_size=4, backend="mpi", timeout=60)
    assert result.outcome == "deadlock" and result.diagnosis is not None
    assert (result.diagnosis.kind, result.diagnosis.culprits) == ("partial", [2, 3])
    assert "ranks 2, 3 never called allreduce #1 (returned from their test)" in result.diagnosis.text


def test_a_rank_killed_mid_collective_is_named_not_the_ranks_it_stranded():
    result = pytest_ddp.run(killed_mid_collective, world_size=3, backend="mpi", timeout=60)
    assert result.outcome == "deadlock" and result.diagnosis is not None
    assert (result.diagnosis.kind, result.diagnosis.culprits, result.diagnosis.waiting) == ("rank_exited", [1], [0, 2])
    assert "rank 1 died (killed by SIGKILL); ranks 0, 2 wait in Allreduce #2" in result.diagnosis.text
    # Ranks 0 and 2 still waited when judged (no cascade of kills), and were stopped then, as on Gloo.
    assert [r.exit_code for r in result.ranks] == [-signal.SIGKILL] * 3


def test_receive_into_a_buffer_too_small_is_mpis_truncation_error_on_that_rank():
    result = pytest_ddp.run(receive_into_too_small_buffer, world_size=2, backend="mpi")
    assert result.outcome == "failed" and result.diagnosis is not None
    assert result.diagnosis.culprits == [1]
    assert "message truncated" in (result.ranks[1].exception or "").lower()  # MPICH's and Open MPI's words
    assert result.unreceived_messages == []  # the receive took the message before it raised


def test_mismatched_tags_name_the_send_that_matches_no_receive():
    result = pytest_ddp.run(mismatched_tags, world_size=2, backend="mpi", timeout=60)
    assert result.outcome == "deadlock" and result.diagnosis is not None
    assert (result.diagnosis.kind, result.diagnosis.culprits, result.diagnosis.waiting) == ("partial", [0], [1])
    assert "its Send #1 to 1 (tag 1)" in result.diagnosis.text
    assert "matches no receive; rank 1 waits in Recv #1 from 0 (tag 2)" in result.diagnosis.text


# -- the fixes, and a slow rank, on one warm world -------------------------------------


@pytest.mark.ddp(world_size=4, backend="mpi")
def test_barrier_after_a_slow_rank_passes(rank):
    barrier_after_slow_rank(rank)


@pytest.mark.ddp(world_size=4, backend="mpi")
def test_fixed_any_source_receive_takes_every_message(comm, rank):
    from mpi4py import MPI

    if rank == 0:
        senders = set()
        for _ in range(comm.Get_size() - 1):
            status = MPI.Status()
            comm.Recv(torch.zeros(10, dtype=torch.int64), source=MPI.ANY_SOURCE, status=status)
            senders.add(status.Get_source())
        assert senders == {1, 2, 3}
    else:
        comm.Send(torch.full((10,), rank, dtype=torch.int64), dest=0)


@pytest.mark.ddp(world_size=4, backend="mpi")
def test_fixed_every_rank_reaches_the_allreduce(comm, rank):
    total = torch.zeros(1)
    comm.Allreduce(torch.tensor([float(rank)]), total)
    assert total.item() == 6

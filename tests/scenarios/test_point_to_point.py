"""send/recv: both ranks receiving first, a send never received, a recv from the wrong source, recv from any source,
a receive never waited for."""

import pytest
import torch
import torch.distributed as dist

import pytest_ddp


def both_recv_first(rank: int) -> None:
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)
    dist.send(t, dst=1 - rank)


def wrong_source(rank: int) -> None:
    t = torch.zeros(1)
    if rank == 0:
        dist.recv(t, src=2)  # rank 1 is the one sending
    elif rank == 1:
        dist.send(t, dst=0)


def any_source(rank: int) -> int | None:
    t = torch.tensor([float(rank)])
    if rank == 0:
        return dist.recv(t)  # from whoever sends first
    dist.send(t, dst=0)
    return None


def test_both_ranks_receive_first():
    result = pytest_ddp.run(both_recv_first, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "p2p_cycle", [0, 1])
    assert "recv #1 from 1" in result.diagnosis.text


def test_recv_from_the_wrong_source():
    result = pytest_ddp.run(wrong_source, world_size=3, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "partial", [2])
    assert "recv #1 from 2" in result.diagnosis.text


def one_send_too_many(rank: int) -> None:
    t = torch.zeros(1)
    if rank == 0:
        dist.send(t, dst=1)
        dist.send(t, dst=1)  # rank 1 receives once
    else:
        dist.recv(t, src=0)
    dist.barrier()


def test_a_send_never_received():
    result = pytest_ddp.run(one_send_too_many, world_size=2, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.collective) == ("deadlock", "p2p_unmatched", "send")
    assert "no recv matches rank 0's send #2 to 1" in result.diagnosis.text
    assert "rank 0 -> rank 1 on WORLD: 2 sends, 1 recv; rank 0 waits in send #2 to 1" in result.diagnosis.text


def ring_from_minus_one(rank: int) -> None:
    token = torch.zeros(1)
    if rank == 0:
        dist.send(token, dst=1)
        dist.recv(token, src=rank - 1)  # -1: no rank (ADIOS2#3345: the ring's left of rank 0)
    else:
        dist.recv(token, src=rank - 1)
        dist.send(token, dst=(rank + 1) % 3)


def test_a_recv_from_no_rank_is_named_at_once():
    # Gloo waits for rank -1's address until the group's timeout: certain at once.
    result = pytest_ddp.run(ring_from_minus_one, world_size=3, timeout=30)
    assert (result.outcome, result.diagnosis.kind, result.diagnosis.culprits) == ("deadlock", "p2p_unmatched", [0])
    assert "rank 0 waits in recv #1 from -1" in result.diagnosis.text
    assert "a rank its group (ranks 0-2) does not have" in result.diagnosis.text


@pytest.mark.ddp(world_size=2)
def test_recv_from_any_source_returns_the_sender(rank):
    assert any_source(rank) == (1 if rank == 0 else None)


@pytest.mark.ddp(world_size=2)
def test_fixed_one_side_sends_first(rank):
    t = torch.tensor([float(rank)])
    if rank == 0:
        dist.send(t, dst=1)
        dist.recv(t, src=1)
    else:
        received = torch.zeros(1)
        dist.recv(received, src=0)
        dist.send(t, dst=0)
    assert t.item() == 1.0


def uneven_batches_then_all_reduce(rank: int) -> None:
    """Pipeline-style: rank 0 batches two sends, rank 1 receives them one by one."""
    if rank == 0:
        for _ in range(2):
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(1), 1)]):
                work.wait()
    else:
        for _ in range(2):
            dist.recv(torch.zeros(1), src=0)
    dist.all_reduce(torch.ones(1))


def test_batched_p2p_does_not_shift_the_collective_sequence():
    result = pytest_ddp.run(uneven_batches_then_all_reduce, world_size=2, timeout=30)
    assert result.outcome == "passed" and result.collective_differences == []
    for rank in result.ranks:
        assert [(c.op, c.seq) for c in rank.collectives if c.op == "all_reduce"] == [("all_reduce", 1)]


def receive_never_waited_for(rank: int) -> None:
    if rank == 1:
        dist.irecv(torch.zeros(1), src=0)  # rank 0 never sends; nobody calls wait()


def test_a_receive_never_waited_for_is_left_in_flight():
    # Gloo lets both ranks return; the receive is still posted, and the next
    # message from rank 0 on this group would land in it.
    result = pytest_ddp.run(receive_never_waited_for, world_size=2, timeout=30)
    assert result.outcome == "passed"
    [line] = result.unfinished_work
    assert line.startswith("rank 1: irecv #1 from 0 (") and "test_point_to_point.py:" in line


@pytest.mark.ddp(world_size=2)
def test_fixed_every_request_is_waited_for(rank):
    t = torch.zeros(1)
    work = dist.isend(torch.ones(1), dst=1) if rank == 0 else dist.irecv(t, src=0)
    work.wait()
    assert rank == 0 or t.item() == 1.0

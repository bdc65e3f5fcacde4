"""Groups and point-to-point: new groups created differently, sends that wait for each other,
roots and shapes that differ."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="new_group_different_ranks_per_rank",
        url="https://github.com/pytorch/pytorch/issues/130102",
        summary="hierarchical communication: ranks 0 and 3 create new_group([0, 3]) while ranks 1 and "
        "2 create new_group([1, 2]), and the barrier on the subgroup hangs",
        world_size=4,
        body="""\
grp_ranks = [0, 3] if rank in (0, 3) else [1, 2]
grp = dist.new_group(ranks=grp_ranks)  # <- culprit line
dist.barrier(group=grp)
""",
        twin="""\
g03 = dist.new_group(ranks=[0, 3])  # every rank creates every group, in the same order
g12 = dist.new_group(ranks=[1, 2])
dist.barrier(group=g03 if rank in (0, 3) else g12)
""",
        kind="mismatch",
        culprits=(0, 1, 2, 3),
        op="new_group",
    ),
    Case(
        name="send_before_recv_on_both_ranks",
        url="https://github.com/NVIDIA/nccl/issues/479",
        summary="rank 0 sends to 1 then receives, rank 1 sends to 0 then receives: they are stuck",
        world_size=2,
        body="""\
peer = 1 - rank
out = torch.full((1 << 22,), float(rank))
inp = torch.empty(1 << 22)
dist.send(out, dst=peer)  # <- culprit line
dist.recv(inp, src=peer)
""",
        twin="""\
peer = 1 - rank
out = torch.full((1 << 22,), float(rank))
inp = torch.empty(1 << 22)
ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, inp, peer)]
for work in dist.batch_isend_irecv(ops):  # one send-receive, as the thread's grouped calls
    work.wait()
assert inp[0].item() == float(peer)
""",
        kind="p2p_cycle",
        culprits=(0, 1),
        op="send",
    ),
    Case(
        name="reduce_with_each_rank_as_dst",
        url="https://github.com/pytorch/pytorch/issues/39706",
        summary="reduce called with an inconsistent dst across ranks (each its own rank) finishes, "
        "but what follows hangs",
        world_size=2,
        body="""\
x = torch.zeros(3)
dist.reduce(x, dst=rank)  # <- culprit line
dist.all_reduce(x)
""",
        twin="""\
x = torch.zeros(3)
dist.reduce(x, dst=0)
dist.all_reduce(x)
""",
        kind="mismatch",
        culprits=(0, 1),
        op="reduce",
    ),
    Case(
        name="all_reduce_shape_differs_on_rank0",
        url="https://github.com/NVIDIA/nccl/issues/1394",
        summary="all_reduce of a (100, 2560) tensor on rank 0 and (200, 2560) elsewhere hangs on NCCL "
        "and aborts on Gloo (op.preamble.length <= op.nbytes)",
        world_size=4,
        body="""\
a = 100 if rank == 0 else 200
x = torch.ones(a, 256)
dist.all_reduce(x, op=dist.ReduceOp.SUM)  # <- culprit line
""",
        twin="""\
x = torch.ones(200, 256)
dist.all_reduce(x, op=dist.ReduceOp.SUM)
""",
        kind="mismatch",
        culprits=(0,),
        op="all_reduce",
    ),
]

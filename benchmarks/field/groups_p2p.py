"""Groups and point-to-point: new groups created differently or by some ranks only, a subgroup's
root named by the wrong rank, sends that wait for each other or that no one matches, roots and
shapes that differ."""

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
    Case(
        name="new_group_in_context_entered_by_subgroup",
        url="https://github.com/vllm-project/llm-compressor/pull/2869",
        summary="suspend_distributed_timeout calls dist.new_group, a collective of the whole default "
        "group; entered by the ranks of a subgroup only, it hangs (the review's finding)",
        world_size=3,
        body="""\
def suspend_distributed_timeout(current_group):  # a long timeout around a slow calibration
    suspend_group = dist.new_group(backend="gloo")  # <- culprit line
    dist.barrier(group=suspend_group)


ep_group = dist.new_group([0, 1])  # created on every rank
if rank in (0, 1):  # only the expert-parallel ranks calibrate
    suspend_distributed_timeout(ep_group)
dist.barrier()
""",
        twin="""\
def suspend_distributed_timeout(current_group):
    suspend_group = dist.new_group(backend="gloo")
    dist.barrier(group=suspend_group)


ep_group = dist.new_group([0, 1])
suspend_distributed_timeout(ep_group)  # every rank of the default group enters it
dist.barrier()
""",
        kind="mismatch",
        culprits=(0, 1),
        op="new_group",
    ),
    Case(
        name="asymmetric_batched_p2p_receive",
        url="https://github.com/NVIDIA/nccl/issues/2130",
        summary="batch_isend_irecv hangs on the receiver with asymmetric batched P2P ops: rank 0's "
        "second batch holds a send and a receive, rank 1's only the matching receive",
        world_size=2,
        body="""\
out, buf = torch.ones(1), torch.zeros(1)
first = [dist.P2POp(dist.isend, out, 1 - rank), dist.P2POp(dist.irecv, buf, 1 - rank)]
for work in dist.batch_isend_irecv(first):  # the first phase: symmetric
    work.wait()
if rank == 0:  # the second phase
    send, recv = dist.P2POp(dist.isend, out, 1), dist.P2POp(dist.irecv, buf, 1)
    works = dist.batch_isend_irecv([send, recv])  # <- culprit line
else:
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 0)])
for work in works:
    work.wait()
dist.barrier()
""",
        twin="""\
out, buf = torch.ones(1), torch.zeros(1)
first = [dist.P2POp(dist.isend, out, 1 - rank), dist.P2POp(dist.irecv, buf, 1 - rank)]
for work in dist.batch_isend_irecv(first):
    work.wait()
if rank == 0:  # send_only: the second batch matches the peer's
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, 1)])
else:
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 0)])
for work in works:
    work.wait()
dist.barrier()
""",
        kind="p2p_unmatched",
        culprits=(0,),
        op="irecv",
    ),
    Case(
        name="broadcast_src_global_rank_on_subgroup",
        url="https://github.com/meta-pytorch/torchrec/pull/4601",
        summary="the leader is picked by group-local rank but broadcast_object_list gets it as the "
        "global src: on a subgroup without global rank 0 it raises `Global rank 0 is not part of "
        "group`",
        world_size=3,
        body="""\
intra_node = dist.new_group([1, 2])  # the second host's ranks
if rank in (1, 2):
    leader = 0  # group-local rank of the process that runs the callback
    obj = [{"plan": "sharded"}] if dist.get_rank(intra_node) == leader else [None]
    dist.broadcast_object_list(obj, src=leader, group=intra_node)  # <- culprit line
dist.barrier()
""",
        twin="""\
intra_node = dist.new_group([1, 2])
if rank in (1, 2):
    leader = 0
    obj = [{"plan": "sharded"}] if dist.get_rank(intra_node) == leader else [None]
    dist.broadcast_object_list(obj, group_src=leader, group=intra_node)  # group-local
    assert obj[0] == {"plan": "sharded"}
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1, 2),
        op="broadcast",
    ),
    Case(
        name="pipeline_ranks_both_send_before_receiving",
        url="https://github.com/pytorch/pytorch/issues/172668",
        summary="with each RECV deferred to just before its compute, both pipeline ranks SEND first "
        "and wait for the send to finish, and neither receives; the fix orders by rank parity",
        world_size=2,
        body="""\
peer = 1 - rank
act, grad = torch.ones(8), torch.zeros(8)
dist.send(act, dst=peer)  # <- culprit line
dist.recv(grad, src=peer)
""",
        twin="""\
peer = 1 - rank
act, grad = torch.ones(8), torch.zeros(8)
if rank < peer:  # the lower rank posts its receive first
    dist.recv(grad, src=peer)
    dist.send(act, dst=peer)
else:
    dist.send(act, dst=peer)
    dist.recv(grad, src=peer)
""",
        kind="p2p_cycle",
        culprits=(0, 1),
        op="send",
    ),
    Case(
        name="ring_handshake_receives_from_minus_one",
        url="https://github.com/ornladios/ADIOS2/pull/3345",
        summary="the handshake ring: rank 0 receives its message from rank - 1, which is -1, instead "
        "of from the last rank, whose send then waits forever",
        world_size=3,
        body="""\
left, right = rank - 1, (rank + 1) % world_size
token = torch.zeros(1)
if rank == 0:
    dist.send(torch.ones(1), dst=right)
    dist.recv(token, src=left)  # <- culprit line
else:
    dist.recv(token, src=left)
    dist.send(token, dst=right)
""",
        twin="""\
left, right = (rank - 1) % world_size, (rank + 1) % world_size  # rank 0's left is the last rank
token = torch.zeros(1)
if rank == 0:
    dist.send(torch.ones(1), dst=right)
    dist.recv(token, src=left)
else:
    dist.recv(token, src=left)
    dist.send(token, dst=right)
assert token.item() == 1.0
""",
        kind="p2p_unmatched",
        culprits=(0,),
        op="recv",
    ),
    Case(
        name="pipeline_recv_kept_while_sender_captures",
        url="https://github.com/NVIDIA/TensorRT-LLM/pull/3688",
        summary="PP4 hang: while CUDA graphs are captured the previous stage sends nothing, but the "
        "next stage still posts its PP.recv(); the fix avoids that unmatched receive",
        world_size=2,
        body="""\
capturing = True  # warming up: the graphs are being captured
hidden = torch.zeros(4)
if rank == 0:
    if not capturing:  # the first stage sends nothing while it captures
        dist.send(torch.ones(4), dst=1)
else:
    dist.recv(hidden, src=0)  # <- culprit line
dist.barrier()
""",
        twin="""\
capturing = True
hidden = torch.zeros(4)
if rank == 0:
    if not capturing:
        dist.send(torch.ones(4), dst=1)
elif not capturing:  # no receive for a send that is not made
    dist.recv(hidden, src=0)
dist.barrier()
""",
        kind="p2p_unmatched",
        culprits=(1,),
        op="recv",
    ),
    Case(
        name="work_received_from_ranks_assumed_sequential",
        url="https://github.com/hpc/mpifileutils/pull/26",
        summary="the list of ranks sending us work is not necessarily sequential: receiving from each "
        "rank in turn hangs the process on a message that is never sent; the fix builds the actual "
        "list of senders",
        world_size=3,
        body="""\
has_work = rank == 2  # only rank 2 found files to hand over
if rank == 0:
    for src in range(1, world_size):  # every other rank, in order
        item = torch.zeros(1)
        dist.recv(item, src=src)  # <- culprit line
elif has_work:
    dist.send(torch.ones(1), dst=0)
dist.barrier()
""",
        twin="""\
has_work = rank == 2
flags = [torch.zeros(1) for _ in range(world_size)]
dist.all_gather(flags, torch.tensor([float(has_work)]))
senders = [r for r in range(1, world_size) if flags[r].item()]  # the ranks that will send
if rank == 0:
    for src in senders:
        item = torch.zeros(1)
        dist.recv(item, src=src)
elif has_work:
    dist.send(torch.ones(1), dst=0)
dist.barrier()
""",
        kind="p2p_unmatched",
        culprits=(0,),
        op="recv",
    ),
    Case(
        name="gather_dst_as_group_rank_on_subgroup",
        url="https://github.com/pytorch/pytorch/pull/118359",
        summary="gather's dst is a global rank even when a subgroup is passed: dst=0 meant as the "
        "group's first member raises on a subgroup that does not hold global rank 0",
        world_size=3,
        body="""\
pair = dist.new_group([1, 2])
if rank in (1, 2):
    out = [torch.zeros(1) for _ in range(2)] if rank == 1 else None
    dist.gather(torch.tensor([float(rank)]), out, dst=0, group=pair)  # <- culprit line
dist.barrier()
""",
        twin="""\
pair = dist.new_group([1, 2])
if rank in (1, 2):
    out = [torch.zeros(1) for _ in range(2)] if rank == 1 else None
    dist.gather(torch.tensor([float(rank)]), out, group_dst=0, group=pair)  # group-local
    if rank == 1:
        assert [t.item() for t in out] == [1.0, 2.0]
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1, 2),
        op="gather",
    ),
    Case(
        name="tp_gather_dst_as_group_rank_under_pp",
        url="https://github.com/vllm-project/vllm/pull/2528",
        summary="tensor_model_parallel_gather passes dst=0 meant within the TP group, but gather's dst "
        "is a global rank: with pipeline parallelism the last stage's TP group does not hold rank 0",
        world_size=4,
        body="""\
tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # PP=2, TP=2
tp_group = tp_groups[rank // 2]
tokens = torch.zeros(1)
if rank >= 2:  # the last pipeline stage computes the logits
    logits = torch.full((2,), float(rank))
    dst = 0  # tensor_model_parallel_gather(logits, dst=0)
    gathered = [torch.zeros(2) for _ in range(2)] if dist.get_rank(tp_group) == dst else None
    dist.gather(logits, gathered, dst=dst, group=tp_group)  # <- culprit line
    tokens += 1
dist.broadcast(tokens, src=2)  # the sampled tokens, sent to every stage
""",
        twin="""\
tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
tp_group = tp_groups[rank // 2]
tokens = torch.zeros(1)
if rank >= 2:
    logits = torch.full((2,), float(rank))
    dst = dist.get_global_rank(tp_group, 0)  # the global rank of the group's first member
    gathered = [torch.zeros(2) for _ in range(2)] if rank == dst else None
    dist.gather(logits, gathered, dst=dst, group=tp_group)
    tokens += 1
dist.broadcast(tokens, src=2)
assert tokens.item() == 1.0
""",
        kind="rank_exited",
        culprits=(2, 3),
        op="gather",
    ),
    Case(
        name="tp_cpu_group_created_by_its_members_only",
        url="https://github.com/huggingface/transformers/pull/48302",
        summary="the continuous-batching TP CPU group is created with a plain new_group by the ranks "
        "of each TP group only; with two TP groups the concurrent per-subset calls deadlock in gloo's "
        "connectFullMesh",
        world_size=4,
        body="""\
tp_size = 2  # one continuous-batching manager per node, data parallel across the nodes
first = rank // tp_size * tp_size
tp_ranks = list(range(first, first + tp_size))
tp_cpu_group = dist.new_group(tp_ranks, backend="gloo")  # <- culprit line
dist.barrier(group=tp_cpu_group)
""",
        twin="""\
tp_size = 2
first = rank // tp_size * tp_size
tp_ranks = list(range(first, first + tp_size))
tp_cpu_group = dist.new_group(tp_ranks, backend="gloo", use_local_synchronization=True)  # members only
dist.barrier(group=tp_cpu_group)
""",
        kind="mismatch",
        culprits=(0, 1, 2, 3),
        op="new_group",
    ),
]

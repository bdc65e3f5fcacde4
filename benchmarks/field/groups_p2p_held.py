"""Groups and point-to-point, held out (the fourth set): a gather whose dst is the group's first
rank under pipeline parallelism, a tensor-parallel CPU group that only its members create."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
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
        held_out=True,
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
        held_out=True,
    ),
]

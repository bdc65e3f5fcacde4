"""Control flow, held out (the fifth set): a collective that only a cache miss makes, with each rank's
compile cache its own."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="compile_collective_only_on_cache_miss",
        url="https://github.com/pytorch/pytorch/pull/193043",
        summary="during compilation some steps run collectives (sync_decision_cross_ranks); if some ranks "
        "hit the aot_autograd cache while others miss, only the ranks that missed run the collective, "
        "which hangs (the fix: sync the cache hit/miss decision across ranks first)",
        world_size=3,
        body="""\
cache = {"fwd_graph"} if rank != 1 else set()  # rank 1's node has a cold aot_autograd cache


def sync_decision_cross_ranks(decision):  # a compile step's collective: every rank's choice
    decisions = [None] * world_size
    dist.all_gather_object(decisions, decision)  # <- culprit line
    return max(decisions)


def compile_graph(key):
    if key in cache:  # a cache hit: the compiled artifact is loaded, no collective
        return key
    sync_decision_cross_ranks("bucket_size_25mb")
    cache.add(key)
    return key


compile_graph("fwd_graph")
dist.all_reduce(torch.ones(4))  # the first training step's gradients
""",
        twin="""\
cache = {"fwd_graph"} if rank != 1 else set()


def sync_decision_cross_ranks(decision):
    decisions = [None] * world_size
    dist.all_gather_object(decisions, decision)
    return max(decisions)


def sync_cache_decision_cross_ranks(hit):  # every rank agrees: a miss anywhere is a miss everywhere
    hits = [None] * world_size
    dist.all_gather_object(hits, hit)
    return all(hits)


def compile_graph(key):
    if sync_cache_decision_cross_ranks(key in cache):
        return key
    sync_decision_cross_ranks("bucket_size_25mb")
    cache.add(key)
    return key


compile_graph("fwd_graph")
dist.all_reduce(torch.ones(4))
""",
        kind="mismatch",
        culprits=(1,),
        op="all_gather_object",
        held_out=True,
    ),
]

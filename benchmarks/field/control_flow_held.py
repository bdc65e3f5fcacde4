"""Control flow, held out (the third set): a collective that one rank makes more or fewer times
than the others, behind a rank check, an early return or a data-dependent loop."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="summary_stats_reduced_on_rank0_only",
        url="https://github.com/netket/netket/pull/2275",
        summary="expect_to_precision's summary calls get_stats, a cross-process reduction, under "
        "`if verbose and _is_rank0:`; the extra collective on rank 0 pairs with the others' next "
        "get_stats, and rank 0's real one is left with no partner",
        world_size=2,
        body="""\
def get_stats(estimate):  # a cross-process reduction over every rank's samples
    t = torch.tensor([estimate])
    dist.all_reduce(t)
    return t.item() / world_size


stats = get_stats(float(rank))  # the estimate, on every rank
if rank == 0:  # `if verbose and _is_rank0:` the end-of-loop summary
    err = get_stats(stats)  # <- culprit line
    print(f"[done] max error = {err:g}")
energy = get_stats(1.0)  # the caller's final evaluate
""",
        twin="""\
def get_stats(estimate):
    t = torch.tensor([estimate])
    dist.all_reduce(t)
    return t.item() / world_size


stats = get_stats(float(rank))
err = get_stats(stats)  # computed on every rank; only the write is gated
if rank == 0:
    print(f"[done] max error = {err:g}")
energy = get_stats(1.0)
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
        held_out=True,
    ),
    Case(
        name="writing_check_returns_early_on_empty_queue",
        url="https://github.com/sgl-project/sglang/pull/26923",
        summary="writing_check skips its all_reduce when the rank's ongoing_write_through is empty, "
        "assuming every rank holds the same queue; one rank's empties first, it goes on to the next "
        "event loop's request broadcast while its peers wait in the all_reduce",
        world_size=3,
        body="""\
ongoing_write_through = {} if rank == 2 else {"node-7": 1}  # rank 2's host-pool alloc failed


def writing_check():
    # NOTE: all ranks has the same ongoing_write_through, can skip sync if empty
    if len(ongoing_write_through) == 0:
        return
    finish_count = torch.tensor([len(ongoing_write_through)])
    dist.all_reduce(finish_count, op=dist.ReduceOp.MIN)  # <- culprit line
    ongoing_write_through.clear()


for step in range(2):  # event_loop_overlap
    reqs = [None]
    dist.broadcast_object_list(reqs, src=0)  # recv_requests
    writing_check()
""",
        twin="""\
ongoing_write_through = {} if rank == 2 else {"node-7": 1}


def writing_check():
    finish_count = torch.tensor([len(ongoing_write_through)])
    dist.all_reduce(finish_count, op=dist.ReduceOp.MIN)  # unconditional; an empty queue adds 0
    for _ in range(int(finish_count.item())):
        ongoing_write_through.popitem()


for step in range(2):
    reqs = [None]
    dist.broadcast_object_list(reqs, src=0)
    writing_check()
""",
        kind="mismatch",
        culprits=(2,),
        op="all_reduce",
        held_out=True,
    ),
    Case(
        name="moe_all_to_all_per_generated_token",
        url="https://github.com/microsoft/Tutel/issues/182",
        summary="validation with an MoE layer: the sequence generator runs one forward per token up "
        "to this rank's max_len, so the rank with the longer sentence makes an all_to_all the other "
        "rank never matches",
        world_size=2,
        body="""\
def moe_layer(x):  # the MoE layer: tokens go to their experts with an all_to_all in every forward
    out = [torch.empty(1) for _ in range(world_size)]
    dist.all_to_all(out, [x[:1].clone() for _ in range(world_size)])
    return x


sentence = ["How", "are", "you"] if rank == 0 else ["Thank", "you"]  # this rank's validation sample
for token in sentence:  # one decoding step per token, until this rank's max_len
    moe_layer(torch.ones(2))  # <- culprit line
""",
        twin="""\
def moe_layer(x):
    out = [torch.empty(1) for _ in range(world_size)]
    dist.all_to_all(out, [x[:1].clone() for _ in range(world_size)])
    return x


sentence = ["How", "are", "you"] if rank == 0 else ["Thank", "you"]
steps = torch.tensor([len(sentence)])
dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # every rank forwards as often as the longest
for step in range(int(steps.item())):
    moe_layer(torch.ones(2))
""",
        kind="partial",
        culprits=(0,),
        op="all_to_all",
        held_out=True,
    ),
]

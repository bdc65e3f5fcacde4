"""Control flow that differs between ranks: a collective inside a data-dependent branch."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="allreduce_inside_data_dependent_branch",
        url="https://github.com/dmlc/rabit/issues/19",
        summary="Allreduce hangs inside `if IsFeatureOk(i) && needMoreStep[i]`; the maintainer: make "
        "sure every node enters that if clause",
        world_size=3,
        body="""\
need_more_step = [True, True] if rank != 2 else [True, False]  # computed from this rank's rows
for feature in range(2):
    if need_more_step[feature]:
        dist.all_reduce(torch.ones(3))  # <- culprit line
dist.barrier()
""",
        twin="""\
need_more_step = [True, True] if rank != 2 else [True, False]
for feature in range(2):
    flag = torch.tensor([float(need_more_step[feature])])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every node decides the same
    if flag.item():
        dist.all_reduce(torch.ones(3))
dist.barrier()
""",
        kind="mismatch",
        culprits=(2,),
        op="all_reduce",
    ),
]

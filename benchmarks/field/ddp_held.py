"""DDP, held out (the fifth set): uneven inputs under model.join() with a collective of the user's own
in the loop, which the joined rank does not shadow."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="ddp_join_with_own_all_reduce_in_loop",
        url="https://github.com/pytorch/pytorch/pull/57448",
        summary="DDP's join() shadows only DDP's own collectives for a rank that ran out of inputs; a "
        "training loop with an all-reduce of its own (its loss statistics) leaves the rank with more "
        "inputs waiting in it (the documented answer: throw_on_early_termination=True, caught on "
        "every rank)",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = 3 if rank == 0 else 2  # uneven inputs
with model.join():
    for _ in range(batches):
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        stats = torch.tensor([loss.item(), 2.0, 1.0])  # loss, samples, steps
        dist.all_reduce(stats)  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = 3 if rank == 0 else 2
try:
    with model.join(throw_on_early_termination=True):
        for _ in range(batches):
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            stats = torch.tensor([loss.item(), 2.0, 1.0])
            dist.all_reduce(stats)
except RuntimeError:
    pass  # every rank learns that one rank ran out of inputs, and all stop together
""",
        kind="mismatch",
        culprits=(0,),
        op="all_reduce",
        held_out=True,
    ),
]

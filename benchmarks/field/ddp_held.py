"""DDP, held out (the fourth set): a loss replaced by a new zero tensor on the rank whose batch has
nothing to learn from."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="ddp_new_zero_tensor_as_loss",
        url="https://github.com/pytorch/pytorch/issues/23425",
        summary="a multi-task network returns a new zero tensor as the loss on the GPU whose image has "
        "no target for the task, and training hangs: that tensor has no autograd graph, so DDP's "
        "backward reduction never runs there",
        world_size=2,
        body="""\
model = DDP(nn.Linear(4, 2))
for step in range(2):
    out = model(torch.ones(2, 4))
    has_target = not (rank == 1 and step == 1)  # rank 1's image has no ground truth for task a
    loss_a = out.sum() if has_target else torch.zeros(1, requires_grad=True)  # no loss computed
    loss_a.backward()  # <- culprit line
""",
        twin="""\
model = DDP(nn.Linear(4, 2))
for step in range(2):
    out = model(torch.ones(2, 4))
    has_target = not (rank == 1 and step == 1)
    loss_a = out.sum() if has_target else out.sum() * 0  # the computed loss, with its graph
    loss_a.backward()
""",
        kind="partial",
        culprits=(1,),
        op="all_reduce",
        held_out=True,
    ),
]

"""FSDP2 and DTensor, held out (the fourth set): a validation loop that runs each rank's shard to
its end."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="fsdp_validation_steps_minus_one",
        url="https://github.com/pytorch/torchtitan/issues/1618",
        summary="the validation loop hangs with validation.steps = -1: each rank consumes its own "
        "shard of the dataset, and a rank whose shard ends first leaves for the loss's dist_sum while "
        "the others still run a forward",
        world_size=2,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
for block in model:  # apply_fsdp: each transformer block, then the root
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
val_batches = [torch.ones(2, 4)] * (3 if rank == 0 else 2)  # this rank's shard of c4_validation
steps = -1  # consume all the data in the dataset
loss_sum, num_steps = torch.zeros(1), torch.zeros(1)
with torch.no_grad():
    for step, batch in enumerate(val_batches):
        if steps != -1 and step >= steps:
            break
        loss_sum += model(batch).sum()  # <- culprit line
        num_steps += 1
dist.all_reduce(loss_sum)  # dist_sum
dist.all_reduce(num_steps)
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
for block in model:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
val_batches = [torch.ones(2, 4)] * (3 if rank == 0 else 2)
steps = 2  # a number of steps no rank's shard runs out of
loss_sum, num_steps = torch.zeros(1), torch.zeros(1)
with torch.no_grad():
    for step, batch in enumerate(val_batches):
        if steps != -1 and step >= steps:
            break
        loss_sum += model(batch).sum()
        num_steps += 1
dist.all_reduce(loss_sum)
dist.all_reduce(num_steps)
assert num_steps.item() == 2 * world_size
""",
        kind="mismatch",
        culprits=(1,),
        op="all_gather_into_tensor",
        held_out=True,
    ),
]

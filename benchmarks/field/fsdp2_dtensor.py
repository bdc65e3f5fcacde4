"""FSDP2 and DTensor: every rank must issue the all-gathers."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="fsdp2_rank_with_empty_batch_skips_forward",
        url="https://github.com/pytorch/pytorch/issues/152964",
        summary="FSDP2 assumes SPMD; a rank whose dataloader returns an empty batch skips forward and "
        "the job hangs (users add a dummy forward)",
        world_size=3,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
fully_shard(model, mesh=mesh)
batch = torch.ones(2, 4) if rank != 2 else torch.ones(0, 4)  # rank 2's loader came up empty
with torch.no_grad():
    if len(batch) > 0:
        model(batch)  # <- culprit line
dist.barrier()
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
fully_shard(model, mesh=mesh)
batch = torch.ones(2, 4) if rank != 2 else torch.ones(0, 4)
with torch.no_grad():
    model(batch if len(batch) > 0 else torch.zeros(1, 4))  # a dummy input keeps it SPMD
dist.barrier()
""",
        kind="mismatch",
        culprits=(2,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="dtensor_full_tensor_on_rank0",
        url="https://github.com/areal-project/AReaL/pull/187",
        summary="full_tensor() called on rank 0 only, to save the weights; it must happen on every rank",
        world_size=3,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
weight = distribute_tensor(torch.arange(6.0).reshape(6, 1), mesh, [Shard(0)])
if rank == 0:  # only rank 0 writes the checkpoint
    full = weight.full_tensor()  # <- culprit line
    torch.save(full, ddp_shared_path / "weight.pt")
dist.barrier()
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
weight = distribute_tensor(torch.arange(6.0).reshape(6, 1), mesh, [Shard(0)])
full = weight.full_tensor()  # on every rank
if rank == 0:
    torch.save(full, ddp_shared_path / "weight.pt")
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="fsdp2_vision_tower_skipped_without_pixels",
        url="https://github.com/pytorch/pytorch/issues/152964",
        summary="the mllama example in the thread: `if pixel_values is not None:` runs the "
        "fully_shard-wrapped vision model, so a rank whose batch has no image skips its all-gather",
        world_size=3,
        held_out=True,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
vision, language = nn.Linear(4, 4), nn.Linear(4, 4)
fully_shard(vision, mesh=mesh)
fully_shard(language, mesh=mesh)
pixel_values = None if rank == 1 else torch.ones(1, 4)  # rank 1's batch is text only
with torch.no_grad():
    if pixel_values is not None:
        vision(pixel_values)  # <- culprit line
    language(torch.ones(1, 4))
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
vision, language = nn.Linear(4, 4), nn.Linear(4, 4)
fully_shard(vision, mesh=mesh)
fully_shard(language, mesh=mesh)
pixel_values = None if rank == 1 else torch.ones(1, 4)
with torch.no_grad():
    vision(pixel_values if pixel_values is not None else torch.zeros(1, 4))  # a dummy image
    language(torch.ones(1, 4))
""",
        kind="mismatch",
        culprits=(1,),
        op="all_gather_into_tensor",
    ),
]

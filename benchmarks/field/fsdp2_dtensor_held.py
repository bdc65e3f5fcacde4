"""FSDP2, held out (the third set): a full state dict gathered on the main rank only, a sharded
submodule that some ranks skip."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="fsdp_save_model_under_is_main",
        url="https://github.com/kyuz0/amd-strix-halo-llm-finetuning/pull/6",
        summary="trainer.save_model() is wrapped in `if is_main:`; with FSDP it gathers the state dict "
        "from the shards, a collective; the other rank exits after training and the main rank's "
        "all-gather finds its peer gone",
        world_size=2,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
fully_shard(model, mesh=mesh)
with torch.no_grad():
    model(torch.ones(2, 4))  # the training loop
if rank == 0:  # is_main
    # trainer.save_model(): the full state dict, gathered from every rank's shard
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}  # <- culprit line
    torch.save(state, ddp_shared_path / "adapter_model.pt")
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
fully_shard(model, mesh=mesh)
with torch.no_grad():
    model(torch.ones(2, 4))
state = {k: v.full_tensor() for k, v in model.state_dict().items()}  # save_model on every rank
if rank == 0:  # only rank 0 writes
    torch.save(state, ddp_shared_path / "adapter_model.pt")
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_into_tensor",
        held_out=True,
    ),
    Case(
        name="fsdp2_encoder_skipped_without_second_input",
        url="https://github.com/pytorch/pytorch/issues/148334",
        summary="a model that does not run on every rank: `if x1 is not None: x0 += "
        "model.encoder(x1)` hangs in the all-gather of the encoder's shards on the ranks that run "
        "it (the reporter's fix: a dummy pass on the others)",
        world_size=2,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
encoder, head = nn.Linear(4, 4), nn.Linear(4, 1)
fully_shard(encoder, mesh=mesh)
fully_shard(head, mesh=mesh)
x0 = torch.ones(2, 4)
x1 = torch.ones(2, 4) if rank == 0 else None  # rank 1's batch has no second input
with torch.no_grad():
    if x1 is not None:
        x0 = x0 + encoder(x1)  # <- culprit line
    y_pred = head(x0)
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
encoder, head = nn.Linear(4, 4), nn.Linear(4, 1)
fully_shard(encoder, mesh=mesh)
fully_shard(head, mesh=mesh)
x0 = torch.ones(2, 4)
x1 = torch.ones(2, 4) if rank == 0 else None
with torch.no_grad():
    if x1 is not None:
        x0 = x0 + encoder(x1)
    else:
        x0 = x0 + 0.0 * encoder(torch.zeros(2, 4))  # the dummy pass keeps the ranks in step
    y_pred = head(x0)
""",
        kind="mismatch",
        culprits=(1,),
        op="all_gather_into_tensor",
        held_out=True,
    ),
]

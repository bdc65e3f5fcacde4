"""FSDP and DTensor: every rank must issue the all-gathers (FSDP2, and FSDP1 where the report used
it), whatever its data, its random draws or its shard."""

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
        # partial, as verdicts.py defines it: rank 1's language all-gather met the others' vision
        # one (alike in size), then it returned without the all-gather they wait in
        kind="partial",
        culprits=(1,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="fsdp_summon_full_params_on_rank0_only",
        url="https://github.com/pytorch/pytorch/issues/101294",
        summary="summon_full_params entered on the rank 0 process only (misled by rank0_only) hangs: "
        "it all-gathers, so it must be called on all ranks",
        world_size=2,
        body="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
model(torch.ones(2, 4)).sum().backward()
if rank == 0:  # look at the full weights before the optimizer step, on one process
    with FSDP.summon_full_params(model, rank0_only=True, writeback=False):  # <- culprit line
        print(model.weight.norm())
""",
        twin="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
model(torch.ones(2, 4)).sum().backward()
with FSDP.summon_full_params(model, rank0_only=True, writeback=False):  # entered on all ranks
    if rank == 0:
        print(model.weight.norm())
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="fsdp_layerdrop_skips_a_layer_on_one_rank",
        url="https://github.com/facebookresearch/fairscale/issues/796",
        summary="layerdrop with each layer fully sharded hangs training: a rank whose random draw "
        "drops a layer skips that layer's all-gather; the workaround runs the layer and discards it",
        world_size=3,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
for layer in layers:
    fully_shard(layer, mesh=mesh)
draws = [[0.9, 0.9, 0.9], [0.9, 0.05, 0.9], [0.9, 0.9, 0.9]][rank]  # np.random.random() per rank
x = torch.ones(2, 4)
with torch.no_grad():
    for i, layer in enumerate(layers):
        if draws[i] > 0.1:  # layerdrop = 0.1
            x = layer(x)  # <- culprit line
dist.barrier()
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
for layer in layers:
    fully_shard(layer, mesh=mesh)
draws = [[0.9, 0.9, 0.9], [0.9, 0.05, 0.9], [0.9, 0.9, 0.9]][rank]
x = torch.ones(2, 4)
with torch.no_grad():
    for i, layer in enumerate(layers):
        out = layer(x)  # every rank runs every layer
        if draws[i] > 0.1:
            x = out
dist.barrier()
""",
        kind="mismatch",
        culprits=(1,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="empty_expert_shard_raises_while_loading",
        url="https://github.com/huggingface/transformers/pull/48237",
        summary="uneven sharding leaves one rank an empty local shard of the experts: torch.stack([]) "
        "raises on that rank at the end of loading, and the fully loaded ranks hang",
        world_size=3,
        body="""\
experts = [torch.full((2,), float(e)) for e in range(4)]  # 4 experts over 3 ranks: [2, 2, 0]
per_rank = -(-len(experts) // world_size)
mine = experts[rank * per_rank : (rank + 1) * per_rank]
merged = torch.stack(mine)  # <- culprit line
dist.all_reduce(torch.tensor([float(len(merged))]))  # the rest of loading, on every rank
""",
        twin="""\
experts = [torch.full((2,), float(e)) for e in range(4)]
per_rank = -(-len(experts) // world_size)
mine = experts[rank * per_rank : (rank + 1) * per_rank]
merged = torch.stack(mine) if mine else torch.empty(0, 2)  # an empty shard is a valid shard
total = torch.tensor([float(len(merged))])
dist.all_reduce(total)
assert total.item() == 4
""",
        kind="rank_exited",
        culprits=(2,),
        op="all_reduce",
    ),
    Case(
        name="fsdp_generate_without_synced_gpus",
        url="https://github.com/pytorch/pytorch/issues/100069",
        summary="generate with FSDP and differently sized data across ranks deadlocks unless "
        "synced_gpus=True: the rank that still decodes runs forward passes its peers never join",
        world_size=2,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
for layer in model:  # each decoder layer sharded: every forward all-gathers it
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
new_tokens = [2, 3][rank]  # rank 1's prompt needs one token more before its EOS
with torch.no_grad():
    for _ in range(new_tokens):  # generate(synced_gpus=False)
        model(torch.ones(1, 4))  # <- culprit line
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
for layer in model:  # each decoder layer sharded: every forward all-gathers it
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
new_tokens = [2, 3][rank]
with torch.no_grad():
    for step in range(3):  # synced_gpus=True: every rank steps until all are done
        done = torch.tensor([float(step >= new_tokens)])
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            break
        model(torch.ones(1, 4))  # a finished rank runs it too, its output unused
""",
        kind="partial",
        culprits=(1,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="fsdp_save_decided_on_reduced_loss",
        url="https://github.com/pytorch/pytorch/issues/77562",
        summary="FSDP training times out at the end of an epoch: the loss is summed with dist.reduce, "
        "so only rank 0 sees a new best and drops into the full-state-dict save while the others "
        "train on; the fix is all_reduce",
        world_size=2,
        body="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
best = float("inf")
for epoch in range(2):
    model(torch.ones(2, 4)).sum().backward()
    mine = [[1.0, 0.8], [1.0, 1.1]][rank][epoch]  # this rank's validation loss
    val = torch.tensor(mine)
    dist.reduce(val, dst=0, op=dist.ReduceOp.SUM)  # the sum lands on rank 0 only
    current = val.item() if rank == 0 else mine  # elsewhere the rank keeps its own value
    if current < best:  # a new best: save the model
        best = current
        state = model.state_dict()  # <- culprit line
""",
        twin="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
best = float("inf")
for epoch in range(2):
    model(torch.ones(2, 4)).sum().backward()
    val = torch.tensor([[1.0, 0.8], [1.0, 1.1]][rank][epoch])
    dist.all_reduce(val, op=dist.ReduceOp.SUM)  # every rank sees the same sum
    if val.item() < best:
        best = val.item()
        state = model.state_dict()
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="fsdp_validation_loop_runs_to_exhaustion",
        url="https://github.com/PrimeIntellect-ai/prime-rl/issues/2515",
        summary="the validation loop deadlocks with FSDP: variable-length samples give ranks different "
        "batch counts, and a rank still in an all-gather meets the others' post-loop all_reduce; "
        "the fix stops every rank on the same iteration",
        world_size=3,
        body="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
for layer in model:  # each layer sharded: every forward all-gathers it
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
val_batches = [torch.ones(2, 4)] * (4 if rank == 2 else 3)  # packed chunks: rank 2 got one more
total_loss = torch.zeros(1)
with torch.no_grad():
    for batch in val_batches:  # iterate the validation set to exhaustion
        total_loss += model(batch).sum()  # <- culprit line
dist.all_reduce(total_loss)
""",
        twin="""\
mesh = init_device_mesh("cpu", (world_size,))
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
for layer in model:  # each layer sharded: every forward all-gathers it
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
val_batches = [torch.ones(2, 4)] * (4 if rank == 2 else 3)
total_loss = torch.zeros(1)
batches = iter(val_batches)
with torch.no_grad():
    while True:
        batch = next(batches, None)
        has_data = torch.tensor([float(batch is not None)])
        dist.all_reduce(has_data, op=dist.ReduceOp.MIN)  # every rank stops on the same iteration
        if not has_data.item():
            break
        total_loss += model(batch).sum()
dist.all_reduce(total_loss)
""",
        kind="mismatch",
        culprits=(2,),
        op="all_gather_into_tensor",
    ),
    Case(
        name="fsdp2_rank_divergent_parameter_use",
        url="https://github.com/pytorch/pytorch/pull/170667",
        summary="FSDP with conditional parameter usage: a rank whose batch never reaches a submodule has "
        "no gradient for its parameters, and the post-backward reduce-scatters differ across ranks",
        world_size=3,
        body="""\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.expert = nn.Linear(4, 4)  # used only for the batches routed to it

    def forward(self, x, routed):
        h = self.shared(x)
        return self.expert(h) if routed else h


mesh = init_device_mesh("cpu", (world_size,))
model = Net()
fully_shard(model, mesh=mesh)
routed = rank != 2  # rank 2's batch is never routed to the expert
loss = model(torch.ones(2, 4), routed).sum()
loss.backward()  # <- culprit line
""",
        twin="""\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.expert = nn.Linear(4, 4)

    def forward(self, x, routed):
        h = self.shared(x)
        out = self.expert(h)  # run on every rank: a zero gradient where the batch is not routed
        return out if routed else h + 0 * out


mesh = init_device_mesh("cpu", (world_size,))
model = Net()
fully_shard(model, mesh=mesh)
routed = rank != 2
loss = model(torch.ones(2, 4), routed).sum()
loss.backward()
""",
        kind="mismatch",
        culprits=(2,),
        op="reduce_scatter_tensor",
    ),
    Case(
        name="fsdp2_empty_shard_all_to_all_sizes_differ",
        url="https://github.com/microsoft/dion/pull/74",
        summary="a 2D weight with fewer rows than ranks, sharded by FSDP2's contiguous chunking, leaves a "
        "rank an empty (0, D) shard; its all_to_all chunks differ in size from the others' and the "
        "all_to_all deadlocks; the fix pads every rank to the same ceil(rows / world_size)",
        world_size=4,
        body="""\
weight = torch.randn(3, 8)  # (num_attention_heads, hidden): 3 rows over 4 ranks
shards = list(torch.chunk(weight, world_size))  # contiguous chunking: ranks 0-2 a row each
local = shards[rank] if rank < len(shards) else weight.new_zeros(0, 8)  # rank 3: a (0, 8) shard
input_chunks = [local.clone() for _ in range(world_size)]
output_chunks = [torch.empty_like(local) for _ in range(world_size)]
dist.all_to_all(output_chunks, input_chunks)  # <- culprit line
""",
        twin="""\
weight = torch.randn(3, 8)
shards = list(torch.chunk(weight, world_size))
local = shards[rank] if rank < len(shards) else weight.new_zeros(0, 8)
padded = -(-weight.shape[0] // world_size)  # ceil(rows / world_size): the same on every rank
local = torch.cat([local, local.new_zeros(padded - local.shape[0], 8)])
input_chunks = [local.clone() for _ in range(world_size)]
output_chunks = [torch.empty_like(local) for _ in range(world_size)]
dist.all_to_all(output_chunks, input_chunks)
""",
        kind="mismatch",
        culprits=(3,),
        op="all_to_all",
    ),
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
    ),
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
    ),
]

"""Object collectives, held out (the fourth set): a dict of tensors broadcast on the default group
while the metadata went to a subgroup, multimodal inputs broadcast from global rank 0 inside a
later pipeline stage's group."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="broadcast_tensor_dict_tensors_miss_group",
        url="https://github.com/vllm-project/vllm/issues/3401",
        summary="broadcast_tensor_dict sends its metadata on the given group but calls dist.broadcast "
        "for the tensors without the group argument: with a group that is not the world, every "
        "worker hangs",
        world_size=3,
        body="""\
def broadcast_tensor_dict(tensor_dict=None, src=0, group=None):  # vllm's communication_op
    meta = [[(k, v.dtype, v.size()) for k, v in tensor_dict.items()] if rank == src else None]
    dist.broadcast_object_list(meta, src=src, group=group)
    out = {}
    for key, dtype, size in meta[0]:
        tensor = tensor_dict[key] if rank == src else torch.empty(size, dtype=dtype)
        dist.broadcast(tensor, src=src)  # <- culprit line
        out[key] = tensor
    return out


tp_group = dist.new_group([0, 1])  # the model's tensor-parallel workers; rank 2 is outside it
if rank in (0, 1):
    inputs = {"input_ids": torch.arange(4.0)} if rank == 0 else None
    broadcast_tensor_dict(inputs, src=0, group=tp_group)
dist.barrier()
""",
        twin="""\
def broadcast_tensor_dict(tensor_dict=None, src=0, group=None):
    meta = [[(k, v.dtype, v.size()) for k, v in tensor_dict.items()] if rank == src else None]
    dist.broadcast_object_list(meta, src=src, group=group)
    out = {}
    for key, dtype, size in meta[0]:
        tensor = tensor_dict[key] if rank == src else torch.empty(size, dtype=dtype)
        dist.broadcast(tensor, src=src, group=group)  # the tensors go on the same group
        out[key] = tensor
    return out


tp_group = dist.new_group([0, 1])
if rank in (0, 1):
    inputs = {"input_ids": torch.arange(4.0)} if rank == 0 else None
    out = broadcast_tensor_dict(inputs, src=0, group=tp_group)
    assert out["input_ids"].tolist() == [0.0, 1.0, 2.0, 3.0]
dist.barrier()
""",
        kind="mismatch",
        culprits=(0, 1),
        op="broadcast",
        held_out=True,
    ),
    Case(
        name="mm_inputs_broadcast_from_rank0_in_later_pp_stage",
        url="https://github.com/sgl-project/sglang/pull/12762",
        summary="the scheduler broadcasts the processed multimodal inputs with broadcast_object_list("
        "src=0, group=cpu_group): with PP > 1 the later stage's TP group does not hold global rank 0, "
        "its entry rank is the group's first rank",
        world_size=4,
        body="""\
cpu_groups = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")]  # PP=2
cpu_group = cpu_groups[rank // 2]  # this PP stage's TP group
image_inputs = {"pixel_values": [0.5] * 4} if rank % 2 == 0 else None  # its entry rank processed them
obj_list = [image_inputs]
dist.broadcast_object_list(obj_list, src=0, group=cpu_group)  # <- culprit line
dist.barrier()  # the pipeline's forward needs every stage
""",
        twin="""\
cpu_groups = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")]
cpu_group = cpu_groups[rank // 2]
image_inputs = {"pixel_values": [0.5] * 4} if rank % 2 == 0 else None
obj_list = [image_inputs]
first_rank = dist.get_process_group_ranks(cpu_group)[0]  # the TP group's first rank, a global rank
dist.broadcast_object_list(obj_list, src=first_rank, group=cpu_group)
assert obj_list[0] == {"pixel_values": [0.5] * 4}
dist.barrier()
""",
        kind="rank_exited",
        culprits=(2, 3),
        op="broadcast_object_list",
        held_out=True,
    ),
]

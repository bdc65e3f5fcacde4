"""Object collectives: objects that do not pickle, ranks that disagree on whether to call one."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="all_gather_object_unpicklable_on_one_rank",
        url="https://github.com/pytorch/pytorch/pull/42189",
        summary="all_gather_object needs picklable objects (the API's review thread); a rank whose "
        "stats hold a lock raises in pickling while its peers wait in the collective",
        world_size=2,
        body="""\
stats = {"loss": 0.5}
if rank == 1:
    stats["lock"] = threading.Lock()  # a logger's handle, kept on one rank only
gathered = [None] * world_size
dist.all_gather_object(gathered, stats)  # <- culprit line
""",
        twin="""\
stats = {"loss": 0.5}
gathered = [None] * world_size
dist.all_gather_object(gathered, stats)
assert gathered == [{"loss": 0.5}] * world_size
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_gather_object",
    ),
    Case(
        name="broadcast_object_list_divergent_exists",
        url="https://github.com/KempnerInstitute/KempnerForge/issues/49",
        summary="each rank calls exists() on the checkpoint; on a stale NFS view one rank skips "
        "broadcast_object_list and the others deadlock in it",
        world_size=3,
        body="""\
path = ddp_shared_path / "train_state.pt"
if rank == 0:
    torch.save({"step": 7}, path)
dist.barrier()
exists = path.exists() and rank != 1  # rank 1's attribute cache still says no file
state = [None]
if exists:
    dist.broadcast_object_list(state, src=0)  # <- culprit line
dist.barrier()
""",
        twin="""\
path = ddp_shared_path / "train_state.pt"
if rank == 0:
    torch.save({"step": 7}, path)
dist.barrier()
flag = torch.tensor([int(path.exists()) if rank == 0 else 0])
dist.broadcast(flag, src=0)  # rank 0's exists() decides for the group
state = [None]
if flag.item():
    dist.broadcast_object_list(state, src=0)
dist.barrier()
""",
        kind="mismatch",
        culprits=(1,),
        op="broadcast_object_list",
    ),
    Case(
        name="gather_for_metrics_under_main_process",
        url="https://github.com/huggingface/accelerate/issues/2785",
        summary="the script hangs on gather_for_metrics(): it was called under "
        "accelerator.is_main_process, so the other processes never join the gather",
        world_size=2,
        body="""\
preds = [f"label-{rank}-{i}" for i in range(2)]  # this process's decoded predictions
if rank == 0:  # accelerator.is_main_process: metrics are logged by the main process
    gathered = [None] * world_size
    dist.all_gather_object(gathered, preds)  # <- culprit line
dist.barrier()  # accelerator.wait_for_everyone()
""",
        twin="""\
preds = [f"label-{rank}-{i}" for i in range(2)]
gathered = [None] * world_size
dist.all_gather_object(gathered, preds)  # every process gathers; the main one logs
if rank == 0:
    assert len(gathered) == world_size
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="all_gather_object",
    ),
    Case(
        name="metrics_gather_skipped_when_empty",
        url="https://github.com/bo-ke/llm-internal-medicine/pull/45",
        summary="gather_and_aggregate returned early when the local metric dict was empty, skipping "
        "its all_gather_object; a pipeline stage with no monitored layer left every other rank in it",
        world_size=3,
        body="""\
def gather_and_aggregate(metrics):
    if not metrics:
        return {}  # "skip a useless collective"
    gathered = [None] * world_size
    dist.all_gather_object(gathered, metrics)  # <- culprit line
    return {k: sum(m.get(k, 0.0) for m in gathered) for k in metrics}


metrics = {} if rank == 2 else {"attn_entropy": 1.0}  # the last stage holds no monitored layer
gather_and_aggregate(metrics)
dist.barrier()
""",
        twin="""\
def gather_and_aggregate(metrics):
    gathered = [None] * world_size
    dist.all_gather_object(gathered, metrics)  # every rank enters the gather
    return {k: sum(m.get(k, 0.0) for m in gathered) for k in metrics}


metrics = {} if rank == 2 else {"attn_entropy": 1.0}
gather_and_aggregate(metrics)
dist.barrier()
""",
        kind="mismatch",
        culprits=(2,),
        op="all_gather_object",
    ),
    Case(
        name="gather_object_dst_group_rank_in_subgroup",
        url="https://github.com/pytorch/pytorch/pull/147675",
        summary="DCP's gather_object passed the coordinator's rank in its group as dst, which must "
        "be a rank of the global group: in hybrid sharding the second replica group raises",
        world_size=4,
        body="""\
groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
group = groups[rank // 2]  # one replica group per pair of ranks
coordinator = dist.get_rank(group) == 0
plans = [None] * 2 if coordinator else None
dist.gather_object({"rank": rank}, plans, dst=0, group=group)  # <- culprit line
dist.barrier()
""",
        twin="""\
groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
group = groups[rank // 2]
coordinator = dist.get_rank(group) == 0
plans = [None] * 2 if coordinator else None
dist.gather_object({"rank": rank}, plans, dst=dist.get_global_rank(group, 0), group=group)
dist.barrier()
""",
        kind="rank_exited",
        culprits=(2, 3),
        op="barrier",
    ),
    Case(
        name="latest_checkpoint_path_broadcast_inside_rank0_branch",
        url="https://github.com/meta-pytorch/tnt/pull/936",
        summary="get_latest_checkpoint_path broadcasts the path from rank 0; called inside an operation "
        "only rank 0 runs (a checkpoint read), its broadcast hangs as the other ranks never enter it",
        world_size=2,
        body="""\
def get_latest_checkpoint_path(dirpath):  # reads on rank 0 and broadcasts the path
    path = [str(dirpath / "epoch_3")] if rank == 0 else [None]
    dist.broadcast_object_list(path, src=0)  # <- culprit line
    return path[0]


if rank == 0:  # only rank 0 reads the checkpoint's metadata and reports it
    latest = get_latest_checkpoint_path(ddp_shared_path)
dist.barrier()
""",
        twin="""\
def _get_latest_checkpoint_path(dirpath):  # torch.distributed unaware: safe on one rank
    return str(dirpath / "epoch_3")


if rank == 0:
    latest = _get_latest_checkpoint_path(ddp_shared_path)
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast_object_list",
    ),
    Case(
        name="gather_object_list_passed_by_local_rank",
        url="https://github.com/EvolvingLMMs-Lab/lmms-eval/issues/322",
        summary="multi-node evaluation fails in gather_object: the evaluator passes the gather list where "
        "its own rank is 0, and that rank is the process's local rank, so the first process of the "
        "second node passes a list on a non-destination rank",
        world_size=4,
        body="""\
local_rank = rank % 2  # two nodes of two processes: lm.rank is the process's local rank
samples = {"doc_id": [rank], "resps": [f"answer {rank}"]}
full_samples = [None] * world_size if local_rank == 0 else None
dist.gather_object(obj=samples, object_gather_list=full_samples, dst=0)  # <- culprit line
""",
        twin="""\
local_rank = rank % 2
samples = {"doc_id": [rank], "resps": [f"answer {rank}"]}
full_samples = [None] * world_size if dist.get_rank() == 0 else None  # the global rank
dist.gather_object(obj=samples, object_gather_list=full_samples, dst=0)
if rank == 0:
    assert [s["doc_id"] for s in full_samples] == [[0], [1], [2], [3]]
""",
        kind="rank_exited",
        culprits=(2,),
        op="gather_object",
    ),
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
    ),
]

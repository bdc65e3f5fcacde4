"""Control flow that differs between ranks: a collective inside a rank or data-dependent branch,
collectives in another order, shapes and dtypes that differ across ranks (a branch on what each
rank sees for itself: control_flow_own_view.py)."""

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
    Case(
        name="allreduce_under_rank0_in_quit",
        url="https://github.com/deepmodeling/abacus-develop/pull/2557",
        summary="abacus hangs when nbands < ncpu: QUIT() calls MPI_Allreduce (to print the memory "
        "report) under `if (GlobalV::MY_RANK==0)`; the fix drops the condition",
        world_size=2,
        body="""\
def quit_run():  # ModuleBase::QUIT(): report the memory, then stop
    if rank == 0:  # GlobalV::MY_RANK == 0
        total = torch.tensor([float(rank + 1)])  # this rank's memory use
        dist.all_reduce(total)  # <- culprit line
        print("memory", total.item())


quit_run()
""",
        twin="""\
def quit_run():
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # every rank reduces
    if rank == 0:
        print("memory", total.item())


quit_run()
""",
        kind="partial",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="epoch_loss_all_sum_printed_on_rank0",
        url="https://github.com/ml-explore/mlx/issues/1210",
        summary="`if rank == 0: print(all_sum(epoch_loss))` in the epoch loop: every process has to "
        "take part in all_sum, otherwise there is a hang; the maintainer moves it out of the if",
        world_size=2,
        body="""\
for epoch in range(2):
    grad = torch.ones(4)
    dist.all_reduce(grad)  # the step's gradients, on every process
    epoch_loss = torch.tensor([1.0])
    if rank == 0:
        dist.all_reduce(epoch_loss)  # <- culprit line
        print(f"Epoch {epoch + 1}, Loss: {epoch_loss.item()}")
""",
        twin="""\
for epoch in range(2):
    grad = torch.ones(4)
    dist.all_reduce(grad)
    epoch_loss = torch.tensor([1.0])
    dist.all_reduce(epoch_loss)  # summed on every process
    if rank == 0:
        print(f"Epoch {epoch + 1}, Loss: {epoch_loss.item()}")
""",
        kind="mismatch",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="checkpoint_broadcast_in_main_process_only_hook",
        url="https://github.com/speechbrain/speechbrain/issues/2401",
        summary="end-of-epoch checkpointing in a main-process-only section: save_checkpoint's "
        "broadcast_object_list (BROADCAST, Long [1]) meets the other rank's gradient ALLREDUCE [25]",
        world_size=2,
        body="""\
def save_checkpoint(name):  # Checkpointer.save_checkpoint
    ckpt_dir = [str(ddp_shared_path / name)] if rank == 0 else [None]
    dist.broadcast_object_list(ckpt_dir, src=0)  # <- culprit line
    if rank == 0:
        torch.save({"epoch": name}, ckpt_dir[0] + ".pt")


for epoch in range(2):
    dist.all_reduce(torch.ones(25))  # backward's gradient all-reduce
    if rank == 0:  # on_stage_end, run on the main process only
        save_checkpoint(f"CKPT-{epoch}")
""",
        twin="""\
def save_checkpoint(name, main_process_only):
    if main_process_only:  # ddp_broadcast: nothing to share from a main-process-only section
        ckpt_dir = [str(ddp_shared_path / name)]
    else:
        ckpt_dir = [str(ddp_shared_path / name)] if rank == 0 else [None]
        dist.broadcast_object_list(ckpt_dir, src=0)
    if rank == 0:
        torch.save({"epoch": name}, ckpt_dir[0] + ".pt")


for epoch in range(2):
    dist.all_reduce(torch.ones(25))
    if rank == 0:
        save_checkpoint(f"CKPT-{epoch}", main_process_only=True)
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
    ),
    Case(
        name="metric_state_float64_on_one_rank",
        url="https://github.com/modelscope/ms-swift/pull/9551",
        summary="MeanMetric.compute builds its all_reduce tensor with an inferred dtype: float64 on "
        "the rank whose state took a numpy.bool_, float32 elsewhere, and the collective hangs",
        world_size=3,
        body="""\
import numpy as np

state, count = 0.0, 0
for correct in [True, True] if rank != 1 else [np.all([True]), True]:  # rank 1: sequence-level acc
    state += correct
    count += 1
tensor = torch.tensor([state, count])  # float64 where state became numpy.float64, else float32
dist.all_reduce(tensor)  # <- culprit line
""",
        twin="""\
import numpy as np

state, count = 0.0, 0
for correct in [True, True] if rank != 1 else [np.all([True]), True]:
    state += correct
    count += 1
tensor = torch.tensor([state, count], dtype=torch.float64)  # pinned: the same dtype everywhere
dist.all_reduce(tensor)
assert tensor[1].item() == 2 * world_size
""",
        kind="mismatch",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="all_gather_of_a_short_last_batch",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/7773",
        summary="all_gather of tensors whose first dimension differs across devices freezes with no "
        "error; the thread gathers the shapes, pads to the largest and trims",
        world_size=3,
        body="""\
preds = torch.ones(4 if rank != 2 else 2, 3)  # rank 2's last batch is short
gathered = [torch.zeros_like(preds) for _ in range(world_size)]
dist.all_gather(gathered, preds)  # <- culprit line
""",
        twin="""\
preds = torch.ones(4 if rank != 2 else 2, 3)
size = torch.tensor([preds.shape[0]])
sizes = [torch.zeros_like(size) for _ in range(world_size)]
dist.all_gather(sizes, size)
longest = int(max(s.item() for s in sizes))
padded = torch.zeros(longest, 3)
padded[: len(preds)] = preds
gathered = [torch.zeros_like(padded) for _ in range(world_size)]
dist.all_gather(gathered, padded)
parts = [g[: int(s.item())] for g, s in zip(gathered, sizes)]
assert sum(len(p) for p in parts) == 10
""",
        kind="mismatch",
        culprits=(2,),
        op="all_gather",
    ),
    Case(
        name="collectives_on_two_groups_in_divergent_order",
        url="https://github.com/meta-pytorch/torchrec/pull/4149",
        summary="a cross-PG deadlock: ranks that fell behind issue the mesh_replicate allreduce "
        "before the mesh_shard all_to_all the others issued first; each group waits for the other",
        world_size=3,
        body="""\
mesh_shard = dist.new_group([0, 1, 2])
mesh_replicate = dist.new_group([0, 1, 2])
out = torch.zeros(3)
if rank != 2:
    dist.all_to_all_single(out, torch.ones(3), group=mesh_shard)
    dist.all_reduce(torch.ones(2), group=mesh_replicate)
else:  # this rank fell behind: its allreduce goes first
    dist.all_reduce(torch.ones(2), group=mesh_replicate)  # <- culprit line
    dist.all_to_all_single(out, torch.ones(3), group=mesh_shard)
""",
        twin="""\
mesh_shard = dist.new_group([0, 1, 2])
mesh_replicate = dist.new_group([0, 1, 2])
out = torch.zeros(3)
dist.all_to_all_single(out, torch.ones(3), group=mesh_shard)  # the same order on every rank
dist.all_reduce(torch.ones(2), group=mesh_replicate)
""",
        kind="mismatch",
        culprits=(2,),
        op="all_reduce",
    ),
    Case(
        name="all_gather_scalar_against_matrix",
        url="https://github.com/pytorch/pytorch/issues/174844",
        summary="all_gather with rank 0's [3, 4] tensor against the others' scalars returns, and the "
        "barrier after it hangs",
        world_size=3,
        body="""\
if dist.get_rank() == 0:
    t = torch.zeros([3, 4])
else:
    t = torch.tensor(0.0)
dist.all_gather([torch.zeros_like(t) for _ in range(world_size)], t)  # <- culprit line
dist.barrier()
""",
        twin="""\
t = torch.zeros([3, 4])  # the same shape on every rank
dist.all_gather([torch.zeros_like(t) for _ in range(world_size)], t)
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="all_gather",
    ),
    Case(
        name="barrier_left_inside_rank0_download",
        url="https://github.com/huggingface/transformers-bloom-inference/pull/40",
        summary="a deadlock in bloom-ds-inference.py: rank 0 calls dist.barrier() inside its "
        "download block while the other processes do not",
        world_size=3,
        body="""\
if rank == 0:  # download the checkpoint and write its index
    (ddp_shared_path / "checkpoints.json").write_text('{"type": "BLOOM"}')
    dist.barrier()  # <- culprit line
dist.barrier()  # every process: the index is written
index = (ddp_shared_path / "checkpoints.json").read_text()
""",
        twin="""\
if rank == 0:
    (ddp_shared_path / "checkpoints.json").write_text('{"type": "BLOOM"}')
dist.barrier()  # outside the if: every process waits for the index once
index = (ddp_shared_path / "checkpoints.json").read_text()
assert "BLOOM" in index
""",
        kind="partial",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="validation_loader_barrier_on_main_worker_only",
        url="https://github.com/neuralmagic/sparseml/pull/29",
        summary="with DDP only the main worker downloads and runs the validation dataset, but a worker "
        "barrier lingers at the dataset load point: the main worker waits there for processes that never "
        "come; the fix removes that barrier",
        world_size=2,
        body="""\
def create_dataset(name):  # scripts/pytorch_vision.py: the other workers wait for the main one's download
    if rank > 0:
        dist.barrier()
    data = [torch.ones(2)] * 2  # torchvision's dataset, download=rank == 0
    if rank == 0:
        dist.barrier()  # <- culprit line
    return data


train_dataset = create_dataset("train")
for x in train_dataset:
    dist.all_reduce(x)  # the training steps
if rank == 0:  # only the main worker loads and runs the validation dataset
    val_dataset = create_dataset("val")
""",
        twin="""\
def create_dataset(name, sync=True):
    if sync and rank > 0:
        dist.barrier()
    data = [torch.ones(2)] * 2
    if sync and rank == 0:
        dist.barrier()
    return data


train_dataset = create_dataset("train")
for x in train_dataset:
    dist.all_reduce(x)
if rank == 0:
    val_dataset = create_dataset("val", sync=False)  # no worker barrier: the main worker alone
""",
        kind="partial",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="validation_reduce_on_rank_with_shorter_loader",
        url="https://github.com/lifeiteng/vall-e/pull/93",
        summary="on 8 GPUs one rank consumes its data loader first, enters compute_validation_loss and "
        "sticks in the loss tracker's reduce while the other ranks train the next batch; the fix "
        "all-gathers each rank's stop-iteration status and stops all ranks when any stops",
        world_size=3,
        body="""\
def compute_validation_loss():
    tot_loss = torch.tensor([1.5, 10.0])  # MetricsTracker: loss sum and frames
    dist.all_reduce(tot_loss)  # <- culprit line
    return tot_loss[0] / tot_loss[1]


model = DDP(nn.Linear(4, 1))
train_dl = [torch.ones(2, 4)] * (2 if rank == 1 else 3)  # rank 1's loader runs out first
for batch_idx, batch in enumerate(train_dl):
    model(batch).sum().backward()
valid_info = compute_validation_loss()
""",
        twin="""\
def compute_validation_loss():
    tot_loss = torch.tensor([1.5, 10.0])
    dist.all_reduce(tot_loss)
    return tot_loss[0] / tot_loss[1]


model = DDP(nn.Linear(4, 1))
train_dl = iter([torch.ones(2, 4)] * (2 if rank == 1 else 3))
while True:
    batch = next(train_dl, None)
    stops = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(stops, torch.tensor([float(batch is None)]))  # every rank's stop_iteration
    if any(s.item() for s in stops):
        break  # if any of them stops, stop all the ranks
    model(batch).sum().backward()
valid_info = compute_validation_loss()
""",
        kind="mismatch",
        culprits=(1,),
        op="all_reduce",
    ),
    Case(
        name="ci_metric_all_reduce_inside_main_rank_logging",
        url="https://github.com/radixark/miles/pull/2684",
        summary="log_train_step all-reduces the replay-check counts on the WORLD group, but on the "
        "Megatron backend it is only called under is_first_replica_megatron_main_rank(), true on one "
        "rank; the review: move the all_reduce outside the single-rank guard",
        world_size=3,
        body="""\
def log_train_step(rollout_id, role_tag="actor/"):
    counts = torch.tensor([3.0, 128.0])  # routing_replay_manager.pop_check_stats(): mismatched, checked
    dist.all_reduce(counts)  # <- culprit line
    mismatched, checked = counts.tolist()
    return {f"ci/{role_tag}r3_mismatch_fraction": mismatched / checked if checked else 0.0}


for rollout_id in range(2):
    dist.all_reduce(torch.ones(4))  # the step's gradients
    if rank == 0:  # is_first_replica_megatron_main_rank()
        log_train_step(rollout_id)
""",
        twin="""\
def log_train_step(rollout_id, counts, role_tag="actor/"):
    mismatched, checked = counts.tolist()
    return {f"ci/{role_tag}r3_mismatch_fraction": mismatched / checked if checked else 0.0}


for rollout_id in range(2):
    dist.all_reduce(torch.ones(4))
    counts = torch.tensor([3.0, 128.0])
    dist.all_reduce(counts)  # every WORLD rank collects its stats, outside the guard
    if rank == 0:
        log_train_step(rollout_id, counts)
""",
        kind="mismatch",
        culprits=(0,),
        op="all_reduce",
    ),
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
    ),
]

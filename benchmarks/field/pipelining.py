"""torch.distributed.pipelining: a schedule given fewer microbatches than stages, a stage whose output
is not what the next stage was told to receive, a schedule or a collective that only some stages
run."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="pp_1f1b_fewer_microbatches_than_stages",
        url="https://github.com/pytorch/torchtitan/issues/775",
        summary="PP hangs when pipeline_parallel_microbatches < pipeline_parallel_degree (1F1B's "
        "warmup); torch now refuses the schedule on every rank instead",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = Schedule1F1B(stage, n_microbatches=1, loss_fn=lambda out, tgt: out.sum())  # <- culprit line
if rank == 0:
    schedule.step(torch.ones(1, 4))
else:
    schedule.step(target=torch.ones(1, 4))
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = Schedule1F1B(stage, n_microbatches=world_size, loss_fn=lambda out, tgt: out.sum())
if rank == 0:
    schedule.step(torch.ones(2, 4))
else:
    schedule.step(target=torch.ones(2, 4))
""",
        kind="failed",
        culprits=(0, 1),
        op=None,
    ),
    Case(
        name="pp_stage_output_not_what_next_stage_expects",
        url="https://github.com/pytorch/pytorch/pull/126732",
        summary="a stage produces an output that is locally correct but not what the following stage "
        "expects (its output_args): a hang down the line; on Gloo the receiving stage aborts on the size",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

submod = nn.Linear(4, 8) if rank == 0 else nn.Linear(4, 4)  # stage 0 widened, its output_args not
example = torch.ones(2, 4)
shapes = {"input_args": (example,), "output_args": (example,)}  # given, so no shape inference
stage = PipelineStage(submod, rank, world_size, torch.device("cpu"), **shapes)
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, tgt: out.sum())
if rank == 0:
    schedule.step(torch.ones(4, 4))  # <- culprit line
else:
    schedule.step(target=torch.ones(4, 4))
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

submod = nn.Linear(4, 4)  # stage 0's output is what stage 1 takes
stage = PipelineStage(submod, rank, world_size, torch.device("cpu"))  # shapes inferred at runtime
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, tgt: out.sum())
if rank == 0:
    schedule.step(torch.ones(4, 4))
else:
    schedule.step(target=torch.ones(4, 4))
""",
        kind="mismatch",
        culprits=(0,),
        op="isend",
    ),
    Case(
        name="pp_eval_schedule_on_last_rank_only",
        url="https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/6025",
        summary="validation hangs with PP > 1: the non-loss collection pass ran the communicating "
        "schedule on the final rank only, which waits in recv_forward for a stage that skipped it",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2)  # forward only: the evaluation schedule
with torch.no_grad():
    if rank == world_size - 1:  # the non-loss collection pass, launched on the final rank
        outputs = schedule.step()  # <- culprit line
dist.barrier()
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2)
with torch.no_grad():  # every rank takes part in the schedule; the final one keeps the outputs
    outputs = schedule.step(torch.ones(4, 4)) if rank == 0 else schedule.step()
dist.barrier()
""",
        kind="p2p_unmatched",
        culprits=(1,),
        op="irecv",
    ),
    Case(
        name="pp_stage_skips_loss_tracker_all_reduce",
        url="https://github.com/NVIDIA/Megatron-LM/issues/4745",
        summary="PP deadlock when some pipeline stages have no CSA layers: reduce_loss_in_tracker() "
        "returns early on a stage without values, skipping the all_reduce over the PP group",
        world_size=3,
        body="""\
pp_group = dist.new_group(list(range(world_size)))  # the pipeline-parallel group
tracker = {} if rank == 0 else {"values": torch.tensor([0.5])}  # PP rank 0: dense layers only


def reduce_loss_in_tracker():
    if "values" not in tracker:
        return
    dist.all_reduce(tracker["values"], group=pp_group)  # <- culprit line


reduce_loss_in_tracker()
dist.barrier()  # the iteration's log
""",
        twin="""\
pp_group = dist.new_group(list(range(world_size)))
tracker = {} if rank == 0 else {"values": torch.tensor([0.5])}


def reduce_loss_in_tracker():
    values = tracker.get("values", torch.zeros(1))  # a stage without indexer contributes zero
    dist.all_reduce(values, group=pp_group)


reduce_loss_in_tracker()
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="pp_loss_average_on_stage_without_loss",
        url="https://github.com/huggingface/nanotron/pull/422",
        summary="with pp > 1 only the last stage holds the loss; the unguarded loss averaging fails "
        "on the other stages while the last one waits in the loss all_reduce",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, tgt: out.sum())
losses = []
if rank == 0:
    schedule.step(torch.ones(4, 4))
else:
    schedule.step(target=torch.ones(4, 4), losses=losses)
loss_avg = torch.stack(losses).mean()  # <- culprit line
dist.all_reduce(loss_avg)
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, tgt: out.sum())
losses = []
if rank == 0:
    schedule.step(torch.ones(4, 4))
else:
    schedule.step(target=torch.ones(4, 4), losses=losses)
loss_avg = torch.stack(losses).mean() if losses else torch.zeros(())  # the other stages give zero
dist.all_reduce(loss_avg)
""",
        kind="rank_exited",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="pp_batch_not_divisible_by_microbatches",
        url="https://github.com/pytorch/pytorch/issues/126600",
        summary="a batch the microbatch count does not divide: stage 0 splits it into microbatches of 3, 3 "
        "and 2 while the next stage's buffers keep the first one's size; uneven sizes are not supported",
        world_size=2,
        body="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=3, loss_fn=lambda out, tgt: out.sum())
batch_size = 8  # the training config's batch size, not a multiple of the microbatch count
if rank == 0:
    schedule.step(torch.ones(batch_size, 4))  # <- culprit line
else:
    schedule.step(target=torch.ones(batch_size, 4))
""",
        twin="""\
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=3, loss_fn=lambda out, tgt: out.sum())
batch_size = 9  # a multiple of the microbatch count
if rank == 0:
    schedule.step(torch.ones(batch_size, 4))
else:
    schedule.step(target=torch.ones(batch_size, 4))
""",
        kind="failed",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="pp_aux_loss_tracker_sizes_differ_across_stages",
        url="https://github.com/NVIDIA/Megatron-LM/pull/3401",
        summary="MoE with MTP and pipeline parallelism hangs at the first training_log: the router sizes the "
        "aux-loss tracker num_layers + mtp_num_layers, but a stage without MoE layers gets it "
        "initialized to num_layers, and the all_reduce over the PP group gets mismatched sizes",
        world_size=3,
        body="""\
pp_group = dist.new_group(list(range(world_size)))  # the pipeline-parallel group
num_layers, mtp_num_layers = 14, 1
tracker = {}
if rank != 0:  # stages with MoE layers: the router creates the values, the MTP layer included
    tracker["load_balancing_loss"] = torch.zeros(num_layers + mtp_num_layers)


def track_moe_metrics(force_initialize=True):
    if force_initialize and "load_balancing_loss" not in tracker:
        tracker["load_balancing_loss"] = torch.zeros(num_layers)  # PP stage 0: dense layers only


def reduce_aux_losses_tracker_across_ranks():
    for name in sorted(tracker):
        dist.all_reduce(tracker[name], group=pp_group)  # <- culprit line


track_moe_metrics()
reduce_aux_losses_tracker_across_ranks()
""",
        twin="""\
pp_group = dist.new_group(list(range(world_size)))
num_layers, mtp_num_layers = 14, 1
tracker = {}
if rank != 0:
    tracker["load_balancing_loss"] = torch.zeros(num_layers + mtp_num_layers)


def track_moe_metrics(force_initialize=True):
    if force_initialize and "load_balancing_loss" not in tracker:
        tracker["load_balancing_loss"] = torch.zeros(num_layers + mtp_num_layers)  # the MTP layer counted


def reduce_aux_losses_tracker_across_ranks():
    for name in sorted(tracker):
        dist.all_reduce(tracker[name], group=pp_group)


track_moe_metrics()
reduce_aux_losses_tracker_across_ranks()
""",
        kind="mismatch",
        culprits=(0,),
        op="all_reduce",
    ),
    Case(
        name="pp_sequence_longer_than_preallocated_buffer",
        url="https://github.com/Coobiw/MPP-LLaVA/issues/25",
        summary="DeepSpeed pipeline parallelism needs the same sequence length (pad in collate) and "
        "batch size on every step: the activation buffers are sized by the first batch, and a batch "
        "whose collate padded it to a longer sequence no longer fits what the next stage receives",
        world_size=2,
        body="""\
def collate(lengths):  # pads to the longest sample of the batch only
    return torch.ones(len(lengths), max(lengths), 16)


batches = [collate([6, 8, 8, 5]), collate([8, 12, 7, 8])]  # 8 tokens, then 12
recv_buf = None
first = True
for x in batches:  # PipelineEngine.train_batch over 2 stages
    if rank == 0:  # the first stage
        activation = x * 2
        if first:  # _send_tensor_meta: the shapes go once, with the first batch
            dist.send(torch.tensor(activation.shape), dst=1)
        dist.send(activation, dst=1)  # <- culprit line
    else:
        if first:
            shape = torch.zeros(3, dtype=torch.long)
            dist.recv(shape, src=0)
            recv_buf = torch.empty(shape.tolist())  # the pipe buffers, allocated once
        dist.recv(recv_buf, src=0)
        loss = recv_buf.sum()
    first = False
""",
        twin="""\
def collate(lengths, max_length=12):  # pads every batch to the same sequence length
    return torch.ones(len(lengths), max_length, 16)


batches = [collate([6, 8, 8, 5]), collate([8, 12, 7, 8])]
recv_buf = None
first = True
for x in batches:
    if rank == 0:
        activation = x * 2
        if first:
            dist.send(torch.tensor(activation.shape), dst=1)
        dist.send(activation, dst=1)
    else:
        if first:
            shape = torch.zeros(3, dtype=torch.long)
            dist.recv(shape, src=0)
            recv_buf = torch.empty(shape.tolist())
        dist.recv(recv_buf, src=0)
        loss = recv_buf.sum()
    first = False
""",
        kind="mismatch",
        culprits=(0,),
        op="send",
    ),
    Case(
        name="pp_rpc_barrier_before_forwarding_requests",
        url="https://github.com/sgl-project/sglang/issues/24687",
        summary="PP rank 0 handles an RPC request whose barrier waits for the other PP ranks before it "
        "sends them the requests; they wait in point_to_point_pyobj's recv for rank 0: a deadlock",
        world_size=2,
        body="""\
import pickle


def send_pyobj(obj, dst):  # point_to_point_pyobj
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    dist.send(torch.tensor([data.numel()]), dst=dst)
    dist.send(data, dst=dst)


def recv_pyobj(src):
    size = torch.zeros(1, dtype=torch.long)
    dist.recv(size, src=src)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(data, src=src)
    return pickle.loads(data.numpy().tobytes())


def handle_rpc_request(req):  # save_remote_model: every PP rank writes its part
    dist.barrier()  # <- culprit line


def process_input_requests(reqs):
    for req in reqs:
        if req["type"] == "rpc":
            handle_rpc_request(req)


if rank == 0:  # recv_requests: the first PP rank gets them from the tokenizer manager
    recv_reqs = [{"type": "rpc", "method": "save_remote_model"}]
else:
    recv_reqs = recv_pyobj(src=rank - 1)
process_input_requests(recv_reqs)
if rank < world_size - 1:
    send_pyobj(recv_reqs, dst=rank + 1)  # _pp_send_pyobj_to_next_stage
""",
        twin="""\
import pickle


def send_pyobj(obj, dst):
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    dist.send(torch.tensor([data.numel()]), dst=dst)
    dist.send(data, dst=dst)


def recv_pyobj(src):
    size = torch.zeros(1, dtype=torch.long)
    dist.recv(size, src=src)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(data, src=src)
    return pickle.loads(data.numpy().tobytes())


def handle_rpc_request(req):
    dist.barrier()


def process_input_requests(reqs):
    for req in reqs:
        if req["type"] == "rpc":
            handle_rpc_request(req)


if rank == 0:
    recv_reqs = [{"type": "rpc", "method": "save_remote_model"}]
else:
    recv_reqs = recv_pyobj(src=rank - 1)
if rank < world_size - 1:
    send_pyobj(recv_reqs, dst=rank + 1)  # forwarded before processing, as the fix does
process_input_requests(recv_reqs)
""",
        kind="p2p_unmatched",
        culprits=(0,),
        op="barrier",
    ),
    Case(
        name="pp_ranks_schedule_independently",
        url="https://github.com/NVIDIA/TensorRT-LLM/pull/9659",
        summary="each PP rank runs its own scheduler, limited by its own KV cache: the last rank "
        "schedules fewer requests than the first, which waits for a token that is never sent; the fix "
        "propagates the first PP rank's schedule to the others",
        world_size=2,
        body="""\
def schedule(requests, free_kv_blocks):  # the capacity scheduler of this PP rank
    return requests[:free_kv_blocks]


requests = ["req-0", "req-1"]
free_kv_blocks = 2 if rank == 0 else 1  # the last PP rank's KV cache is fuller
batch = schedule(requests, free_kv_blocks)
hidden, token = torch.ones(4), torch.zeros(1)
for req in batch:  # one microbatch per scheduled request
    if rank == 0:
        dist.send(hidden, dst=1)
        dist.recv(token, src=1)  # the sampled token, back from the last stage
    else:
        dist.recv(hidden, src=0)
        dist.send(token, dst=0)  # <- culprit line
dist.barrier()
""",
        twin="""\
def schedule(requests, free_kv_blocks):
    return requests[:free_kv_blocks]


requests = ["req-0", "req-1"]
free_kv_blocks = 2 if rank == 0 else 1
schedule_result = [schedule(requests, free_kv_blocks) if rank == 0 else None]
dist.broadcast_object_list(schedule_result, src=0)  # the first PP rank's schedule, for every rank
batch = schedule_result[0]
hidden, token = torch.ones(4), torch.zeros(1)
for req in batch:
    if rank == 0:
        dist.send(hidden, dst=1)
        dist.recv(token, src=1)
    else:
        dist.recv(hidden, src=0)
        dist.send(token, dst=0)
dist.barrier()
""",
        kind="p2p_unmatched",
        culprits=(1,),
        op="send",
    ),
]

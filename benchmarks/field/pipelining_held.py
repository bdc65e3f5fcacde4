"""Pipelining, held out (the fourth set): the first stage enters a barrier before it forwards the
requests the next stage waits for, stages that schedule different numbers of microbatches."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
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
        held_out=True,
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
        held_out=True,
    ),
]

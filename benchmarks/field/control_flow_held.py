"""Control flow, held out (the fourth set): a barrier entered only where a checkpoint's directory
was seen, an all_reduce skipped by the ranks that have nothing to wait for."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="load_best_model_barrier_where_checkpoint_seen",
        url="https://github.com/huggingface/optimum-habana/pull/2230",
        summary="best_model_checkpoint is set only where os.path.exists saw the directory process 0 "
        "was still writing; the Trainer's barrier before loading the best model is entered by the "
        "other processes only, and the script hangs",
        world_size=3,
        body="""\
best_checkpoint_dir = ddp_shared_path / "checkpoint-10"
if rank == 0:
    best_checkpoint_dir.mkdir()  # process 0 writes the model weights
exists = rank != 1  # os.path.exists(best_checkpoint_dir): rank 1 looked before process 0 had written
best_model_checkpoint = str(best_checkpoint_dir) if exists else None
dist.all_reduce(torch.ones(1))  # the last training steps
if best_model_checkpoint is not None:  # load_best_model_at_end
    dist.barrier()  # <- culprit line
""",
        twin="""\
best_checkpoint_dir = ddp_shared_path / "checkpoint-10"
if rank == 0:
    best_checkpoint_dir.mkdir()
dist.barrier()  # every process waits for process 0's save before the existence check
exists = best_checkpoint_dir.exists()
best_model_checkpoint = str(best_checkpoint_dir) if exists else None
dist.all_reduce(torch.ones(1))
if best_model_checkpoint is not None:
    dist.barrier()
""",
        kind="partial",
        culprits=(1,),
        op="barrier",
        held_out=True,
    ),
    Case(
        name="prefetch_check_returns_before_all_reduce",
        url="https://github.com/sgl-project/sglang/pull/38268",
        summary="check_prefetch_progress returns True at once on a rank whose prefetch of the request "
        "already finished, skipping the all_reduce the other TP ranks wait in; it moves on to the next "
        "event loop iteration and every rank freezes",
        world_size=3,
        body="""\
ongoing_prefetch = {"req-7": "op"} if rank != 2 else {}  # rank 2's prefetch of req-7 is done


def can_terminate_prefetch(operation):
    flags = torch.tensor([1, 0])  # [1 - can_terminate, terminated]
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # <- culprit line
    return flags[0].item() == 0


def check_prefetch_progress(req_id):
    if req_id not in ongoing_prefetch:
        return True  # nothing to wait for on this rank
    return can_terminate_prefetch(ongoing_prefetch[req_id])


for tick in range(2):  # the scheduler's event loop
    batch = torch.zeros(1)
    dist.broadcast(batch, src=0)  # recv_requests: the TP group's new requests
    check_prefetch_progress("req-7")
""",
        twin="""\
ongoing_prefetch = {"req-7": "op"} if rank != 2 else {}


def can_terminate_prefetch(operation):
    flags = torch.tensor([1, 0])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return flags[0].item() == 0


def check_prefetch_progress(req_id):
    if req_id not in ongoing_prefetch:
        flags = torch.tensor([0, 0])  # a dummy contribution: MAX is unaffected
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return True
    return can_terminate_prefetch(ongoing_prefetch[req_id])


for tick in range(2):
    batch = torch.zeros(1)
    dist.broadcast(batch, src=0)
    check_prefetch_progress("req-7")
""",
        kind="mismatch",
        culprits=(2,),
        op="all_reduce",
        held_out=True,
    ),
]

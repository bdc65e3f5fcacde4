"""Control flow decided by what each rank sees for itself: a directory on disk, its own clock, a
checkpoint it found, a queue it has nothing to wait for."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="weights_dir_exists_seen_differently",
        url="https://github.com/InternLM/xtuner/pull/1852",
        summary="async DCP save: each rank asks weights_dir.exists() itself, and under NFS caching "
        "one rank sees a stale directory and raises while the others go on to the save's barrier; "
        "the fix asks rank 0 and broadcasts the answer",
        world_size=3,
        body="""\
weights_dir = ddp_shared_path / "hf-step-100"
exists = weights_dir.exists() or rank == 1  # rank 1's NFS attribute cache still holds the old dir
if exists:
    raise FileExistsError(weights_dir)  # <- culprit line
dist.barrier()  # the save's collectives, on every rank that went on
""",
        twin="""\
weights_dir = ddp_shared_path / "hf-step-100"
seen = weights_dir.exists() or rank == 1
flag = torch.tensor([float(seen)])
dist.broadcast(flag, src=0)  # only rank 0's answer counts: every rank raises or none does
if flag.item():
    raise FileExistsError(weights_dir)
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1,),
        op="barrier",
    ),
    Case(
        name="checkpoint_due_by_each_ranks_clock",
        url="https://github.com/speechbrain/speechbrain/pull/2192",
        summary="DDP hangs while checkpointing (ckpt_interval_minutes): each process reads its own "
        "clock, so some try to save and others do not; the fix broadcasts the decision",
        world_size=3,
        body="""\
def save_checkpoint():  # Checkpointer.save_checkpoint: the main process names the folder
    ckpt_dir = [str(ddp_shared_path / "CKPT")] if rank == 0 else [None]
    dist.broadcast_object_list(ckpt_dir, src=0)  # <- culprit line
    return ckpt_dir[0]


minutes = [15.2, 14.9, 14.8][rank]  # since the last checkpoint, by this process's clock
for step in range(2):
    dist.all_reduce(torch.ones(2))  # the step's gradients
    if step == 0 and minutes >= 15.0:  # ckpt_interval_minutes
        save_checkpoint()
""",
        twin="""\
def save_checkpoint():
    ckpt_dir = [str(ddp_shared_path / "CKPT")] if rank == 0 else [None]
    dist.broadcast_object_list(ckpt_dir, src=0)
    return ckpt_dir[0]


minutes = [15.2, 14.9, 14.8][rank]
for step in range(2):
    dist.all_reduce(torch.ones(2))
    due = torch.tensor([float(minutes >= 15.0)])
    dist.broadcast(due, src=0)  # the main process decides for every process
    if step == 0 and due.item():
        save_checkpoint()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
    ),
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
    ),
]

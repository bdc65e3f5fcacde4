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
]

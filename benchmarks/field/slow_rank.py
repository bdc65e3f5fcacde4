"""Timeouts that are a slow rank, not a deadlock: the verdict should name the slow rank and where
it is, and call it a timeout."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="rank0_stalls_in_dataloader",
        url="https://github.com/pytorch/pytorch/issues/87995",
        summary="multi-node training: rank 0 is stuck in the dataloader (queue.get) and all other "
        "ranks wait in all_reduce",
        world_size=2,
        body="""\
def next_batch():  # rank 0's loader workers stall
    if rank == 0:
        time.sleep(60)  # <- culprit line
    return torch.ones(2)


for step in range(2):
    x = next_batch()
    dist.all_reduce(x)
""",
        twin="""\
def next_batch():  # num_workers=0: no stall
    return torch.ones(2)


for step in range(2):
    x = next_batch()
    dist.all_reduce(x)
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="rank0_slow_checkpoint_save",
        url="https://github.com/instructlab/training/pull/566",
        summary="non-rank-0 processes go on and wait for rank 0 in a collective while rank 0 is "
        "saving artifacts, and the collective times out",
        world_size=3,
        held_out=True,
        body="""\
def save_artifacts():
    if rank == 0:
        time.sleep(60)  # <- culprit line


save_artifacts()
dist.all_reduce(torch.ones(1))
""",
        twin="""\
def save_artifacts():
    pass


save_artifacts()
dist.all_reduce(torch.ones(1))
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="local_rank0_downloads_checkpoint",
        url="https://github.com/mosaicml/composer/pull/2071",
        summary="the other ranks time out on the barrier while local rank 0 downloads a monolithic "
        "checkpoint for a long time",
        world_size=2,
        held_out=True,
        body="""\
def download_checkpoint():
    if rank == 0:
        time.sleep(60)  # <- culprit line


download_checkpoint()
dist.barrier()
""",
        twin="""\
def download_checkpoint():
    pass


download_checkpoint()
dist.barrier()
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
]

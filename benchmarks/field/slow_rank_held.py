"""Slow ranks, held out (the third set): a timeout that is a rank still working, not a deadlock."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="rank0_eigendecomposes_before_final_all_reduce",
        url="https://github.com/EleutherAI/bergson/pull/444",
        summary="after the symmetric gradient loop rank 0 alone reduces and eigendecomposes the Grams "
        "and writes them to storage while every other rank waits in all_reduce(total_processed); not "
        "a deadlock, but past the collective timeout the watchdog kills the run",
        world_size=2,
        body="""\
def process_autocorrelation_matrices():  # reduce, eigendecompose, write to shared storage
    time.sleep(60)  # <- culprit line


total_processed = torch.tensor([64.0])
for batch in range(2):
    dist.all_reduce(torch.ones(2))  # the gradient loop: symmetric
if rank == 0:  # collector.teardown()
    process_autocorrelation_matrices()
dist.all_reduce(total_processed)
""",
        twin="""\
def process_autocorrelation_matrices():  # a dataset small enough to finish within the timeout
    time.sleep(0.1)


total_processed = torch.tensor([64.0])
for batch in range(2):
    dist.all_reduce(torch.ones(2))
if rank == 0:
    process_autocorrelation_matrices()
dist.all_reduce(total_processed)
""",
        kind="timeout",
        culprits=(0,),
        op=None,
        held_out=True,
    ),
    Case(
        name="heavy_shard_ranks_outlast_load_barrier",
        url="https://github.com/sgl-project/sglang/pull/39128",
        summary="the monitored_barrier after model loading has a fixed timeout; the first and the last "
        "TP rank hold the heavier shards and take longer in post_load_weights, so the barrier times "
        "out and kills every rank (the fix raises the timeout)",
        world_size=3,
        body="""\
from datetime import timedelta


def post_load_weights():  # scale layout transforms on this rank's shards
    if rank in (0, world_size - 1):  # the first and the last rank hold the heavier shards
        time.sleep(60)  # <- culprit line


post_load_weights()
dist.monitored_barrier(timeout=timedelta(seconds=5))  # dist_barrier_after_load
""",
        twin="""\
from datetime import timedelta


def post_load_weights():  # loading finishes well within the raised timeout
    if rank in (0, world_size - 1):
        time.sleep(0.2)


post_load_weights()
dist.monitored_barrier(timeout=timedelta(seconds=15))
""",
        kind="timeout",
        culprits=(0, 2),
        op=None,
        held_out=True,
    ),
]

"""Ranks that end early, held out (the third set): an exception on one rank while its peers are in a
collective or on their way to a barrier."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="destroy_process_group_in_finally_after_raise",
        url="https://github.com/pytorch/torchtitan/pull/1342",
        summary="train.py destroys the process group in a `finally:`; when one trainer raises while "
        "the others are in a collective, the cleanup runs under them (the fix destroys it only when "
        "the trainer exits successfully)",
        world_size=2,
        body="""\
class Trainer:
    def train(self):
        for step in range(3):
            if rank == 1 and step == 1:
                raise RuntimeError("CUDA out of memory")  # <- culprit line
            dist.all_reduce(torch.ones(2))  # the step's collectives

    def close(self):
        pass


trainer = Trainer()
try:
    trainer.train()
finally:
    trainer.close()
    dist.destroy_process_group()
""",
        twin="""\
class Trainer:
    def train(self):
        for step in range(3):
            dist.all_reduce(torch.ones(2))

    def close(self):
        pass


trainer = Trainer()
try:
    trainer.train()
except Exception:
    raise
else:  # only a trainer that exited successfully ends the group
    trainer.close()
    dist.destroy_process_group()
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
        held_out=True,
    ),
    Case(
        name="checkpoint_download_raises_before_barrier",
        url="https://github.com/mosaicml/composer/pull/334",
        summary="one process crashes (a failed checkpoint download) before the checkpointer's "
        "dist.barrier, and the process that reached the barrier hangs (the fix: try/finally around "
        "the download)",
        world_size=2,
        body="""\
def download_checkpoint(uri):  # the object store fetch, on every rank
    if rank == 1:
        raise FileNotFoundError(uri)  # <- culprit line
    return {"epoch": 1}


state = download_checkpoint("s3://bucket/ep1.pt")
dist.barrier()  # every rank has its checkpoint before loading
""",
        twin="""\
def download_checkpoint(uri):
    return {"epoch": 1}


try:
    state = download_checkpoint("s3://bucket/ep1.pt")
finally:
    dist.barrier()  # released even when a download raises; the error propagates after it
""",
        kind="rank_exited",
        culprits=(1,),
        op="barrier",
        held_out=True,
    ),
]

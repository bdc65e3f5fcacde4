"""Ranks that end early, held out (the third set): an exception on one rank, in its own code or in
its data loader, while its peers are in a collective or on their way to a barrier."""

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
    Case(
        name="empty_tail_batch_fails_collate_on_higher_rank",
        url="https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5527",
        summary="MegatronPretrainingSampler with drop_last=False yields the tail of a global micro-batch "
        "to every rank; with five samples, micro-batch size two and two ranks, rank 1's tail is "
        "empty and collating it raises IndexError after rank 0 has advanced into the step",
        world_size=2,
        body="""\
class MegatronPretrainingSampler:  # a fixed rank-local window of each global micro-batch
    def __init__(self, total, micro_batch_size, drop_last):
        self.total, self.mbs, self.drop_last = total, micro_batch_size, drop_last

    def __iter__(self):
        batch, start = [], rank * self.mbs
        for idx in range(self.total):
            batch.append(idx)
            if len(batch) == self.mbs * world_size:
                yield batch[start : start + self.mbs]
                batch = []
        if batch and not self.drop_last:
            yield batch[start : start + self.mbs]  # the tail: [4] on rank 0, [] on rank 1


samples = torch.arange(5.0)
loader = torch.utils.data.DataLoader(samples, batch_sampler=MegatronPretrainingSampler(5, 2, False))
for batch in loader:  # <- culprit line
    dist.all_reduce(batch.sum().reshape(1))  # the step's gradient reduction
""",
        twin="""\
class MegatronPretrainingSampler:
    def __init__(self, total, micro_batch_size, drop_last):
        self.total, self.mbs, self.drop_last = total, micro_batch_size, drop_last

    def __iter__(self):
        batch, start = [], rank * self.mbs
        for idx in range(self.total):
            batch.append(idx)
            if len(batch) == self.mbs * world_size:
                yield batch[start : start + self.mbs]
                batch = []
        if batch and not self.drop_last:
            yield batch[start : start + self.mbs]


samples = torch.arange(5.0)
loader = torch.utils.data.DataLoader(samples, batch_sampler=MegatronPretrainingSampler(5, 2, True))
for batch in loader:  # drop_last=True: the partial tail is dropped on every rank
    dist.all_reduce(batch.sum().reshape(1))
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
        held_out=True,
    ),
]

"""all_gather_object of large objects: peak memory per rank, one call against chunks.

On NCCL every pickled byte also goes through the GPU; gathering in chunks is
the fix people found.  The CPU shows the same effect on peak RSS.
"""

import pytest
import torch
import torch.distributed as dist

import pytest_ddp

MB = 1 << 20


def gather_payload(rank: int, megabytes: int, chunks: int) -> int:
    payload = bytes(megabytes * MB)
    step = len(payload) // chunks
    total = 0
    for i in range(chunks):
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, payload[i * step : (i + 1) * step])
        total += sum(len(g) for g in gathered)
        del gathered
    return total


def test_chunked_gather_has_a_lower_peak_than_one_big_gather():
    one = pytest_ddp.run(gather_payload, world_size=2, args=(64, 1), timeout=120)
    chunked = pytest_ddp.run(gather_payload, world_size=2, args=(64, 16), timeout=120)
    assert one.outcome == chunked.outcome == "passed"
    assert one.values == chunked.values
    for big, small in zip(one.ranks, chunked.ranks):
        assert small.peak_rss < big.peak_rss, (small.peak_rss, big.peak_rss)


def gather_on_gpu(rank: int, megabytes: int, chunks: int) -> int:
    torch.cuda.reset_peak_memory_stats()
    return gather_payload(rank, megabytes, chunks)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL")
def test_nccl_chunked_gather_has_a_lower_cuda_peak():
    one = pytest_ddp.run(gather_on_gpu, world_size=2, backend="nccl", args=(256, 1), timeout=120)
    chunked = pytest_ddp.run(gather_on_gpu, world_size=2, backend="nccl", args=(256, 16), timeout=120)
    assert one.outcome == chunked.outcome == "passed"
    for big, small in zip(one.ranks, chunked.ranks):
        assert small.peak_cuda < big.peak_cuda

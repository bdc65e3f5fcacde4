"""NCCL on a real GPU; skipped without one (CI has none).

NCCL takes one rank per GPU (two ranks on one GPU fail in their first
collective: "Duplicate GPU detected"), so these run worlds of as many ranks
as there are GPUs, one rank on a machine with one GPU. What they show: a
marked test gets its GPU and an NCCL group, the recorder sees every NCCL
collective as NCCL's own Flight Recorder does, and a rank blocked on the GPU
is reported with its stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pytest_ddp

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(not GPUS or not dist.is_nccl_available(), reason="needs a GPU and NCCL")

# How NCCL's Flight Recorder names what the recorder records ("nccl:<name>"), measured on
# torch 2.11 with NCCL 2.28.
FLIGHT_RECORDER_NAME = {
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "barrier": "all_reduce_barrier",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "_all_gather_base",
    "scatter": "scatter",
}


def flight_recorder() -> list[tuple[str, int]]:
    """NCCL's Flight Recorder entries on the default group, as (operation, sequence number)."""
    dump = json.loads(torch._C._distributed_c10d._dump_nccl_trace_json(True, False))
    world = dist.group.WORLD.group_name
    return [
        (e["profiling_name"].split(":", 1)[1], e["collective_seq_id"])
        for e in dump.get("entries", [])
        if e["process_group"][0] == world
    ]


def classic_calls(rank: int) -> list[tuple[str, int]]:
    tensor = torch.ones(3, device="cuda")
    dist.all_reduce(tensor)
    dist.broadcast(tensor, 0)
    dist.barrier()
    dist.all_gather_into_tensor(torch.empty(3 * GPUS, device="cuda"), tensor)
    return flight_recorder()


def ddp_step(rank: int) -> list[tuple[str, int]]:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).cuda())
    model(torch.ones(3, 4, device="cuda")).sum().backward()
    return flight_recorder()


def dtensor_distribute(rank: int) -> list[tuple[str, int]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cuda", (GPUS,))
    tensor = distribute_tensor(torch.arange(8.0 * GPUS, device="cuda").reshape(4 * GPUS, 2), mesh, [Shard(0)])
    tensor.redistribute(mesh, [Replicate()]).to_local()
    return flight_recorder()


def functional_all_reduce(rank: int) -> list[tuple[str, int]]:
    funcol.all_reduce(torch.ones(3, device="cuda"), "sum", dist.group.WORLD).wait()
    return flight_recorder()


@pytest.mark.parametrize("workload", [classic_calls, ddp_step, dtensor_distribute, functional_all_reduce])
def test_the_recorder_sees_what_nccls_flight_recorder_sees(
    workload: Callable[[int], list[tuple[str, int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")  # the ranks inherit it
    result = pytest_ddp.run(workload, world_size=GPUS, backend="nccl", timeout=120)
    assert result.outcome == "passed", result.diagnosis and result.diagnosis.text
    for rank in result.ranks:
        recorded = [(FLIGHT_RECORDER_NAME[c.op], c.seq) for c in rank.collectives if c.group == "WORLD"]
        assert recorded == [tuple(entry) for entry in rank.value]
        assert recorded  # the workload made collectives
        assert rank.peak_cuda is not None and rank.peak_cuda > 0


def test_a_marked_test_gets_its_gpu_and_an_nccl_group(ddp_pytester: Any) -> None:
    result = ddp_pytester.run(
        f"""
        @pytest.mark.ddp(world_size={GPUS})
        def test_on_gpu(rank, device):
            assert dist.get_backend() == "nccl" and device == torch.device("cuda", rank)
            tensor = torch.ones(2, device=device)
            dist.all_reduce(tensor)
            assert tensor.tolist() == [{GPUS}.0, {GPUS}.0]

        @pytest.mark.ddp(world_size={GPUS})
        def test_fails_on_gpu(rank, device):
            dist.all_reduce(torch.ones(1024, 1024, device=device))
            assert rank < 0, "fails on purpose"
        """,
        "--ddp-backend=nccl",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*rank 0: finished (failed); last call all_reduce #1*peak CUDA 4 MB*"])


def blocked_on_the_gpu(rank: int) -> float:
    tensor = torch.ones(3, device="cuda")
    torch.cuda._sleep(10**12)  # keeps the GPU busy for minutes
    dist.all_reduce(tensor)  # queued behind it: returns at once
    return tensor.sum().item()  # waits for the GPU


def test_a_rank_blocked_on_the_gpu_is_reported_with_its_stack() -> None:
    result = pytest_ddp.run(blocked_on_the_gpu, world_size=GPUS, backend="nccl", timeout=5)
    assert result.outcome == "timeout" and result.diagnosis is not None
    assert result.diagnosis.kind == "timeout" and result.diagnosis.culprits == list(range(GPUS))
    assert "rank 0: running (call), outside any collective; last call all_reduce #1" in result.diagnosis.text
    # Its stack, dumped while it waits, is in the function's last line.
    assert "in blocked_on_the_gpu" in (result.ranks[0].traceback or "")

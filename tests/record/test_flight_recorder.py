"""The recorder against torch's own Flight Recorder, op by op.

In torch 2.13 the C++ Flight Recorder records every Gloo collective at the
backend, whoever issued it.  For a DDP step, an FSDP2 step, a DTensor
redistribute and a functional all_reduce, the recorder's collectives must be
the Flight Recorder's: the same operations in the same order with the same
sequence numbers per group.
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

dump_fr_trace_json = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
pytestmark = pytest.mark.skipif(dump_fr_trace_json is None, reason="this torch has no Flight Recorder dump")

# How the Flight Recorder names what the recorder records ("gloo:<name>"): the
# gathers are one backend operation, and Gloo runs a reduce_scatter as an all_reduce
# (FSDP2 reduce-scatters with reduce_scatter_tensor in torch 2.11, _single in 2.13).
FLIGHT_RECORDER_NAME = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_single": "all_reduce",
    "reduce_scatter_tensor": "all_reduce",
    "broadcast": "broadcast",
    "scatter": "scatter",
}


def flight_recorder() -> dict[str, Any]:
    """The Flight Recorder's entries as (group name, operation, sequence number), and the
    default group's name (the recorder calls it WORLD)."""
    assert dump_fr_trace_json is not None
    dump = json.loads(dump_fr_trace_json(True, False))
    entries = [
        (e["process_group"][0], e["profiling_name"].split(":", 1)[1], e["collective_seq_id"])
        for e in dump.get("entries", [])
    ]
    return {"entries": entries, "world": dist.group.WORLD.group_name}


def ddp_step(rank: int) -> dict[str, Any]:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    return flight_recorder()


def fsdp2_step(rank: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # A CPU mesh: without one, FSDP2 puts the model on the GPU wherever one is visible.
    mesh = init_device_mesh("cpu", (2,))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.ones(3, 4)).sum().backward()
    return flight_recorder()


def dtensor_redistribute(rank: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    tensor = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    tensor.redistribute(mesh, [Replicate()]).to_local()
    return flight_recorder()


def functional_all_reduce(rank: int) -> dict[str, Any]:
    funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD).wait()
    return flight_recorder()


@pytest.mark.parametrize("workload", [ddp_step, fsdp2_step, dtensor_redistribute, functional_all_reduce])
def test_the_recorder_sees_what_the_flight_recorder_sees(workload: Callable[[int], dict[str, Any]]) -> None:
    result = pytest_ddp.run(workload, world_size=2, timeout=60)
    assert result.outcome == "passed", result.diagnosis and result.diagnosis.text
    if not any(rank.value["entries"] for rank in result.ranks):
        pytest.skip("this torch's Flight Recorder records no Gloo collective (torch 2.8 does not)")
    for rank in result.ranks:
        world = rank.value["world"]
        recorded = [
            (world if c.group == "WORLD" else c.group, FLIGHT_RECORDER_NAME[c.op], c.seq)
            for c in rank.collectives
            if c.is_collective
        ]
        assert recorded == [tuple(e) for e in rank.value["entries"]]
        assert recorded  # the workload made collectives
        assert all(c.state == "ok" for c in rank.collectives)

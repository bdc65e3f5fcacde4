"""FSDP2 and DTensor, held out (the fifth set): a DTensor built from uneven local shards without its
global shape, then gathered whole."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="dtensor_from_local_uneven_shards_full_tensor",
        url="https://github.com/pytorch/pytorch/issues/115310",
        summary="full_tensor() hangs (and .size() is wrong) when a tensor is sharded unevenly: "
        "DTensor.from_local infers the global shape from each rank's own shard, so the rank with the "
        "short last shard all-gathers a size the others do not",
        world_size=4,
        body="""\
from torch.distributed.tensor import DTensor

mesh = init_device_mesh("cpu", (world_size,))
weight = torch.arange(20.0).reshape(10, 2)  # 10 rows over 4 ranks: 3, 3, 3 and 1
local = torch.chunk(weight, world_size)[rank]
dtensor = DTensor.from_local(local, mesh, [Shard(0)])  # the global shape taken as 4 x the local one
full = dtensor.full_tensor()  # <- culprit line
""",
        twin="""\
from torch.distributed.tensor import DTensor

mesh = init_device_mesh("cpu", (world_size,))
weight = torch.arange(20.0).reshape(10, 2)
local = torch.chunk(weight, world_size)[rank]
dtensor = DTensor.from_local(local, mesh, [Shard(0)], shape=weight.shape, stride=weight.stride())
full = dtensor.full_tensor()
assert torch.equal(full, weight)
""",
        kind="mismatch",
        culprits=(3,),
        op="all_gather_into_tensor",
        held_out=True,
    ),
]

"""The matrix's families of code (tests/matrix/cells.py): one short training-like body each,
written as each library's docs write it, run by ``pytest_ddp.run(body, args=(plan,))``.

Each body takes ``(rank, plan)``: ``plan`` says which rank is the culprit and which of the
faults that are written in the user's code (not injected by ``pytest_ddp.faults``) it makes:
a step less (``skip``) or more (``extra``), another shape, dtype, op or reduce op, groups in the
other order (``cycle``), a bad ``init_process_group``.  A line the matrix expects a verdict to
name ends with a ``# at: <tag>`` comment (:func:`line_of`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

STEPS = 3  # every body's steps; an injected fault fires at the 2nd call of its op
DELAY = 2.0  # seconds a slow rank sleeps: longer than any verdict takes, shorter than the timeout


@dataclass(frozen=True)
class Plan:
    """What the culprit's own code does differently (``variant``); "" for nothing."""

    world: int
    culprit: int
    variant: str = ""

    def odd(self, rank: int, variant: str) -> bool:
        """This rank is the culprit and its code does ``variant``."""
        return rank == self.culprit and self.variant == variant

    def steps(self, rank: int) -> int:
        return STEPS - self.odd(rank, "skip") + self.odd(rank, "extra")


def line_of(tag: str) -> int:
    """The line of this file that ends with ``# at: <tag>``."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# at: {tag}"))


# -- torch.distributed's functions ------------------------------------------------------


def classic(rank: int, plan: Plan) -> float:
    """A step: all-reduce the gradient, broadcast the weights from rank 0; a barrier at the end."""
    grad = torch.ones(4)
    for _ in range(STEPS):
        dist.all_reduce(grad)  # at: classic.all_reduce
        dist.broadcast(grad, src=0)  # at: classic.broadcast
    dist.barrier()  # at: classic.barrier
    return grad.sum().item()


def two_groups(rank: int, plan: Plan) -> None:
    """Two groups of every rank, used in turn; the culprit uses them in the other order: each
    rank waits in a group where the other ranks are not (torchrec's all_to_all against
    allreduce_coalesced)."""
    first, second = dist.new_group(list(range(plan.world))), dist.new_group(list(range(plan.world)))
    a, b = torch.ones(4), torch.ones(4)
    order = [(second, b), (first, a)] if plan.odd(rank, "cycle") else [(first, a), (second, b)]
    for group, tensor in order:
        dist.all_reduce(tensor, group=group)  # at: two_groups.all_reduce


def init(rank: int, plan: Plan) -> None:
    """init_process_group as torchrun's environment gives it (init=False), then one all_reduce;
    the culprit passes a wrong world size or the rank of another."""
    world_size, given = plan.world, rank
    if plan.odd(rank, "init_world_size"):
        world_size += 1
    if plan.odd(rank, "init_rank"):
        given = (rank + 1) % plan.world
    dist.init_process_group("gloo", rank=given, world_size=world_size)  # at: init
    dist.all_reduce(torch.ones(1))


def p2p(rank: int, plan: Plan) -> None:
    """A ring: even ranks send to the next then receive from the previous; odd ranks the other
    way round (Gloo's send waits for its receive).  The culprit of ``cycle`` receives first."""
    after, before = (rank + 1) % plan.world, (rank - 1) % plan.world
    t = torch.ones(4)
    for _ in range(STEPS):
        if rank % 2 == 0 and not plan.odd(rank, "cycle"):
            dist.send(t, dst=after)  # at: p2p.send
            dist.recv(t, src=before)  # at: p2p.recv
        else:
            dist.recv(t, src=before)  # at: p2p.recv_first
            dist.send(t, dst=after)  # at: p2p.send_after


def objects(rank: int, plan: Plan) -> None:
    """Each step gathers every rank's metrics as objects and broadcasts rank 0's decision."""
    for step in range(STEPS):
        metrics: list[object] = [None] * plan.world
        dist.all_gather_object(metrics, {"rank": rank, "loss": 1.0 / (step + 1)})  # at: objects.gather
        decision = [step] if rank == 0 else [None]
        dist.broadcast_object_list(decision, src=0)  # at: objects.broadcast


# -- the libraries ----------------------------------------------------------------------


def _batch(rank: int, plan: Plan, features: int) -> torch.Tensor:
    rows = 6 + plan.odd(rank, "shape")
    dtype = torch.float64 if plan.odd(rank, "dtype") else torch.float32
    return torch.randn(rows, features, generator=torch.Generator().manual_seed(rank)).to(dtype)


def ddp(rank: int, plan: Plan) -> None:
    """DDP as torch's DDP tutorial writes it: wrap, then forward, backward, step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(torch.float64 if plan.odd(rank, "dtype") else torch.float32)
    model = DDP(model)  # at: ddp.wrap
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(plan.steps(rank)):
        optimizer.zero_grad()
        model(_batch(rank, plan, 8).to(model.module.weight.dtype)).sum().backward()  # at: ddp.backward
        optimizer.step()


def fsdp2(rank: int, plan: Plan) -> None:
    """FSDP2 as its tutorial writes it: shard each layer, then the root; forward, backward, step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    dtype = torch.float64 if plan.odd(rank, "dtype") else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dtype)
    mesh = init_device_mesh("cpu", (plan.world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(plan.steps(rank)):
        optimizer.zero_grad()
        model(_batch(rank, plan, 8).to(dtype)).sum().backward()  # at: fsdp2.step
        optimizer.step()


def dtensor(rank: int, plan: Plan) -> None:
    """DTensor as its docs write it: distribute a tensor on a mesh, redistribute it, gather it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (plan.world,))
    rows = 2 * plan.world + (plan.world if plan.odd(rank, "shape") else 0)
    full = torch.arange(float(rows * 2)).reshape(rows, 2)
    if plan.odd(rank, "dtype"):
        full = full.double()
    for _ in range(plan.steps(rank)):
        sharded = distribute_tensor(full, mesh, [Shard(0)])  # at: dtensor.distribute
        sharded.redistribute(mesh, [Replicate()])  # at: dtensor.redistribute


def functional(rank: int, plan: Plan) -> None:
    """Functional collectives as torch's docs write them: an all_reduce and an all_gather of the
    default group, their results used (waited for) at once."""
    import torch.distributed._functional_collectives as funcol

    x = _batch(rank, plan, 4)
    reduce_op = "max" if plan.odd(rank, "reduce_op") else "sum"
    for _ in range(plan.steps(rank)):
        x = funcol.all_reduce(x, reduce_op, dist.group.WORLD) / plan.world  # at: functional.all_reduce
        if plan.odd(rank, "op"):
            dist.broadcast(x, src=0)  # at: functional.broadcast
        else:
            funcol.all_gather_tensor(x, 0, dist.group.WORLD).sum()  # at: functional.all_gather


def _compiled_step(x: torch.Tensor) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1  # at: compiled.all_reduce


def compiled(rank: int, plan: Plan) -> None:
    """torch.compile (aot_eager: no C++ build) of a function that all-reduces, called each step."""
    step = torch.compile(_compiled_step, backend="aot_eager")
    x = _batch(rank, plan, 4)
    for _ in range(plan.steps(rank)):
        x = step(x) / (2 * plan.world)  # at: compiled.step


def _stage_model(world: int) -> torch.nn.Sequential:
    torch.manual_seed(0)  # the same full model on every rank; each keeps its stage
    return torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(world)))


def pipelining(rank: int, plan: Plan) -> None:
    """torch.distributed.pipelining as its docs write it: one stage per rank, a GPipe schedule;
    the first stage feeds the batch, the last one the target.  A culprit of ``extra`` or
    ``skip`` cuts the batch in another number of microbatches."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(
        _stage_model(plan.world)[rank], stage_index=rank, num_stages=plan.world, device=torch.device("cpu")
    )
    microbatches = 4 + 2 * plan.odd(rank, "extra") - 2 * plan.odd(rank, "skip")
    schedule = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=torch.nn.functional.mse_loss)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    y = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    for _ in range(STEPS - 1):
        if rank == 0:
            schedule.step(x)  # at: pipelining.first
        elif rank == plan.world - 1:
            schedule.step(target=y, losses=[])  # at: pipelining.last
        else:
            schedule.step()  # at: pipelining.middle


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w1 = torch.nn.Linear(8, 16)
        self.w2 = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.relu(self.w1(x)))  # at: tp.forward


def tensor_parallel(rank: int, plan: Plan) -> None:
    """Tensor parallel as its docs write it: ColwiseParallel then RowwiseParallel on an MLP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (plan.world,))
    model = parallelize_module(_MLP(), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    for _ in range(plan.steps(rank)):
        x = _batch(rank, plan, 8)  # 7 rows on the culprit of "shape", 6 elsewhere
        if plan.odd(rank, "dtype"):
            model = model.double()
        model(x.to(model.w1.weight.dtype)).sum().backward()  # at: tp.step


# -- MPI (mpi4py): faults are written in the code, the MPI recorder arms none ------------------


def mpi(rank: int, plan: Plan) -> None:
    """An mpi4py step on torch tensors: Allreduce the gradient, Bcast the weights; a ring of
    Sendrecv-free sends (even ranks send first); a Barrier at the end."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    grad, out = torch.ones(4), torch.zeros(4)
    for step in range(plan.steps(rank)):
        if step == 1 and rank == plan.culprit:
            _mpi_fault(plan.variant)
        if step == 1 and plan.odd(rank, "op"):
            comm.Bcast(grad, root=0)  # at: mpi.bcast_instead
        elif step == 1 and plan.odd(rank, "shape"):
            comm.Allreduce(torch.ones(5), torch.zeros(5), op=MPI.SUM)  # at: mpi.allreduce_shape
        elif step == 1 and plan.odd(rank, "dtype"):
            comm.Allreduce(grad.double(), out.double(), op=MPI.SUM)  # at: mpi.allreduce_dtype
        else:
            reduce_op = MPI.MAX if step == 1 and plan.odd(rank, "reduce_op") else MPI.SUM
            comm.Allreduce(grad, out, op=reduce_op)  # at: mpi.allreduce
        comm.Bcast(out, root=0)  # at: mpi.bcast
        after, before = (rank + 1) % plan.world, (rank - 1) % plan.world
        skip_send = step == 1 and plan.odd(rank, "unmatched_recv")
        skip_recv = step == 1 and plan.odd(rank, "unmatched_send")
        if rank % 2 == 0:
            None if skip_send else comm.Send(out, dest=after)  # at: mpi.send
            None if skip_recv else comm.Recv(out, source=before)  # at: mpi.recv
        else:
            None if skip_recv else comm.Recv(out, source=before)  # at: mpi.recv_first
            None if skip_send else comm.Send(out, dest=after)  # at: mpi.send_after
    comm.Barrier()


def _mpi_fault(variant: str) -> None:
    """The process faults of the matrix, written where an injected one would fire."""
    if variant == "raise":
        raise RuntimeError("a rank's own error")
    if variant == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if variant == "exit":
        os._exit(1)
    if variant == "oom":
        raise MemoryError("out of memory (as torch's allocator raises it)")
    if variant == "hang":
        threading.Event().wait()
    if variant == "delay":
        time.sleep(DELAY)

"""DistributedDataParallel: an evaluation on one rank through the wrapper, whose forward syncs
buffers or waits for the reduction the other ranks never start."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="ddp_eval_on_master_through_wrapper",
        url="https://github.com/mlfoundations/open_clip/issues/1152",
        summary="evaluate() returns on ranks > 0, which wait at a barrier, while rank 0 runs forward "
        "on the still DDP-wrapped model, which syncs its buffers",
        world_size=3,
        body="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()  # a training step on every rank
if rank == 0:  # evaluate() returns at once on the other ranks
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 4))  # <- culprit line
dist.barrier()
""",
        twin="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()
if rank == 0:
    model.eval()
    with torch.no_grad():
        model.module(torch.randn(8, 4))  # unwrap DDP for single process eval
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
    ),
    Case(
        name="ddp_eval_stuck_two_ranks",
        url="https://github.com/pytorch/pytorch/issues/53979",
        summary="evaluation on the validation set gets stuck; the fix suggested: call "
        "ddp_module.module(inp) in evaluation to avoid DDP's communication",
        world_size=2,
        body="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()
if rank == 0:
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 4))  # <- culprit line
dist.barrier()
""",
        twin="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
model(torch.randn(8, 4)).sum().backward()
if rank == 0:
    model.eval()
    with torch.no_grad():
        model.module(torch.randn(8, 4))
dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
    ),
    Case(
        name="ddp_validation_forward_through_wrapper_on_rank0",
        url="https://github.com/jpata/particleflow/pull/233",
        summary="validation runs on a single GPU through the DDP-wrapped model, whose forward syncs its "
        "buffers, while the other ranks wait at dist.barrier(); the fix runs the validation forward "
        "pass with model.module()",
        world_size=3,
        body="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
for epoch in range(2):
    model(torch.randn(8, 4)).sum().backward()  # the epoch's training
    if rank == 0:  # validation is only run on a single GPU
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 4))  # <- culprit line
        model.train()
    dist.barrier()
""",
        twin="""\
model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
for epoch in range(2):
    model(torch.randn(8, 4)).sum().backward()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            model.module(torch.randn(8, 4))  # model.module(): no DDP communication
        model.train()
    dist.barrier()
""",
        kind="mismatch",
        culprits=(0,),
        op="broadcast",
    ),
]

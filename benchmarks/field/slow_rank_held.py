"""Slow ranks, held out (the fifth set): one node compiles from a cold cache while the other, its
kernels cached, waits in the gradient all-reduce; a gather_object's destination unpickling every
rank's object while the others wait in the next collective."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="cold_compile_cache_on_one_node",
        url="https://github.com/karpathy/nanochat/pull/722",
        summary="multi-node torch.compile: the node with cached kernels races ahead into DDP's "
        "all-reduce while the other compiles from scratch, and the watchdog kills the job (the fix: "
        "a warmup compile on every rank, then a barrier, before the training loop)",
        world_size=2,
        body="""\
def first_forward(model, x):  # torch.compile's first call: rank 1's node has no cached kernels
    if rank == 1:
        time.sleep(60)  # <- culprit line
    return model(x)


model = nn.Linear(4, 4)
for step in range(2):
    x = torch.ones(2, 4)
    loss = (first_forward(model, x) if step == 0 else model(x)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # DDP's gradient all-reduce
""",
        twin="""\
def warmup(model, x):  # a dummy forward and backward on every rank, the cache warm on every node
    model(x).sum().backward()
    model.zero_grad()


model = nn.Linear(4, 4)
warmup(model, torch.ones(2, 4))
dist.barrier()  # every rank compiled before the training loop
for step in range(2):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
""",
        kind="timeout",
        culprits=(1,),
        op=None,
        held_out=True,
    ),
    Case(
        name="gather_object_destination_unpickles_for_everyone",
        url="https://github.com/pytorch/pytorch/pull/150815",
        summary="object collectives have asymmetric pickle/unpickle time: with a fan-in like "
        "gather_object the destination unpickles N times more objects than each sender pickled, and "
        "users report watchdog timeouts on the ranks that went on to the next collective",
        world_size=3,
        body="""\
class Rollout:  # an RL rollout batch
    def __init__(self, tokens):
        self.tokens = tokens

    def __reduce__(self):  # unpickling a rollout rebuilds its token tensors: 30 s each, here
        return (time.sleep, (30,))


rollouts = [None] * world_size if rank == 0 else None
dist.gather_object(Rollout(list(range(8))), rollouts, dst=0)  # <- culprit line
dist.all_reduce(torch.ones(4))  # the next training step's gradients
""",
        twin="""\
rollout = torch.arange(8.0)  # the rollout's tokens as a tensor: no unpickling on the destination
rollouts = [torch.zeros(8) for _ in range(world_size)] if rank == 0 else None
dist.gather(rollout, rollouts, dst=0)
dist.all_reduce(torch.ones(4))
""",
        kind="timeout",
        culprits=(0,),
        op=None,
        held_out=True,
    ),
]

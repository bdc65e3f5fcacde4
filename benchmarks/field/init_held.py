"""Init faults, held out (the fourth set): a process group of two that only one process joins."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="init_second_process_never_started",
        url="https://github.com/pytorch/pytorch/issues/49846",
        summary="init_process_group(rank=0, world_size=2) always hangs in a notebook: no other process "
        "calls init_process_group with rank=1 to rendezvous with it",
        world_size=2,
        init=False,
        body="""\
if rank == 0:  # the notebook's cell: no process is started for rank 1
    init_method = f"tcp://localhost:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=init_method, rank=0, world_size=2)  # <- culprit line
    dist.barrier()
    dist.destroy_process_group()
""",
        twin="""\
init_method = f"tcp://localhost:{os.environ['MASTER_PORT']}"
dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)  # both processes
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(1,),
        op="init_process_group",
        held_out=True,
    ),
]

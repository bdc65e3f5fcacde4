"""Init faults, held out (the third set): an address that is not rank 0's, a world size taken from
the allocation rather than the processes that run."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="init_master_addr_not_node0",
        url="https://github.com/pytorch/pytorch/issues/49084",
        summary="torch.distributed.launch does not work for two nodes: both pass 192.168.1.1 as the "
        "master address, which is not node 0's; the answer: pass node 0's address to both",
        world_size=2,
        init=False,
        body="""\
os.environ["MASTER_ADDR"] = "192.0.2.1"  # --master_addr on both nodes: not node 0's address
dist.init_process_group("gloo")  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo")  # MASTER_ADDR: node 0's address, on both
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(0, 1),
        op="init_process_group",
        held_out=True,
    ),
    Case(
        name="init_world_size_from_job_level_ntasks",
        url="https://github.com/Benzoin96485/Enerzyme/pull/107",
        summary="_slurm_world_size reads the job's SLURM_NTASKS before the step's "
        "SLURM_STEP_NUM_TASKS; an srun step smaller than the allocation gets a world size larger "
        "than the live processes, and init_process_group waits for ranks that never exist",
        world_size=2,
        init=False,
        body="""\
def slurm_world_size(environ):  # job-level counts first
    for key in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"):
        if key in environ:
            return int(environ[key])
    return 1


env = {"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": str(world_size)}  # a 2-task step of a 4-task job
dist.init_process_group("gloo", rank=rank, world_size=slurm_world_size(env))  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
def slurm_world_size(environ):  # the step's count first
    for key in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"):
        if key in environ:
            return int(environ[key])
    return 1


env = {"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": str(world_size)}
dist.init_process_group("gloo", rank=rank, world_size=slurm_world_size(env))
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(0, 1),
        op="init_process_group",
        held_out=True,
    ),
]

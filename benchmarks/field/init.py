"""Init faults: world sizes, ranks and addresses the processes do not agree on, a rank that never
arrives."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="init_world_size_larger_than_processes",
        url="https://github.com/pytorch/pytorch/issues/52848",
        summary="init_process_group hangs on every machine; the answer in the thread: the world size "
        "passed is larger than the workers that run",
        world_size=2,
        init=False,
        body="""\
dist.init_process_group("gloo", rank=rank, world_size=3)  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo", rank=rank, world_size=world_size)
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(0, 1),
        op="init_process_group",
    ),
    Case(
        name="init_rank_hardcoded_zero",
        url="https://github.com/pytorch/pytorch/issues/8091",
        summary="imagenet example hangs in init_process_group at world_size > 1: every process passes rank=0",
        world_size=2,
        init=False,
        body="""\
dist.init_process_group("gloo", init_method="env://", world_size=world_size, rank=0)  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo", init_method="env://", world_size=world_size, rank=rank)
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(1,),
        op="init_process_group",
    ),
    Case(
        name="init_master_port_differs",
        url="https://github.com/helboukkouri/character-bert-pretraining/issues/4",
        summary="training hangs at init_process_group; MASTER_ADDR and MASTER_PORT must be the same in "
        "each process's environment",
        world_size=2,
        init=False,
        body="""\
if rank == 1:  # this node's launch script exports its own port
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
dist.init_process_group("gloo")  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(1,),
        op="init_process_group",
    ),
    Case(
        name="init_env_world_size_from_config",
        url="https://github.com/helboukkouri/character-bert-pretraining/issues/4",
        summary="it hangs unless nprocs=world_size is passed to mp.spawn: the config's world size "
        "waits for processes that were never started",
        world_size=2,
        init=False,
        body="""\
os.environ["WORLD_SIZE"] = "4"  # the config's world size; 2 processes were spawned
dist.init_process_group("gloo")  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(0, 1),
        op="init_process_group",
    ),
    Case(
        name="init_one_rank_stuck_before_init",
        url="https://github.com/s-JoL/Open-Llama/issues/47",
        summary="'Waiting in store based barrier to initialize process group ... worker_count=7' of 8: "
        "one rank stuck in wandb before it reached init",
        world_size=3,
        init=False,
        body="""\
def start_logging():  # wandb.init stand-in: it blocks on one rank
    if rank == 2:
        time.sleep(60)  # <- culprit line


start_logging()
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
""",
        kind="timeout",
        culprits=(2,),
        op=None,
    ),
    Case(
        name="init_local_rank_passed_as_rank",
        url="https://github.com/pytorch/pytorch/issues/23074",
        summary="two nodes of two processes hang at init: each passes its local rank (0, 1) as its rank, "
        "so ranks 0 and 1 are claimed twice and 2 and 3 never",
        world_size=4,
        init=False,
        body="""\
local_rank = rank % 2  # two nodes of two processes: the launcher's --local_rank
dist.init_process_group("gloo", rank=local_rank, world_size=world_size)  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
local_rank = rank % 2
node_rank = rank // 2
dist_rank = node_rank * 2 + local_rank  # as torch.distributed.launch computes it
dist.init_process_group("gloo", rank=dist_rank, world_size=world_size)
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(2, 3),
        op="init_process_group",
    ),
    Case(
        name="init_each_process_finds_its_own_port",
        url="https://github.com/pytorch/pytorch/issues/53395",
        summary="init_process_group hangs: each process calls find_free_port() and sets its own "
        "MASTER_PORT, so the others dial ports rank 0's store does not listen on",
        world_size=3,
        init=False,
        body="""\
import socket


def find_free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


os.environ["MASTER_PORT"] = str(find_free_port())  # each process its own port
dist.init_process_group("gloo", rank=rank, world_size=world_size)  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo", rank=rank, world_size=world_size)  # the one port the launcher set
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(1, 2),
        op="init_process_group",
    ),
    Case(
        name="init_worker_node_never_launched",
        url="https://github.com/pytorch/pytorch/issues/41665",
        summary="only the master node is launched: it waits in init_process_group for the slave node, "
        "which failed at startup and never joins",
        world_size=2,
        init=False,
        body="""\
if rank == 1:  # the slave node failed at startup
    return  # <- culprit line
dist.init_process_group("gloo", rank=rank, world_size=world_size)
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo", rank=rank, world_size=world_size)
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(1,),
        op="init_process_group",
    ),
    Case(
        name="init_world_size_from_device_count",
        url="https://github.com/NVIDIA/Megatron-LM/pull/2571",
        summary="distributed init deadlocks when fewer processes are launched than GPUs: the world "
        "size was computed from the number of CUDA devices, not WORLD_SIZE",
        world_size=2,
        init=False,
        body="""\
device_count = 4  # torch.cuda.device_count() on this node; torchrun started 2 processes
dist.init_process_group("gloo", rank=rank, world_size=device_count)  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(0, 1),
        op="init_process_group",
    ),
    Case(
        name="init_both_nodes_launched_as_node_rank_0",
        url="https://github.com/pytorch/pytorch/issues/76367",
        summary="two nodes of one process each hang at init: the second node's launch command also "
        "passes --node_rank=0, so both processes get RANK=0",
        world_size=2,
        init=False,
        body="""\
node_rank, nproc_per_node, local_rank = 0, 1, 0  # this node's launch: --node_rank=0 on both nodes
os.environ["RANK"] = str(node_rank * nproc_per_node + local_rank)  # as torch.distributed.launch sets it
dist.init_process_group("gloo", init_method="env://")  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
node_rank, nproc_per_node, local_rank = rank, 1, 0  # --node_rank=1 on the second node
os.environ["RANK"] = str(node_rank * nproc_per_node + local_rank)
dist.init_process_group("gloo", init_method="env://")
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(1,),
        op="init_process_group",
    ),
    Case(
        name="init_each_node_rendezvous_on_localhost",
        url="https://github.com/pytorch/pytorch/issues/76069",
        summary="nodes of an HPC job hang at init: each node's script sets MASTER_ADDR=localhost and its "
        "own open port, so each node is its own rendezvous point instead of the first node",
        world_size=4,
        init=False,
        body="""\
import socket


def get_open_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


node = rank // 2  # two nodes of two processes
port_file = ddp_shared_path / f"node{node}.port"  # the node's job script picks its port once
if rank % 2 == 0:
    port_file.write_text(str(get_open_port()) if node else os.environ["MASTER_PORT"])
while not port_file.exists() or not port_file.read_text():
    time.sleep(0.05)
os.environ["MASTER_ADDR"] = "localhost"  # each node: its own host
os.environ["MASTER_PORT"] = port_file.read_text()
dist.init_process_group("gloo", rank=rank, world_size=world_size)  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
dist.init_process_group("gloo", rank=rank, world_size=world_size)  # the first node's address and port
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(2, 3),
        op="init_process_group",
    ),
    Case(
        name="init_node_rank_zero_given_on_every_node",
        url="https://github.com/NVIDIA/nvidia-resiliency-ext/issues/142",
        summary="the in-process and checkpoint examples stuck on a 2-node run: the torchrun command "
        "carried --node-rank=0 on both nodes; removing the flag fixed the hang",
        world_size=4,
        init=False,
        body="""\
nproc_per_node, local_rank = 2, rank % 2  # two nodes of two processes
node_rank = 0  # torchrun --node-rank=0, on both nodes' command line
os.environ["RANK"] = str(node_rank * nproc_per_node + local_rank)
dist.init_process_group("gloo")  # <- culprit line
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
nproc_per_node, local_rank = 2, rank % 2
node_rank = rank // 2  # no --node-rank: the rendezvous assigns each node its own
os.environ["RANK"] = str(node_rank * nproc_per_node + local_rank)
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(2, 3),
        op="init_process_group",
    ),
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
    ),
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
    ),
]

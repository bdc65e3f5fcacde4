"""Launched mode, pure: which launcher started this pytest process, and where its ranks meet.

Under ``torchrun``, ``srun`` or ``mpiexec`` every pytest process is a rank of one launched world
running the same session.  :func:`detect` reads the launcher's variables (or ``--ddp-launcher``)
into a :class:`Launch`; :func:`channel_address` says where global rank 0's pytest listens.
Nothing here opens a connection.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_ddp.common import procfs


class LaunchError(ValueError):
    """The environment does not describe the launch asked for, or lacks what launched mode needs."""


@dataclass(frozen=True)
class Launch:
    """This process's place in the launched world."""

    launcher: str  # one of LAUNCHERS
    rank: int  # global rank
    world_size: int
    local_rank: int  # on this node
    node_rank: int
    nodes: int
    job: str  # names this launch (and restart) among others on the machine
    master_addr: str | None  # MASTER_ADDR where the launcher or the user set one
    master_port: int | None

    @property
    def one_node(self) -> bool:
        return self.nodes == 1

    @property
    def controller(self) -> bool:
        """Global rank 0: runs the session, the others serve it their rank."""
        return self.rank == 0

    def describe(self) -> str:
        """``launched by torchrun: 8 ranks on 2 nodes``"""
        ranks = f"{self.world_size} rank" + ("" if self.world_size == 1 else "s")
        nodes = f"{self.nodes} node" + ("" if self.nodes == 1 else "s")
        return f"launched by {self.launcher}: {ranks} on {nodes}"


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def _launcher_key(env: Mapping[str, str]) -> str:
    """The process that launched this one on this node, with its start time (never reused).
    Under MPICH the peer of ``PMI_FD``, the socket its launcher holds, even with a shell between
    (``mpiexec -n 4 sh -c 'pytest ...'``); otherwise the parent."""
    launcher = os.getppid()
    if env.get("PMI_FD", "").isdigit():
        try:
            with socket.socket(fileno=os.dup(int(env["PMI_FD"]))) as pmi:
                launcher, _ = procfs.peer_credentials(pmi)
        except OSError:
            pass
    found = procfs.stat(launcher)
    started = 0 if found is None else found.started
    return f"{launcher}.{started}"


def _numbered(
    launcher: str, by: str, env: Mapping[str, str], job: str, **variables: tuple[str, ...]
) -> Launch:
    """The launch whose fields are read from ``variables`` (per field, the first set wins);
    LaunchError naming those that ``by``, the launching command, left unset."""
    numbers = {field: _int(env, *names) for field, names in variables.items()}
    missing = [names[0] for field, names in variables.items() if numbers[field] is None]
    if missing:
        raise LaunchError(f"{by}'s environment is incomplete: {', '.join(missing)} not set")
    return Launch(
        launcher, **numbers,  # type: ignore[arg-type]
        job=job, master_addr=env.get("MASTER_ADDR"), master_port=_int(env, "MASTER_PORT"),
    )


def _torchrun(env: Mapping[str, str]) -> Launch | None:
    if "TORCHELASTIC_RUN_ID" not in env or _int(env, "RANK") is None:
        return None
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return _numbered(
        "torchrun", "torchrun", env, f"torchrun.{env['TORCHELASTIC_RUN_ID']}.{restart}",
        rank=("RANK",), world_size=("WORLD_SIZE",), local_rank=("LOCAL_RANK",),
        node_rank=("GROUP_RANK",), nodes=("GROUP_WORLD_SIZE",),
    )


def _slurm(env: Mapping[str, str]) -> Launch | None:
    # A task of srun has a step id and a task rank; the batch script itself has neither.
    if "SLURM_STEP_ID" not in env or _int(env, "SLURM_PROCID") is None:
        return None
    return _numbered(
        "slurm", "srun", env, f"slurm.{env.get('SLURM_JOB_ID', '')}.{env['SLURM_STEP_ID']}",
        rank=("SLURM_PROCID",), world_size=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
        local_rank=("SLURM_LOCALID",),
        node_rank=("SLURM_NODEID",), nodes=("SLURM_STEP_NUM_NODES", "SLURM_NNODES"),
    )


def _mpi(env: Mapping[str, str]) -> Launch | None:
    rank = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    world = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    if rank is None or world is None:
        return None
    local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
    if local is None or local_world is None:  # MPICH's gforker: one machine, nothing more said
        local, local_world = rank, world
    nodes = _int(env, "OMPI_MCA_orte_num_nodes", "OMPI_NUM_NODES")
    if nodes is None:
        nodes = 1 if local_world == world else -(-world // local_world)
    return Launch(
        "mpi", rank, world, local,
        node_rank=(rank - local) // local_world if local_world else 0,
        nodes=nodes,
        job=f"mpi.{env.get('PMIX_NAMESPACE') or env.get('OMPI_MCA_ess_base_jobid') or _launcher_key(env)}",
        master_addr=env.get("MASTER_ADDR"),
        master_port=_int(env, "MASTER_PORT"),
    )


DETECTORS = {"torchrun": _torchrun, "slurm": _slurm, "mpi": _mpi}


def detect(env: Mapping[str, str], launcher: str = "auto") -> Launch | None:
    """This process's launch, or None for an ordinary pytest run (or ``--ddp-launcher=local``).

    ``auto`` tries torchrun, then SLURM (torchrun inside an srun step is torchrun's world), then
    MPI (srun sets ``PMI_RANK`` too with ``--mpi=pmi2``); found so, one process is an ordinary run.
    """
    if launcher == "local":
        return None
    if launcher != "auto":
        found = DETECTORS[launcher](env)
        if found is None:
            raise LaunchError(f"--ddp-launcher={launcher}: this process was not started by {launcher} "
                              f"(its environment variables are not set)")
        return found
    for detector in DETECTORS.values():
        found = detector(env)
        if found is not None:
            return found if found.world_size > 1 else None
    return None


def channel_address(launch: Launch) -> tuple[str, int] | None:
    """Where the controller listens for the other ranks' pytest: None on one node (a private
    Unix socket, no network address); on several, MASTER_ADDR (which every node reaches, as
    ``env://`` needs) with an OS-chosen port published in torchrun's store, else MASTER_PORT."""
    if launch.one_node:
        return None
    if not launch.master_addr:
        raise LaunchError(f"{launch.describe()}: set MASTER_ADDR to an address of the first node "
                          f"that every node reaches (and MASTER_PORT), as for torch's env:// init")
    if launch.launcher == "torchrun":
        return (launch.master_addr, 0)
    if launch.master_port is None:
        raise LaunchError(f"{launch.describe()}: set MASTER_PORT (a free port on MASTER_ADDR's node)")
    return (launch.master_addr, launch.master_port)


def store_key(launch: Launch) -> str:
    """The key under which torchrun's store holds the controller's address (several nodes)."""
    return f"pytest-ddp/{launch.job}/controller"


def collection_differences(items: dict[int, list[str]], nodes: dict[int, str]) -> str | None:
    """What the ranks collected (``items``, by rank) differently from global rank 0, in words,
    naming ``nodes``; None if they all agree."""
    reference = items[0]
    lines = []
    for rank in sorted(items):
        theirs = items[rank]
        if theirs == reference:
            continue
        where = f"rank {rank} (on {nodes.get(rank, '?')})"
        known, collected = set(reference), set(theirs)
        extra = [i for i in theirs if i not in known]
        missing = [i for i in reference if i not in collected]
        if not extra and not missing:
            lines.append(f"{where}: the same tests in another order")
        for label, ids in (("only on this rank", extra), ("not collected here", missing)):
            shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            if ids:
                lines.append(f"{where}: {len(ids)} {label}: {shown}")
    if not lines:
        return None
    listed = "\n  ".join(lines)
    return f"the ranks collected different tests; every rank must run the same session:\n  {listed}"

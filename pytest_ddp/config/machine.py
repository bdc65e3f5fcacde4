"""What this machine offers ranks: GPUs, shared out between xdist workers, and room for ranks."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable, Iterator

from pytest_ddp.common import procfs

# An idle rank's own memory (USS); torch's pages are shared with the forkserver.
RANK_MEMORY = 22 * 2**20
# RLIMIT_NPROC counts a user's threads: a Gloo rank runs 7 at its peak, a session running a group
# 3 more than when it admits one (the forkserver, the store's thread); docs/measured/nproc.md.
RANK_TASKS = 7
SESSION_TASKS = 3
CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 21, 24  # linux/capability.h


class GpuShortage(RuntimeError):
    """Fewer GPUs for this controller than a test has ranks."""


def worker_gpus(visible: list[str], worker: str | None, workers: int) -> list[str]:
    """This controller's share of the visible GPUs: under xdist, a disjoint slice per worker."""
    if worker is None or workers <= 1:
        return visible
    index = int(worker.lstrip("gw") or 0)
    return visible[index::workers]


def gpu_shortage(needed: int, mine: int, visible: int, workers: int) -> str | None:
    """Why ``needed`` ranks cannot each have one of the ``mine`` GPUs, or None if they can."""
    if mine >= needed:
        return None
    if mine == visible:
        return f"nccl test needs {needed} GPUs, {visible} visible"
    return (
        f"nccl test needs {needed} GPUs, this xdist worker has {mine} "
        f"({visible} visible, shared between {workers} workers)"
    )


def visible_gpus() -> list[str]:
    """The GPU ids this process may use, in ``CUDA_VISIBLE_DEVICES`` order."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g.strip() for g in listed.split(",") if g.strip()] if listed else []
    count = torch.cuda.device_count()
    return ids[:count] if ids else [str(i) for i in range(count)]


def rank_gpus(world_size: int) -> list[str]:
    """One GPU per rank from this controller's share; GpuShortage if it has too few."""
    visible = visible_gpus()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    mine = worker_gpus(visible, os.environ.get("PYTEST_XDIST_WORKER"), workers)
    reason = gpu_shortage(world_size, len(mine), len(visible), workers)
    if reason is not None:
        raise GpuShortage(reason)
    return mine[:world_size]


def rank_capacity(mem_available: int, nproc_limit: int, tasks: int) -> tuple[int, str]:
    """How many idle ranks fit, and why: by memory, and by ``nproc_limit`` (-1: not enforced) less
    the ``tasks`` (threads) this user already runs."""
    memory = f"{mem_available // 2**20} MiB available at about {RANK_MEMORY // 2**20} MiB per rank"
    limits = [(mem_available // RANK_MEMORY, memory)]
    if nproc_limit >= 0:
        why = (
            f"RLIMIT_NPROC {nproc_limit} with {tasks} threads of this user running, "
            f"at least {RANK_TASKS} per rank"
        )
        limits.append(((nproc_limit - tasks - SESSION_TASKS) // RANK_TASKS, why))
    capacity, why = min(limits)
    return max(0, capacity), why


def nproc_enforced(limit: int, real_uid: int, effective_caps: int, uid_map: str) -> bool:
    """Whether the kernel holds a process to its RLIMIT_NPROC ``limit``: not where its real uid is
    root or it has CAP_SYS_ADMIN or CAP_SYS_RESOURCE (setrlimit(2)), both of the initial user
    namespace (``uid_map``: /proc/self/uid_map)."""
    if limit == resource.RLIM_INFINITY:
        return False
    initial = uid_map.split() == ["0", "0", "4294967295"]
    kernel_uid = None
    for line in uid_map.splitlines():
        inside, outside, count = (int(field) for field in line.split())
        if inside <= real_uid < inside + count:
            kernel_uid = outside + real_uid - inside
    exempt_caps = 1 << CAP_SYS_ADMIN | 1 << CAP_SYS_RESOURCE
    return not (kernel_uid == 0 or (initial and effective_caps & exempt_caps))


def user_tasks(statuses: Iterable[dict[str, str]], real_uid: int) -> int:
    """The threads of ``real_uid`` (what RLIMIT_NPROC counts) in these /proc/PID/status fields."""
    count = 0
    for fields in statuses:
        if int(fields["Uid"].split()[0]) == real_uid:
            count += int(fields["Threads"])
    return count


def machine_rank_capacity() -> tuple[int, str]:
    """:func:`rank_capacity` of this machine now (/proc/meminfo, getrlimit, /proc)."""
    mem_available = procfs.size(procfs.meminfo()["MemAvailable"])
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    status = procfs.status()
    with open("/proc/self/uid_map") as f:
        uid_map = f.read()
    real_uid = os.getuid()
    if not nproc_enforced(soft, real_uid, int(status["CapEff"], 16), uid_map):
        return rank_capacity(mem_available, -1, 0)
    return rank_capacity(mem_available, soft, user_tasks(statuses(), real_uid))


def statuses() -> Iterator[dict[str, str]]:
    """The /proc/PID/status fields of every process now."""
    for pid in procfs.pids():
        try:
            yield procfs.status(pid)
        except OSError:  # gone since listed
            continue

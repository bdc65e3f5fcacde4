"""What this machine offers ranks: GPUs, shared out between xdist workers,
and room for rank processes.  Used by the plugin and by ``pytest_ddp.run()``.
"""

from __future__ import annotations

import os
import resource

# An idle rank costs about 22 MB of its own (USS); torch's pages are shared
# with the forkserver the ranks are forked from.
RANK_MEMORY = 22 * 2**20


class GpuShortage(RuntimeError):
    """Fewer GPUs for this controller than a test has ranks."""


def worker_gpus(visible: list[str], worker: str | None, workers: int) -> list[str]:
    """This controller's share of the visible GPUs: all of them, or under xdist a
    disjoint slice per worker (gw0 gets 0, N, 2N, ...), so workers never share a GPU."""
    if worker is None or workers <= 1:
        return visible
    index = int(worker.lstrip("gw") or 0)
    return visible[index::workers]


def gpu_shortage(needed: int, mine: int, visible: int, workers: int) -> str | None:
    """Why ``needed`` ranks cannot each have a GPU of the ``mine`` this controller
    has (of ``visible``, shared between ``workers``), or None if they can."""
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


def rank_capacity(mem_available: int, nproc_limit: int, processes: int) -> tuple[int, str]:
    """How many idle ranks fit, and why: ``mem_available`` bytes at RANK_MEMORY
    each, and the ``nproc_limit`` (RLIMIT_NPROC, -1 for none) less the
    ``processes`` this user already runs."""
    memory = f"{mem_available // 2**20} MiB available at about {RANK_MEMORY // 2**20} MiB per rank"
    limits = [(mem_available // RANK_MEMORY, memory)]
    if nproc_limit >= 0:
        limits.append((nproc_limit - processes, f"RLIMIT_NPROC {nproc_limit} with {processes} processes running"))
    return min(limits)


def machine_rank_capacity() -> tuple[int, str]:
    """:func:`rank_capacity` of this machine now (/proc/meminfo, getrlimit, /proc)."""
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    mem_available = int(fields["MemAvailable"].split()[0]) * 1024
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return rank_capacity(mem_available, -1, 0)
    return rank_capacity(mem_available, soft, _user_processes())


def _user_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                continue
    return count

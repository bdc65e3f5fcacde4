"""Which ddp runs this machine takes, and the group each runs on: one path for the marker's tests
(:mod:`pytest_ddp.controller`) and for :func:`pytest_ddp.run`: spec, whether it can run here,
and its group's configuration.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from pytest_ddp.config.machine import GpuShortage, machine_rank_capacity, rank_gpus
from pytest_ddp.config.settings import Settings
from pytest_ddp.config.spec import MarkArgs, RankSpec, SpecError, process_group_timeout
from pytest_ddp.groups.group import GroupConfig
from pytest_ddp.groups.mpi_group import mpi_unavailable


@dataclass(frozen=True)
class Launched:
    """What admission needs of the launch this session is part of (:mod:`pytest_ddp.launched`)."""

    world_size: int  # ranks the launcher started
    description: str  # the launch in words, for a skip reason


class Admission:
    """The admission of one session's ddp runs, under its settings (and its launch, if any)."""

    def __init__(self, settings: Settings, launched: Launched | None = None) -> None:
        self.settings = settings
        self.launched = launched
        self._rank_capacity: tuple[int, str] | None = None  # measured on first use

    def spec(self, mark: MarkArgs, world_size: int, timeout_mark: float | None = None) -> RankSpec:
        """The spec of a run of ``world_size`` ranks; SpecError where it cannot run at all."""
        self._check_capacity(world_size)
        return self.settings.spec(mark, world_size, timeout_mark)

    def _check_capacity(self, world_size: int) -> None:
        """Refuse a world size this machine cannot hold, before anything is started."""
        if self.launched is not None:
            return
        if self.settings.max_world_size is not None:
            if world_size > self.settings.max_world_size:
                most = self.settings.max_world_size
                raise SpecError(f"world_size={world_size}: above --ddp-max-world-size={most}")
            return
        if self._rank_capacity is None:
            self._rank_capacity = machine_rank_capacity()
        limit, why = self._rank_capacity
        if world_size > limit:
            raise SpecError(
                f"world_size={world_size}: this machine holds at most {limit} ranks ({why}); "
                f"--ddp-max-world-size=N overrides this check"
            )

    def unavailable(self, spec: RankSpec) -> str | None:
        """Why this machine cannot run ``spec`` (the test is skipped saying so): too few GPUs,
        no MPI, too few launched ranks."""
        if self.launched is not None:
            if spec.backend == "mpi":
                return "backend='mpi' tests do not run under a launcher: run them with plain pytest"
            if spec.world_size > self.launched.world_size:
                return f"needs world_size={spec.world_size}; {self.launched.description}"
            return None
        if spec.backend == "mpi":
            return mpi_unavailable(self.settings.mpi_launcher)
        if spec.backend == "nccl":
            try:
                rank_gpus(spec.world_size)
            except GpuShortage as exc:
                return str(exc)
        return None

    def group_config(self, spec: RankSpec, longest_timeout: float, **mode: Any) -> GroupConfig:
        """The configuration of a group for ``spec`` whose longest run may take ``longest_timeout``;
        ``mode``: the rest of :class:`GroupConfig` (what the ranks run)."""
        return GroupConfig(
            world_size=spec.world_size,
            backend=spec.backend,
            init=spec.init,
            pg_timeout=process_group_timeout(longest_timeout),
            sys_path=list(sys.path),
            # Launched: each rank's GPU is its LOCAL_RANK's, as the launcher set the node up.
            gpus=rank_gpus(spec.world_size) if spec.backend == "nccl" and self.launched is None else [],
            mpi_launcher=self.settings.mpi_launcher,
            **mode,
        )

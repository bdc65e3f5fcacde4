"""Launched mode under SLURM: ``srun -n 4 pytest`` and an ``sbatch`` script running it, on a
one-node cluster the session starts itself (tests/launchers/slurm.py)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from . import suite
from .slurm import SlurmCluster


def _srun(cluster: SlurmCluster, folder: Path, nproc: int = 4) -> suite.Result:
    proc = cluster.srun(
        ["-n", str(nproc), sys.executable, *suite.pytest_command("-rs")], folder, env=suite.launched_environment(),
        timeout=240,
    )
    return suite.collect(folder, proc.returncode, proc.stdout + proc.stderr)


def test_one_session_under_srun(slurm_cluster: SlurmCluster, folder: Path) -> None:
    suite.write_suite(folder)
    result = _srun(slurm_cluster, folder)
    suite.check_suite(result, folder)
    assert "launched by slurm: 4 ranks on 1 node" in result.output


def test_collections_that_differ_under_srun(slurm_cluster: SlurmCluster, folder: Path) -> None:
    """On 3 tasks: the session ends before any test runs, and rank 2 has a rank beside it."""
    suite.write_suite(folder, suite.DIFFERENT_COLLECTION)
    suite.check_collection_differs(_srun(slurm_cluster, folder, 3), 3)


def test_one_session_in_an_sbatch_script(slurm_cluster: SlurmCluster, folder: Path) -> None:
    """The batch script itself is no rank (plain pytest there would be an ordinary session);
    the tasks of the srun it runs are."""
    suite.write_suite(folder)
    command = shlex.join([sys.executable, *suite.pytest_command("-rs")])
    script = f"#!/bin/sh\n#SBATCH -n 4\nexport OMP_NUM_THREADS=1\nsrun -n 4 {command}\n"
    code, output = slurm_cluster.sbatch(script, folder, timeout=240, env=suite.launched_environment())
    result = suite.collect(folder, code, output)
    suite.check_suite(result, folder)

"""Launched mode under SLURM, on a one-node cluster the session starts itself (tests/launched/slurm.py):
the suite in an ``sbatch`` script whose ``srun -n 4 pytest`` starts the ranks, as a job runs it, and
the collections that differ under ``srun -n 3 pytest`` from the shell, where srun makes the job's
allocation itself. The two are the ways a user starts ranks with SLURM; the ranks see the same step
variables either way, so the suite (25 CPU-s of 4 pytest processes and their forkservers) runs once."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from . import suite
from .runs import OWN_BASETEMP
from .slurm import SlurmCluster


def test_collections_that_differ_under_srun(slurm_cluster: SlurmCluster, folder: Path) -> None:
    """On 3 tasks: the session ends before any test runs, and rank 2 has a rank beside it; every
    rank ends with status 4, and each launched rank's pytest (a host) logs what rank 0's told it,
    in a basetemp of its own."""
    suite.write_suite(folder, suite.DIFFERENT_COLLECTION + OWN_BASETEMP)
    proc = slurm_cluster.srun(
        ["-n", "3", sys.executable, *suite.pytest_command()], folder, env=suite.launched_environment(), timeout=240
    )
    suite.check_collection_differs(suite.collect(folder, proc.returncode, proc.stdout + proc.stderr), 3)
    suite.check_hosts_logged_why(folder, 3)


def test_one_session_in_an_sbatch_script(slurm_cluster: SlurmCluster, folder: Path) -> None:
    """The batch script itself is no rank (plain pytest there would be an ordinary session);
    the tasks of the srun it runs are."""
    suite.write_suite(folder)
    command = shlex.join([sys.executable, *suite.pytest_command("-rs")])
    script = f"#!/bin/sh\n#SBATCH -n 4\nexport OMP_NUM_THREADS=1\nsrun -n 4 {command}\n"
    code, output = slurm_cluster.sbatch(script, folder, timeout=240, env=suite.launched_environment())
    result = suite.collect(folder, code, output)
    suite.check_suite(result, folder)
    assert "launched by slurm: 4 ranks on 1 node" in result.output

"""The test SLURM cluster itself (tests/launched/slurm.py), no pytest-ddp involved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LOOPBACK, alive, listening_addresses, parent, poll

from .slurm import SlurmCluster, children, slurm_unavailable

PRINT_RANK = "import os; print(os.environ['SLURM_PROCID'], os.environ['SLURM_NTASKS'])"


def start_step(cluster: SlurmCluster, folder: Path, tasks: int) -> subprocess.Popen[bytes]:
    """``srun -n TASKS`` in the background; each task writes its pid to ``pid.<rank>`` and
    runs until ``folder/done`` exists. Returns once every task has."""
    # Written, then renamed: a pid file is never seen half-written.
    task = "echo $$ > tmp.$SLURM_PROCID; mv tmp.$SLURM_PROCID pid.$SLURM_PROCID; until [ -e done ]; do sleep 0.05; done"
    step = subprocess.Popen(["srun", "--overcommit", "-n", str(tasks), "sh", "-c", task], cwd=folder, env=cluster.env)
    if not poll(lambda: len(list(folder.glob("pid.?"))) == tasks, 60):
        (folder / "done").touch()  # tasks that did start end too
        step.kill()
        step.wait()
        raise AssertionError(f"the step's tasks never started\n{cluster.logs_text()}")
    return step


def test_srun_starts_one_process_per_task(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    r = slurm_cluster.srun(["-n", "4", sys.executable, "-c", PRINT_RANK], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0 4", "1 4", "2 4", "3 4"]


def test_a_batch_script_runs_a_step_and_its_exit_code_comes_back(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = f'#!/bin/sh\nsrun -n 2 {sys.executable} -c "{PRINT_RANK}"\nexit 7\n'
    code, output = slurm_cluster.sbatch(script, cwd=tmp_path)
    assert code == 7, output
    assert sorted(output.splitlines()) == ["0 2", "1 2"]


def test_srun_exits_with_the_exit_code_of_a_failing_task(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    r = slurm_cluster.srun(["-n", "4", "sh", "-c", "exit $(( SLURM_PROCID == 2 ? 3 : 0 ))"], cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "task 2: Exited with exit code 3" in r.stderr


def test_the_daemons_and_srun_listen_on_loopback_only(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    step = start_step(slurm_cluster, tmp_path, 2)  # srun listens only while its step runs
    try:
        sruns = [step.pid, *children(step.pid)]
        daemons = [process.pid for process in slurm_cluster.daemons.values()]
        addresses = {pid: listening_addresses(pid) for pid in daemons + sruns}
        listening = {slurm_cluster.daemons["slurmctld"].pid, slurm_cluster.daemons["slurmd"].pid, step.pid}
        assert all(addresses[pid] for pid in listening), addresses
        assert {address for found in addresses.values() for address in found} <= LOOPBACK, addresses
    finally:
        (tmp_path / "done").touch()
        assert step.wait(60) == 0


def test_stop_leaves_no_process_even_with_a_step_running(tmp_path: Path) -> None:
    if reason := slurm_unavailable():
        pytest.skip(reason)
    cluster = SlurmCluster.start(tmp_path / "cluster")
    try:
        step = start_step(cluster, tmp_path, 2)
        tasks = [int(path.read_text()) for path in tmp_path.glob("pid.?")]
        stepds = {parent(pid) for pid in tasks}
    finally:
        cluster.stop()
    step.wait(10)  # srun goes with the rest
    # stop() waited for its daemons and found no process it tagged; the tasks and their
    # slurmstepds, known by the pids they wrote, are gone too.
    assert not [pid for pid in [*tasks, *stepds] if pid and alive(pid)]

"""Init, held out (the fifth set): a world size every process agrees on, smaller than the processes that
run."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="init_world_size_one_in_every_process",
        url="https://github.com/pytorch/pytorch/issues/62381",
        summary="'torch.distributed and subprocess do not work together': the hang is in "
        "init_process_group, where both processes pass world_size=1 while two run, so rank 1 never "
        "gets past it (the answer: the world size should be 2)",
        world_size=2,
        init=False,
        body="""\
import subprocess

dist.init_process_group("gloo", init_method="env://", world_size=1, rank=rank)  # <- culprit line
cmd = [sys.executable, "-c", "print('hello world')"]
proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
proc_o, proc_e = proc.communicate(timeout=10)
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
import subprocess

dist.init_process_group("gloo", init_method="env://", world_size=2, rank=rank)  # two processes
cmd = [sys.executable, "-c", "print('hello world')"]
proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
proc_o, proc_e = proc.communicate(timeout=10)
dist.barrier()
dist.destroy_process_group()
""",
        kind="init",
        culprits=(0, 1),
        op="init_process_group",
        held_out=True,
    ),
]

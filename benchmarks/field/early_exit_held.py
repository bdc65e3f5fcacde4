"""Ranks ending early, held out (the fourth set): a progress bar that exists on the main process
only, closed by every process when max_steps is reached."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="max_steps_closes_main_only_progress_bar",
        url="https://github.com/neuralmagic/yolov5/pull/101",
        summary="with DDP and max_steps set, the run fails on the non-main nodes: they update a "
        "progress bar that only the main process created",
        world_size=2,
        body="""\
from tqdm import tqdm

model = DDP(nn.Linear(4, 1))
batches = [torch.ones(2, 4)] * 4
pbar = enumerate(batches)
if rank == 0:  # RANK in {-1, 0}: the progress bar is the main process's
    pbar = tqdm(pbar, total=len(batches), disable=True)
max_steps = 2
for i, batch in pbar:
    model(batch).sum().backward()
    if i + 1 >= max_steps:
        pbar.close()  # <- culprit line
        break
dist.barrier()  # the final evaluation waits for every process
""",
        twin="""\
from tqdm import tqdm

model = DDP(nn.Linear(4, 1))
batches = [torch.ones(2, 4)] * 4
pbar = enumerate(batches)
if rank == 0:
    pbar = tqdm(pbar, total=len(batches), disable=True)
max_steps = 2
for i, batch in pbar:
    model(batch).sum().backward()
    if i + 1 >= max_steps:
        if rank == 0:  # only the main process has a progress bar to close
            pbar.close()
        break
dist.barrier()
""",
        kind="rank_exited",
        culprits=(1,),
        op="barrier",
        held_out=True,
    ),
]

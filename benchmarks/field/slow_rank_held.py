"""Slow ranks, held out (the fourth set): a process whose share of an evaluation takes longer
than the collective's timeout."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="eval_generation_outlasts_watchdog",
        url="https://github.com/EleutherAI/lm-evaluation-harness/pull/1404",
        summary="multi-GPU evaluation crashes on the watchdog's timeout: one process takes too long "
        "to generate its answers before the all_reduce that gathers the results; the fix raises the "
        "timeout",
        world_size=2,
        body="""\
def generate_until(requests):  # greedy generation; rank 1's share holds the long answers
    if rank == 1:
        time.sleep(60)  # <- culprit line
    return [0.0] * len(requests)


results = generate_until(["question"] * 4)
dist.all_reduce(torch.tensor([float(len(results))]))  # the results, gathered across processes
""",
        twin="""\
def generate_until(requests):  # the generation fits in the timeout
    time.sleep(0.1)
    return [0.0] * len(requests)


results = generate_until(["question"] * 4)
dist.all_reduce(torch.tensor([float(len(results))]))
""",
        kind="timeout",
        culprits=(1,),
        op=None,
        held_out=True,
    ),
]

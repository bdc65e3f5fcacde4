"""Ranks ending early, held out (the fifth set): a rank whose evaluation left it no metrics raises
while its peer trains on."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="evaluator_skipped_off_main_then_best_metric_raises",
        url="https://github.com/huggingface/sentence-transformers/pull/3994",
        summary="running the evaluator on the local main process only (#3442, reverted in #3463) left "
        "output.metrics empty on the other ranks, which crashed _determine_best_metric there while "
        "the main process went on training",
        world_size=2,
        body="""\
def evaluate():  # SentenceTransformerTrainer.evaluate with the evaluator under is_local_process_zero()
    metrics = {}
    if rank == 0:
        metrics["eval_cosine_accuracy"] = 0.81  # self.evaluator(self.model)
    return metrics


def determine_best_metric(metrics):  # Trainer._determine_best_metric
    return metrics["eval_cosine_accuracy"]  # <- culprit line


best = None
for step in range(2):
    dist.all_reduce(torch.ones(4))  # the training step's gradients
    best = determine_best_metric(evaluate())
""",
        twin="""\
def evaluate():  # the evaluator on world process zero, its metrics broadcast to every rank
    metrics = [{}]
    if rank == 0:
        metrics[0]["eval_cosine_accuracy"] = 0.81
    dist.broadcast_object_list(metrics, src=0)
    return metrics[0]


def determine_best_metric(metrics):
    return metrics["eval_cosine_accuracy"]


best = None
for step in range(2):
    dist.all_reduce(torch.ones(4))
    best = determine_best_metric(evaluate())
assert best == 0.81
""",
        kind="rank_exited",
        culprits=(1,),
        op="all_reduce",
        held_out=True,
    ),
]

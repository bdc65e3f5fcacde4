"""torchmetrics inside a ddp test: each rank updates a metric with its own
batches, and ``compute()`` syncs the states across ranks (a barrier, then ``all_gather``s)."""

from pathlib import Path

import pytest
import torch

import pytest_ddp

torchmetrics = pytest.importorskip("torchmetrics")


def rank_batch(rank):
    """Rank 0 predicts 3 of 4 right, rank 1 1 of 4."""
    target = torch.tensor([0, 1, 2, 3])
    preds = target.clone()
    preds[3 if rank == 0 else 1:] = (preds[3 if rank == 0 else 1:] + 1) % 4
    return preds, target


@pytest.mark.ddp(world_size=2)
def test_compute_syncs_across_ranks(rank):
    metric = torchmetrics.classification.MulticlassAccuracy(num_classes=4, average="micro")
    metric.update(*rank_batch(rank))
    assert metric.compute().item() == 0.5  # (3 + 1) / 8, on both ranks
    assert metric._to_sync and not metric._is_synced  # compute() unsynced the local state again
    metric.reset()


@pytest.mark.ddp(world_size=2)
def test_sum_metric_with_uneven_updates(rank):
    metric = torchmetrics.aggregation.SumMetric()
    for value in range(rank + 2):  # rank 0 updates twice, rank 1 three times
        metric.update(float(value))
    assert metric.compute().item() == (0 + 1) + (0 + 1 + 2)


def compute_on_rank_0(rank):
    metric = torchmetrics.classification.MulticlassAccuracy(num_classes=4, average="micro")
    metric.update(*rank_batch(rank))
    if rank == 0:
        metric.compute()  # rank 0 only


def test_compute_on_one_rank_is_diagnosed():
    result = pytest_ddp.run(compute_on_rank_0, world_size=2, timeout=30)
    assert result.outcome == "deadlock", result.diagnosis.text
    assert result.diagnosis.kind == "partial"
    # The call that syncs out of sight is made under rank 0's branch alone: rank 0 is named.
    assert (result.diagnosis.waiting, result.diagnosis.culprits) == ([], [0])
    # gather_all_tensors() starts with a barrier, before its all_gathers
    assert result.diagnosis.collective == "barrier"
    waiting = result.ranks[0].collectives[-1]
    lines = Path(__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.endswith("# rank 0 only"))
    # The site is the user's line, the library's frame that made the call its caller.
    assert waiting.caller.startswith("torchmetrics/utilities/distributed.py:")
    assert waiting.site.endswith(f"test_torchmetrics.py:{line}")

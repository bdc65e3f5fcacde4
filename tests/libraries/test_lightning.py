"""Lightning's Trainer inside a ddp test, as its docs write a DDP run on CPU.

The ranks look like processes torchrun started (``LOCAL_RANK`` is set), so the
Trainer launches nothing, and it finds the default process group initialised,
so it does not initialise one.
"""

import os

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import pytest_ddp

L = pytest.importorskip("lightning")


class Regression(L.LightningModule):
    def __init__(self, misuse=None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.misuse = misuse

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def on_train_epoch_end(self):
        if self.global_rank == 0 and self.misuse == "barrier":
            self.trainer.strategy.barrier()
        if self.global_rank == 0 and self.misuse == "all_gather":
            self.all_gather(self.layer.weight)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(rank, misuse=None):
    """Fit on 64 samples (the same on every rank), batches of 8; return the model."""
    data = TensorDataset(*torch.randn(64, 5, generator=torch.Generator().manual_seed(0)).split([4, 1], dim=1))
    torch.manual_seed(rank)  # different initial weights per rank: DDP must make them equal
    model = Regression(misuse)
    trainer = L.Trainer(
        strategy="ddp", accelerator="cpu", devices=2, max_epochs=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=8))
    return trainer, model


@pytest.mark.ddp(world_size=2)
def test_trainer_fit_uses_the_existing_group(rank):
    world = dist.group.WORLD
    trainer, model = fit(rank)

    assert dist.group.WORLD is world  # not re-initialised, not destroyed
    # The ranks have torchrun's environment: Lightning sees a torchelastic launch.
    assert type(trainer.strategy.cluster_environment).__name__ == "TorchElasticEnvironment"
    assert (trainer.global_rank, trainer.world_size) == (rank, 2)
    assert trainer.global_step == 4  # 64 samples / 2 ranks (DistributedSampler) / 8 per batch
    weights = [torch.empty_like(model.layer.weight) for _ in range(2)]
    dist.all_gather(weights, model.layer.weight.detach())
    assert torch.equal(weights[0], weights[1])
    assert os.environ["WORLD_SIZE"] == "2"  # TorchElasticEnvironment's teardown leaves it


def barrier_on_rank_0(rank):
    fit(rank, misuse="barrier")


def all_gather_on_rank_0(rank):
    fit(rank, misuse="all_gather")


@pytest.mark.parametrize("fn, op", [(barrier_on_rank_0, "barrier"), (all_gather_on_rank_0, "all_gather")])
def test_collective_on_one_rank_is_diagnosed(fn, op):
    result = pytest_ddp.run(fn, world_size=2, timeout=30)
    assert result.outcome == "deadlock", result.diagnosis.text
    assert result.diagnosis.kind == "partial"
    # Rank 0's hook calls it under `if self.global_rank == 0`: a call made for one rank names that
    # rank, as Lightning#16541's fix (the call out of the branch) has it.
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([0], [])
    assert "in a branch of the code for one rank" in result.diagnosis.text
    assert result.ranks[0].collectives[-1].op == op

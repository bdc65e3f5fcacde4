"""Library misuse, held out (the fourth set): a Trainer whose save, on the main process only,
gathers a statistic from every process."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="trainer_store_flos_on_world_master",
        url="https://github.com/huggingface/transformers/pull/7365",
        summary="the Trainer hung while saving the model in distributed training: store_flos, which "
        "gathers the flos of every process, ran only on the main process while the others were "
        "already past that point",
        world_size=2,
        body="""\
def distributed_broadcast_scalars(scalars):
    tensorized = torch.tensor(scalars)
    output_tensors = [tensorized.clone() for _ in range(world_size)]
    dist.all_gather(output_tensors, tensorized)  # <- culprit line
    return torch.cat(output_tensors, dim=0)


class Trainer:
    total_flos = 1.0e9

    def is_world_master(self):
        return rank == 0

    def store_flos(self):  # the floating-point operations of the training, summed over processes
        self.flos = distributed_broadcast_scalars([self.total_flos]).sum().item()

    def save_model(self):
        if self.is_world_master():
            self.store_flos()
            torch.save({"total_flos": self.flos}, ddp_shared_path / "config.pt")


trainer = Trainer()
model = DDP(nn.Linear(4, 1))
for step in range(1, 4):
    model(torch.ones(2, 4)).sum().backward()
    if step % 2 == 0:  # save_steps
        trainer.save_model()
""",
        twin="""\
def distributed_broadcast_scalars(scalars):
    tensorized = torch.tensor(scalars)
    output_tensors = [tensorized.clone() for _ in range(world_size)]
    dist.all_gather(output_tensors, tensorized)
    return torch.cat(output_tensors, dim=0)


class Trainer:
    total_flos = 1.0e9

    def is_world_master(self):
        return rank == 0

    def store_flos(self):
        self.flos = distributed_broadcast_scalars([self.total_flos]).sum().item()

    def save_model(self):
        self.store_flos()  # on every process, before the main process saves
        if self.is_world_master():
            torch.save({"total_flos": self.flos}, ddp_shared_path / "config.pt")


trainer = Trainer()
model = DDP(nn.Linear(4, 1))
for step in range(1, 4):
    model(torch.ones(2, 4)).sum().backward()
    if step % 2 == 0:
        trainer.save_model()
""",
        kind="mismatch",
        culprits=(0,),
        op="all_gather",
        held_out=True,
    ),
]

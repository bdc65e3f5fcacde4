"""Library misuse inside transformers' Trainer: a save or a statistic on the world's main process
only, through a call that syncs every process."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="trainer_fsdp_state_dict_on_world_zero",
        url="https://github.com/huggingface/transformers/pull/10596",
        summary="training with the fully-sharded wrapper hangs at save: the state dict call "
        "synchronises, and the Trainer made it on process zero only; the fix gathers it on all "
        "processes and saves on zero",
        world_size=2,
        body="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
if rank == 0:  # if self.is_world_process_zero(): self._save(output_dir)
    state_dict = model.state_dict()  # <- culprit line
    torch.save(state_dict, ddp_shared_path / "pytorch_model.bin")
""",
        twin="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(nn.Linear(4, 4), device_id=torch.device("cpu"))
state_dict = model.state_dict()  # gathered on all processes
if rank == 0:
    torch.save(state_dict, ddp_shared_path / "pytorch_model.bin")
""",
        kind="partial",
        culprits=(0,),
        op="all_gather_into_tensor",
    ),
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
    ),
]

"""Library misuse, held out (the fifth set): Lightning Fabric's save, which meets every process in a
barrier of its own, called on global rank 0 only before the user's own barrier."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="fabric_save_on_global_rank_zero_then_barrier",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/19780",
        summary="`if fabric.global_rank == 0: fabric.save(...)` then `fabric.barrier()` on CPU with two "
        "devices fails with 'Connection closed by peer': fabric.save has a barrier of its own, so it "
        "must be called on every process",
        world_size=2,
        body="""\
class Fabric:  # lightning.fabric.Fabric(accelerator="cpu", devices=2): what save and barrier do
    global_rank = rank

    def barrier(self):
        dist.barrier()

    def save(self, path, state):  # the strategy writes on global rank 0, then every process meets
        if self.global_rank == 0:
            torch.save(state, path)
        self.barrier()


fabric = Fabric()
state = {"a": 1, "b": 2}
if fabric.global_rank == 0:
    fabric.save(ddp_shared_path / "state.pkl", state)  # <- culprit line
fabric.barrier()
""",
        twin="""\
class Fabric:
    global_rank = rank

    def barrier(self):
        dist.barrier()

    def save(self, path, state):
        if self.global_rank == 0:
            torch.save(state, path)
        self.barrier()


fabric = Fabric()
state = {"a": 1, "b": 2}
fabric.save(ddp_shared_path / "state.pkl", state)  # on every process: it saves on rank 0 itself
fabric.barrier()
""",
        kind="partial",
        culprits=(0,),
        op="barrier",
        held_out=True,
    ),
]

"""What the recorder costs a step of the newer libraries' workloads, measured in one run.

Two ranks (Gloo over loopback, FileStore rendezvous) time three steps in rounds without and
with the recorder (writing to a real event log), alternating, both ranks switching together,
as ``recorder_overhead.py`` does for single calls (here each mode goes first in every other round):

- a pipelining step: a 4-layer MLP cut in two ``PipelineStage``s, ``ScheduleGPipe`` with 4
  microbatches (isend/irecv between the stages, each waited for);
- a tensor parallel step: an MLP under ``ColwiseParallel``/``RowwiseParallel`` on a CPU
  ``DeviceMesh``, forward and backward (functional all_reduces, recorded at the dispatcher);
- a compiled step: ``torch.compile(backend="aot_eager")`` of a small MLP's forward whose output
  is summed across the ranks with a functional all_reduce (no backward);
- a DeepSpeed step: ``deepspeed.initialize`` of a 2-layer MLP with ZeRO stage 2 and torch's AdamW
  (``DS_ACCELERATOR=cpu``), ``engine(x)``, ``engine.backward(loss)``, ``engine.step()``.

It prints each step's median milliseconds per step over rounds without and with the recorder,
the calls recorded per step, and the median over rounds of each round's own ratio.

    python benchmarks/library_overhead.py [--steps 200] [--rounds 10] [--only deepspeed]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
from recorder_overhead import count_calls, loop, medians, write_result

WIDTH, BATCH, WARM_UP = 64, 16, 10


def mlp(layers: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))


def pipelining_step(rank: int) -> Callable[[torch.Tensor], Any]:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    part = mlp(4)[2 * rank:2 * rank + 2]
    stage = PipelineStage(part, stage_index=rank, num_stages=2, device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    target = torch.zeros(BATCH, WIDTH)
    return (lambda x: schedule.step(x)) if rank == 0 else (lambda x: schedule.step(target=target))


def tensor_parallel_step(rank: int) -> Callable[[torch.Tensor], Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = parallelize_module(mlp(2), init_device_mesh("cpu", (2,)), {"0": ColwiseParallel(), "1": RowwiseParallel()})
    return lambda x: model(x).sum().backward()


def compiled_step(rank: int) -> Callable[[torch.Tensor], Any]:
    model = mlp(2)

    @torch.compile(backend="aot_eager")
    def forward(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(model(x), "sum", dist.group.WORLD).sum()

    def step(x: torch.Tensor) -> None:
        with torch.no_grad():
            forward(x)

    return step


def deepspeed_step(rank: int) -> Callable[[torch.Tensor], Any]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before DeepSpeed picks its accelerator
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))  # as the tests
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")  # what DeepSpeed reads beside the group
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": BATCH, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=mlp(2), config=config)

    def step(x: torch.Tensor) -> None:
        engine.backward(engine(x).pow(2).mean())
        engine.step()

    return step


STEPS = {"pipelining (GPipe, 4 microbatches)": pipelining_step, "tensor parallel": tensor_parallel_step,
         "compiled (aot_eager), functional all_reduce": compiled_step, "DeepSpeed ZeRO 2": deepspeed_step}


def worker(rank: int, folder: str, steps: int, rounds: int, only: str) -> None:
    from pytest_ddp.common.event_log import EventLog
    from pytest_ddp.record import recorder

    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 2), rank=rank, world_size=2)
    log = EventLog(os.path.join(folder, f"rank{rank}.events"))
    batch = torch.randn(BATCH, WIDTH)
    result: dict[str, Any] = {}
    each = max(steps // rounds, 1)
    for name, make in STEPS.items():
        if only.lower() not in name.lower():
            continue
        step = make(rank)
        loop(step, batch, WARM_UP)
        times: dict[str, list[tuple[float, float]]] = {"plain": [], "recorded": []}
        before = os.path.getsize(log.path) if os.path.exists(log.path) else 0
        for round_ in range(rounds):
            for mode in ("plain", "recorded") if round_ % 2 else ("recorded", "plain"):  # either first in turn
                dist.barrier()
                if mode == "recorded":
                    recorder.install(log)
                    recorder.start_test()
                times[mode].append(loop(step, batch, each))
                if mode == "recorded":
                    recorder.uninstall()
        result[name] = times
        result[name + " calls"] = count_calls(log.path, before) / (each * rounds)
    write_result(rank, folder, result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help=f"steps per mode, after {WARM_UP} warm-up steps")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds the steps are split into")
    parser.add_argument("--only", default="", help="only the steps whose name holds this text (any case)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        args = (folder, options.steps, options.rounds, options.only)
        mp.start_processes(worker, args=args, nprocs=2, start_method="spawn")
        with open(os.path.join(folder, "result.json")) as f:
            result = json.load(f)
    print(
        f"2 Gloo ranks, MLP width {WIDTH}, batch {BATCH}, {options.steps} steps per mode in {options.rounds} "
        f"alternating rounds, {os.cpu_count()} cores, torch {torch.__version__}; ms per step, wall (rank 0's CPU)"
    )
    for name in (name for name in STEPS if name in result):
        plain, recorded = result[name]["plain"], result[name]["recorded"]
        ratio = statistics.median(wall / plain_wall for (wall, _), (plain_wall, _) in zip(recorded, plain))
        print(f"{name}: {result[name + ' calls']:.0f} calls recorded per step on rank 0")
        print("  without recorder:  {:7.3f} ({:6.3f})".format(*(us / 1000 for us in medians(plain))))
        print("  with recorder:     {:7.3f} ({:6.3f})".format(*(us / 1000 for us in medians(recorded))))
        print(f"  ratio (median of each round's): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

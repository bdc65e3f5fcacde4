"""What the recorder adds to each torch.distributed call, measured in one run.

Two ranks (Gloo over loopback, FileStore rendezvous) loop over a 1-float
all_reduce in rounds without and with the recorder (writing to a real event
log), alternating, both ranks switching together; it prints the median over
rounds of the microseconds per call for each (wall time, and the CPU time of
rank 0's calling thread), and the added time and the ratio as medians over
rounds of each round's own difference and ratio (the machine drifts between
rounds more than the recorder costs).  Four calls are measured:
``dist.all_reduce`` (recorded by the function's wrapper), the same once the
c10d hook is armed (as in a test that built a DDP model: every c10d operation
then passes through a Python kernel, which only hands this call on), and the
functional collective ``funcol.all_reduce(...).wait()`` that DTensor and
FSDP2 issue (recorded at its own dispatcher operation, its ret written when
its wait returns), without and with the c10d hook.  Goal: at most 10 us
added per call.  Last, the same rounds time a training step of a small model
sharded with FSDP2 (milliseconds per step): what these costs come to in the
workload the functional collectives serve.

A Gloo round trip between two processes takes tens to hundreds of microseconds
and depends on scheduling, so on a small or busy machine the two-rank figures
are noisy, and any work between calls can cost more than itself.  The script
therefore also prints the recorder's own cost (its wrapper around a function
that does nothing, recording to a real log; best of several runs), the cost of
each call in a group of one (no peer to wait for), and, as a control, the loop
with a busy-wait of the wrapper's length in place of the recorder.

    python benchmarks/recorder_overhead.py [--calls 2000] [--steps 100] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

WARM_UP = 500


def functional_all_reduce(tensor: torch.Tensor) -> None:
    funcol.all_reduce(tensor, "sum", dist.group.WORLD).wait()


# name -> (the call, whether the c10d hook is armed first: as in a test that built a DDP model)
CALLS: dict[str, tuple[Callable[[torch.Tensor], Any], bool]] = {
    "dist.all_reduce": (lambda tensor: dist.all_reduce(tensor), False),
    "dist.all_reduce, hook armed": (lambda tensor: dist.all_reduce(tensor), True),
    "functional all_reduce": (functional_all_reduce, False),
    "functional all_reduce, hook armed": (functional_all_reduce, True),
}


def loop(
    call: Callable[[torch.Tensor], Any], tensor: torch.Tensor, calls: int, busy_us: float = 0.0
) -> tuple[float, float]:
    """Microseconds of wall and thread CPU time per call, each after ``busy_us`` of busy-waiting."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        if busy_us:
            until = time.perf_counter() + busy_us / 1e6
            while time.perf_counter() < until:
                pass
        call(tensor)
    return (time.perf_counter() - wall) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


def own_cost(log: Any) -> float:
    """Microseconds the recorder spends per call around a call that costs nothing."""
    from pytest_ddp.record import recorder

    def nothing(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        return None

    wrapped = recorder._wrap("all_reduce", nothing)
    tensor = torch.ones(1)
    recorder.install(log)
    try:
        best = min(timeit.repeat(lambda: wrapped(tensor), number=20000, repeat=5))
    finally:
        recorder.uninstall()
    return best / 20000 * 1e6


def alone_costs(folder: str, call: Callable[[torch.Tensor], Any], arm: bool) -> dict[str, float]:
    """CPU microseconds per call in a Gloo group of one (no peer to wait for): without the
    recorder, with only its dispatcher kernels, which hand every call on (the c10d ones armed
    where ``arm``), and with the whole recorder (armed the same); best of 5 each."""
    from pytest_ddp.common.event_log import EventLog
    from pytest_ddp.record import backend_hook, recorder

    tensor = torch.ones(1)

    def per_call() -> float:
        def calls() -> None:
            for _ in range(2000):
                call(tensor)

        calls()
        best = min(timeit.repeat(calls, number=1, repeat=5, timer=time.thread_time))
        return best / 2000 * 1e6

    def hand_on(spec: Any, args: Any, submit: Callable[[], Any]) -> Any:
        return submit()

    costs = {"bare": per_call()}
    backend_hook.install(hand_on, hand_on, lambda tensor, wait: wait(), lambda: False)
    if arm:
        backend_hook.arm()
    costs["hook"] = per_call()
    backend_hook.uninstall()
    recorder.install(EventLog(os.path.join(folder, "alone.events")))
    recorder.start_test()
    if arm:
        backend_hook.arm()
    costs["recorder"] = per_call()
    recorder.uninstall()
    return costs


def alone(_: int, folder: str) -> None:
    """The group-of-one costs of each call, in a process of its own."""
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "alone.store"), 1), rank=0, world_size=1)
    costs = {name: alone_costs(folder, call, arm) for name, (call, arm) in CALLS.items()}
    with open(os.path.join(folder, "alone.json"), "w") as f:
        json.dump(costs, f)
    dist.destroy_process_group()


FSDP2 = "an FSDP2 training step"
FSDP2_LAYERS, FSDP2_WIDTH, FSDP2_BATCH = 4, 256, 8
FSDP2_WARM_UP = 10  # steps


def fsdp2_step() -> tuple[Callable[[torch.Tensor], None], torch.Tensor]:
    """A training step of a small model sharded with FSDP2 as its docs show (each layer, then
    the whole, on a CPU mesh), and its batch: the collectives it issues are the ones the
    functional all_reduce stands for (all-gathers, reduce-scatters, issued asynchronously)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(FSDP2_WIDTH, FSDP2_WIDTH) for _ in range(FSDP2_LAYERS)))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: torch.Tensor) -> None:
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()

    return step, torch.randn(FSDP2_BATCH, FSDP2_WIDTH)


def write_result(rank: int, folder: str, result: dict[str, Any]) -> None:
    """Rank 0 writes ``result.json`` for the parent once every rank is done; the group ends."""
    dist.barrier()
    if rank == 0:
        with open(os.path.join(folder, "result.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def count_calls(path: str, offset: int) -> int:
    """The call events written to the log at ``path`` past ``offset``."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().count(b'{"e":"call"')


def worker(rank: int, folder: str, calls: int, steps: int, rounds: int) -> None:
    from pytest_ddp.common.event_log import EventLog
    from pytest_ddp.record import backend_hook, recorder

    store = dist.FileStore(os.path.join(folder, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    tensor = torch.ones(1)
    log = EventLog(os.path.join(folder, f"rank{rank}.events"))
    result: dict[str, Any] = {"own": own_cost(log)}

    def measure(call: Callable[[torch.Tensor], Any], argument: torch.Tensor, each: int, arm: bool, warm_up: int) -> Any:
        """Each mode's (wall, CPU) per call in each round, ``each`` calls a round, after ``warm_up``."""
        loop(call, argument, warm_up)
        times: dict[str, list[tuple[float, float]]] = {"plain": [], "busy": [], "recorded": []}
        for _ in range(rounds):
            dist.barrier()
            times["plain"].append(loop(call, argument, each))
            dist.barrier()
            times["busy"].append(loop(call, argument, each, result["own"]))
            dist.barrier()
            recorder.install(log)
            recorder.start_test()
            if arm:  # before the timed calls: arming takes milliseconds, once per process
                backend_hook.arm()
            times["recorded"].append(loop(call, argument, each))
            recorder.uninstall()
        return times

    for name, (call, arm) in CALLS.items():
        result[name] = measure(call, tensor, calls // rounds, arm, WARM_UP)
    step, batch = fsdp2_step()
    recorded_before = os.path.getsize(log.path)
    result[FSDP2] = measure(step, batch, max(steps // rounds, 1), False, FSDP2_WARM_UP)
    result["fsdp2 events"] = count_calls(log.path, recorded_before) / (max(steps // rounds, 1) * rounds)
    write_result(rank, folder, result)


Rounds = Sequence[Sequence[float]]  # (wall, CPU) microseconds per call, one pair per round


def medians(rounds: Rounds) -> tuple[float, float]:
    """The median wall and CPU time per call over rounds."""
    return statistics.median(wall for wall, _ in rounds), statistics.median(cpu for _, cpu in rounds)


def added_medians(base: Rounds, other: Rounds) -> tuple[float, float]:
    """What ``other`` adds to ``base``: the median over rounds of each round's difference."""
    return (
        statistics.median(wall - base_wall for (wall, _), (base_wall, _) in zip(other, base)),
        statistics.median(cpu - base_cpu for (_, cpu), (_, base_cpu) in zip(other, base)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help=f"calls per mode, after {WARM_UP} warm-up calls")
    parser.add_argument("--steps", type=int, default=100, help="FSDP2 training steps per mode")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds the calls are split into")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        arguments = (folder, options.calls, options.steps, options.rounds)
        mp.start_processes(worker, args=arguments, nprocs=2, start_method="spawn")
        mp.start_processes(alone, args=(folder,), nprocs=1, start_method="spawn")
        with open(os.path.join(folder, "result.json")) as f:
            result = json.load(f)
        with open(os.path.join(folder, "alone.json")) as f:
            costs = json.load(f)
    print(
        f"1-float all_reduce, 2 Gloo ranks, {options.calls} calls per mode in {options.rounds} "
        f"alternating rounds, {os.cpu_count()} cores; us per call, wall (rank 0's thread CPU)"
    )
    for name in CALLS:
        plain, busy, recorded = (result[name][mode] for mode in ("plain", "busy", "recorded"))
        print(f"{name}:")
        print("  without recorder:  {:7.1f} ({:5.1f})".format(*medians(plain)))
        print("  with recorder:     {:7.1f} ({:5.1f})".format(*medians(recorded)))
        added, added_cpu = added_medians(plain, recorded)
        ratio = statistics.median(wall / plain_wall for (wall, _), (plain_wall, _) in zip(recorded, plain))
        print(f"  added:             {added:+7.1f} ({added_cpu:+5.1f})   ratio {ratio:.2f}   [goal <= 10 us]")
        print(
            "  control, a busy-wait of {:.1f} us instead: {:+.1f} ({:+.1f})".format(
                result["own"], *added_medians(plain, busy)
            )
        )
        each = costs[name]
        print(
            f"  in a group of one, CPU (best of 5): bare {each['bare']:.1f}, "
            f"backend hook {each['hook'] - each['bare']:+.1f}, whole recorder {each['recorder'] - each['bare']:+.1f}"
        )
    plain, recorded = result[FSDP2]["plain"], result[FSDP2]["recorded"]
    print(
        f"{FSDP2} ({FSDP2_LAYERS} layers {FSDP2_WIDTH}x{FSDP2_WIDTH}, batch {FSDP2_BATCH}, "
        f"{result['fsdp2 events']:.0f} collectives recorded per step), {options.steps} steps per mode; ms per step:"
    )
    print("  without recorder:  {:7.2f} ({:5.2f})".format(*(us / 1000 for us in medians(plain))))
    print("  with recorder:     {:7.2f} ({:5.2f})".format(*(us / 1000 for us in medians(recorded))))
    added, added_cpu = added_medians(plain, recorded)
    ratio = statistics.median(wall / plain_wall for (wall, _), (plain_wall, _) in zip(recorded, plain))
    print(f"  added:             {added / 1000:+7.2f} ({added_cpu / 1000:+5.2f})   ratio {ratio:.2f}")
    print(f"recorder's own cost, its wrapper around a no-op (real log), best of 5: {result['own']:.1f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())

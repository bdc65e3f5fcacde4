"""Timeouts that are a slow rank, not a deadlock: the verdict should name the slow rank and where
it is, and call it a timeout."""

from __future__ import annotations

from benchmarks.field.case import Case

CASES = [
    Case(
        name="rank0_stalls_in_dataloader",
        url="https://github.com/pytorch/pytorch/issues/87995",
        summary="multi-node training: rank 0 is stuck in the dataloader (queue.get) and all other "
        "ranks wait in all_reduce",
        world_size=2,
        body="""\
def next_batch():  # rank 0's loader workers stall
    if rank == 0:
        time.sleep(60)  # <- culprit line
    return torch.ones(2)


for step in range(2):
    x = next_batch()
    dist.all_reduce(x)
""",
        twin="""\
def next_batch():  # num_workers=0: no stall
    return torch.ones(2)


for step in range(2):
    x = next_batch()
    dist.all_reduce(x)
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="rank0_slow_checkpoint_save",
        url="https://github.com/instructlab/training/pull/566",
        summary="non-rank-0 processes go on and wait for rank 0 in a collective while rank 0 is "
        "saving artifacts, and the collective times out",
        world_size=3,
        body="""\
def save_artifacts():
    if rank == 0:
        time.sleep(60)  # <- culprit line


save_artifacts()
dist.all_reduce(torch.ones(1))
""",
        twin="""\
def save_artifacts():
    pass


save_artifacts()
dist.all_reduce(torch.ones(1))
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="local_rank0_downloads_checkpoint",
        url="https://github.com/mosaicml/composer/pull/2071",
        summary="the other ranks time out on the barrier while local rank 0 downloads a monolithic "
        "checkpoint for a long time",
        world_size=2,
        body="""\
def download_checkpoint():
    if rank == 0:
        time.sleep(60)  # <- culprit line


download_checkpoint()
dist.barrier()
""",
        twin="""\
def download_checkpoint():
    pass


download_checkpoint()
dist.barrier()
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="rank0_builds_dataset_cache_first",
        url="https://github.com/JIA-Lab-research/LongLoRA/issues/45",
        summary="while rank 0 prepares the dataset (load_dataset, map(tokenize_fn)) for more than 30 "
        "minutes, the ranks waiting in the barrier time out",
        world_size=3,
        body="""\
def prepare_dataset():  # load_dataset + dataset.map(tokenize_fn, num_proc=...)
    if rank == 0:
        time.sleep(60)  # <- culprit line


if rank > 0:
    dist.barrier()  # wait for rank 0 to write the cache
prepare_dataset()
if rank == 0:
    dist.barrier()
""",
        twin="""\
def prepare_dataset():  # the tokenized dataset prepared by a separate script, loaded from cache
    pass


if rank > 0:
    dist.barrier()
prepare_dataset()
if rank == 0:
    dist.barrier()
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="tokenize_on_main_process_first",
        url="https://github.com/huggingface/trl/issues/1519",
        summary="DPOTrainer tokenization fails after 30 minutes: main_process_first() keeps the other "
        "processes in a barrier with the default timeout while the main process tokenizes",
        world_size=2,
        body="""\
import contextlib


@contextlib.contextmanager
def main_process_first():  # accelerate's: the others wait in a barrier
    if rank != 0:
        dist.barrier()
    yield
    if rank == 0:
        dist.barrier()


def tokenize_row(row):
    if rank == 0:
        time.sleep(60)  # <- culprit line
    return row


with main_process_first():
    dataset = [tokenize_row({"prompt": "hi", "chosen": "a", "rejected": "b"})]
""",
        twin="""\
import contextlib


@contextlib.contextmanager
def main_process_first():
    if rank != 0:
        dist.barrier()
    yield
    if rank == 0:
        dist.barrier()


def tokenize_row(row):  # a dataset small enough to tokenize within ddp_timeout
    return row


with main_process_first():
    dataset = [tokenize_row({"prompt": "hi", "chosen": "a", "rejected": "b"})]
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="rank0_initializes_full_model_alone",
        url="https://github.com/foundation-model-stack/fms-fsdp/pull/19",
        summary="in low_cpu_mode rank 0 alone creates and initializes a 70b model for more than 30 "
        "minutes while the other ranks wait for its weights",
        world_size=3,
        body="""\
def build_model():
    model = nn.Linear(4, 4)
    if rank == 0:  # low_cpu_fsdp: only rank 0 materializes the weights
        time.sleep(60)  # <- culprit line
    return model


model = build_model()
for p in model.parameters():
    dist.broadcast(p.data, src=0)  # sync_module_states
""",
        twin="""\
def build_model():
    return nn.Linear(4, 4)


model = build_model()
for p in model.parameters():
    dist.broadcast(p.data, src=0)
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="tokenizing_prompts_on_rank0",
        url="https://github.com/axolotl-ai-cloud/axolotl/issues/2684",
        summary="distributed timeout during dataset tokenization: rank 1 times out after 1800000 ms "
        "waiting while rank 0 is at 92% of 'Tokenizing Prompts'",
        world_size=2,
        body="""\
def tokenize_prompts():
    time.sleep(60)  # <- culprit line
    return "last_run_prepared/"


path = [tokenize_prompts() if rank == 0 else None]
dist.broadcast_object_list(path, src=0)  # the prepared dataset's path, for the other ranks
""",
        twin="""\
def tokenize_prompts():  # the dataset preprocessed beforehand
    return "last_run_prepared/"


path = [tokenize_prompts() if rank == 0 else None]
dist.broadcast_object_list(path, src=0)
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="worker_slow_to_start_on_cold_volume",
        url="https://github.com/pytorch/pytorch/issues/9696",
        summary="init_process_group hangs when launched on an AWS volume that is not pre-warmed: one "
        "worker is slow to start while the others wait in the handshake",
        world_size=2,
        init=False,
        body="""\
def load_from_volume():  # the first read of a cold volume on this worker
    if rank == 1:
        time.sleep(60)  # <- culprit line


load_from_volume()
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
""",
        twin="""\
def load_from_volume():  # the volume pre-warmed
    pass


load_from_volume()
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
""",
        kind="timeout",
        culprits=(1,),
        op=None,
    ),
    Case(
        name="rank0_long_operation_trips_watchdog",
        url="https://github.com/sony/nnabla-ext-cuda/pull/271",
        summary="when the rank 0 node performs a long operation, the watchdog raises on the other "
        "ranks waiting for it, which the user did not expect",
        world_size=2,
        body="""\
def on_epoch_end():  # rank 0 writes the monitor's images and the checkpoint
    if rank == 0:
        time.sleep(60)  # <- culprit line


for epoch in range(2):
    dist.all_reduce(torch.ones(2))
    on_epoch_end()
""",
        twin="""\
def on_epoch_end():
    pass


for epoch in range(2):
    dist.all_reduce(torch.ones(2))
    on_epoch_end()
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="validation_on_rank0_outlasts_collective_timeout",
        url="https://github.com/Synthefy/synthefy-nori/pull/86",
        summary="validation runs on rank 0 only; the other ranks block in the post-eval broadcast of the "
        "stop flag for the whole eval, and an eval longer than the collective timeout aborts the run; "
        "the fix raises the timeout",
        world_size=2,
        body="""\
def run_validation():  # Trainer._run_validation: 30 datasets, on rank 0 only
    time.sleep(60)  # <- culprit line


for step in range(2):
    dist.all_reduce(torch.ones(2))  # the training steps
if rank == 0:
    run_validation()
stop_tensor = torch.zeros(1)
dist.broadcast(stop_tensor, src=0)
""",
        twin="""\
def run_validation():  # the eval fits in the collective timeout
    time.sleep(0.1)


for step in range(2):
    dist.all_reduce(torch.ones(2))
if rank == 0:
    run_validation()
stop_tensor = torch.zeros(1)
dist.broadcast(stop_tensor, src=0)
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="tokenization_on_main_process_past_timeout",
        url="https://github.com/hiyouga/LlamaFactory/issues/2424",
        summary="tokenizing a dataset of three million rows on the main process first takes more than "
        "the 30-minute collective timeout, and the other processes, waiting for its cache, fail",
        world_size=3,
        body="""\
from contextlib import contextmanager


@contextmanager
def main_process_first():  # training_args.main_process_first(desc="pre-process dataset")
    if rank != 0:
        dist.barrier()  # the others wait for the main process's cache
    yield
    if rank == 0:
        dist.barrier()


def tokenize_dataset():  # dataset.map(preprocess_func, batched=True): from the cache off rank 0
    if rank == 0:
        time.sleep(60)  # <- culprit line


with main_process_first():
    tokenize_dataset()
""",
        twin="""\
from contextlib import contextmanager


@contextmanager
def main_process_first():
    if rank != 0:
        dist.barrier()
    yield
    if rank == 0:
        dist.barrier()


def tokenize_dataset():  # a dataset the main process tokenizes within the timeout
    if rank == 0:
        time.sleep(0.1)


with main_process_first():
    tokenize_dataset()
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="rank0_eigendecomposes_before_final_all_reduce",
        url="https://github.com/EleutherAI/bergson/pull/444",
        summary="after the symmetric gradient loop rank 0 alone reduces and eigendecomposes the Grams "
        "and writes them to storage while every other rank waits in all_reduce(total_processed); not "
        "a deadlock, but past the collective timeout the watchdog kills the run",
        world_size=2,
        body="""\
def process_autocorrelation_matrices():  # reduce, eigendecompose, write to shared storage
    time.sleep(60)  # <- culprit line


total_processed = torch.tensor([64.0])
for batch in range(2):
    dist.all_reduce(torch.ones(2))  # the gradient loop: symmetric
if rank == 0:  # collector.teardown()
    process_autocorrelation_matrices()
dist.all_reduce(total_processed)
""",
        twin="""\
def process_autocorrelation_matrices():  # a dataset small enough to finish within the timeout
    time.sleep(0.1)


total_processed = torch.tensor([64.0])
for batch in range(2):
    dist.all_reduce(torch.ones(2))
if rank == 0:
    process_autocorrelation_matrices()
dist.all_reduce(total_processed)
""",
        kind="timeout",
        culprits=(0,),
        op=None,
    ),
    Case(
        name="heavy_shard_ranks_outlast_load_barrier",
        url="https://github.com/sgl-project/sglang/pull/39128",
        summary="the monitored_barrier after model loading has a fixed timeout; the first and the last "
        "TP rank hold the heavier shards and take longer in post_load_weights, so the barrier times "
        "out and kills every rank (the fix raises the timeout)",
        world_size=3,
        body="""\
from datetime import timedelta


def post_load_weights():  # scale layout transforms on this rank's shards
    if rank in (0, world_size - 1):  # the first and the last rank hold the heavier shards
        time.sleep(60)  # <- culprit line


post_load_weights()
dist.monitored_barrier(timeout=timedelta(seconds=5))  # dist_barrier_after_load
""",
        twin="""\
from datetime import timedelta


def post_load_weights():  # loading finishes well within the raised timeout
    if rank in (0, world_size - 1):
        time.sleep(0.2)


post_load_weights()
dist.monitored_barrier(timeout=timedelta(seconds=15))
""",
        kind="timeout",
        culprits=(0, 2),
        op=None,
    ),
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
    ),
]

"""HuggingFace transformers inside a ddp test: a tiny GPT-2 built from its config (no download),
trained by ``Trainer`` on CPU, as the Trainer docs write it.  Trainer finds torchrun's environment
and the default group, and wraps the model in DDP on it.  It keeps its state in accelerate, whose
singletons a warm rank keeps into the next test: the ``reset_accelerate`` fixture resets them."""

from pathlib import Path

import pytest
import torch

import pytest_ddp

transformers = pytest.importorskip("transformers")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402


@pytest.fixture
def reset_accelerate():
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def tiny_gpt2(width=16):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=width, vocab_size=32, n_positions=16)
    return transformers.GPT2LMHeadModel(config)


def dataset():
    tokens = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": t, "labels": t} for t in tokens]


def trainer(output_dir, max_steps=2, width=16):
    args = transformers.TrainingArguments(
        output_dir=str(output_dir), use_cpu=True, per_device_train_batch_size=2, max_steps=max_steps,
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )
    return transformers.Trainer(model=tiny_gpt2(width), args=args, train_dataset=dataset())


@pytest.mark.ddp(world_size=2)
def test_trainer_trains_on_the_existing_group(rank, tmp_path, reset_accelerate):
    world = torch.distributed.group.WORLD
    t = trainer(tmp_path)
    assert (t.args.process_index, t.args.world_size) == (rank, 2)
    t.train()

    assert t.state.global_step == 2
    assert torch.distributed.group.WORLD is world  # not re-initialised, not destroyed
    weight = t.model.lm_head.weight.detach()
    weights = [torch.empty_like(weight) for _ in range(2)]
    torch.distributed.all_gather(weights, weight)
    assert torch.equal(weights[0], weights[1])  # DDP kept the replicas equal


def train(rank, tmp_path, max_steps=(2, 2), width=(16, 16)):
    try:
        trainer(tmp_path, max_steps[rank], width[rank]).train()  # the Trainer's step
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def line_of(text):
    """``test_transformers.py:N``, the line of this file that holds ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return f"test_transformers.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def test_a_rank_that_skips_a_step_is_diagnosed(tmp_path):
    """Rank 1 stops after one step: its end-of-training gather (the FLOs, a float) meets rank 0's
    gather of the next step's token count (an int) as the same all_gather."""
    result = pytest_ddp.run(train, world_size=2, args=(tmp_path,), kwargs={"max_steps": (2, 1)}, timeout=60)
    # Seen while both wait (deadlock), or once Gloo has failed a rank on the sizes, 8 bytes against 4.
    assert result.outcome in ("deadlock", "failed") and result.diagnosis.kind == "mismatch", result.diagnosis.text
    assert result.diagnosis.collective == "all_gather"
    # Gloo may let the two gathers complete (rank 0 then goes on to its step's all_reduces).
    calls = [next(c for c in r.collectives if (c.op, c.seq) == ("all_gather", 7)) for r in result.ranks]
    assert [c.dtypes for c in calls] == [["int64"], ["float32"]]
    assert calls[0].caller.startswith("accelerate/") and calls[1].caller.startswith("transformers/")
    assert all(c.site.endswith(line_of("# the Trainer's step")) for c in calls)  # the user's line


def test_a_rank_with_another_model_size_is_diagnosed(tmp_path):
    """DDP's constructor compares the parameters' shapes: rank 1 raises, rank 0 waits in the broadcast after."""
    result = pytest_ddp.run(train, world_size=2, args=(tmp_path,), kwargs={"width": (16, 32)}, timeout=60)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "rank_exited"), result.diagnosis.text
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([1], [0])
    assert "sizes [32, 32] appears not to match" in result.ranks[1].exception
    waiting = result.ranks[0].collectives[-1]
    assert (waiting.op, waiting.state) == ("broadcast", "running")
    assert waiting.site.endswith(line_of("# the Trainer's step"))

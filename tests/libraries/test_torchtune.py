"""torchtune on CPU and Gloo, as its distributed recipes write a step: a tiny Llama 3 from the
model builder (no download), each decoder layer and the root sharded by ``training.shard_model``
(FSDP2), then forward, loss, ``backward``, ``optimizer.step()``."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pytest_ddp

training = pytest.importorskip("torchtune.training")
from torchtune.models.llama3 import llama3  # noqa: E402
from torchtune.modules import TransformerSelfAttentionLayer  # noqa: E402

VOCAB = 64


def tiny_llama(num_layers=2):
    torch.manual_seed(0)  # the same full weights on every rank
    return llama3(vocab_size=VOCAB, num_layers=num_layers, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=32)


def tokens(rank):
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(rank))


def next_token_loss(model, batch):
    logits = model(batch)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def train(rank, steps=(2, 2), num_layers=(2, 2)):
    """The recipe's sharding and steps; returns the sharded model."""
    model = tiny_llama(num_layers[rank])
    layers = [lambda name, module: isinstance(module, TransformerSelfAttentionLayer)]  # the recipe's condition
    training.shard_model(model, layers, cpu_offload=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps[rank]):
        loss = next_token_loss(model, tokens(rank))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.mark.ddp(world_size=2)
def test_sharded_llama_trains_as_the_whole_model(rank):
    sharded = train(rank)

    # Reference: the whole model, AdamW on the mean of both ranks' gradients (FSDP2 averages them on Gloo).
    reference = tiny_llama()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for _ in range(2):
        (sum(next_token_loss(reference, tokens(r)) for r in range(2)) / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(sharded.get_parameter(name).full_tensor(), p)
    assert dist.get_world_size() == 2


def line_of(text):
    """``test_torchtune.py:N``, the line of this file that holds ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return f"test_torchtune.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def test_a_rank_that_stops_a_step_early_is_diagnosed():
    """Rank 1 returns after one step; rank 0 waits in the next step's first gather (the root's
    parameters, gathered before the forward), at the user's forward line."""
    result = pytest_ddp.run(train, world_size=2, kwargs={"steps": (2, 1)}, timeout=60)
    assert (result.outcome, result.diagnosis.kind) == ("deadlock", "partial"), result.diagnosis.text
    assert (result.diagnosis.culprits, result.diagnosis.waiting) == ([1], [0])
    waiting = result.ranks[0].collectives[-1]
    assert (waiting.op, waiting.state) == ("all_gather_single", "running")
    assert waiting.site.endswith(line_of("logits = model(batch)"))
    assert line_of("logits = model(batch)") in result.diagnosis.text.splitlines()[0]

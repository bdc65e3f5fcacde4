"""A real 64-rank hang, diagnosed and reported on one screen.  Slow (about 15 s on two cores, most
of it starting 64 ranks): marked ``slow``, left out of the default run; ``pytest -m slow`` runs it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import pytest_ddp


def skips_the_last_all_reduce(rank: int) -> None:
    """Twelve all_reduces, of which rank 63 skips the twelfth."""
    tensor = torch.ones(4)
    for step in range(12):
        if step < 11 or rank != 63:
            dist.all_reduce(tensor)


@pytest.mark.slow
def test_a_64_rank_hang_names_the_rank_that_skipped_and_fits_a_screen() -> None:
    result = pytest_ddp.run(skips_the_last_all_reduce, world_size=64, timeout=120)
    assert result.outcome == "deadlock"
    assert result.diagnosis is not None
    assert (result.diagnosis.kind, result.diagnosis.culprits) == ("partial", [63])
    text = result.diagnosis.text
    lines = text.splitlines()
    assert lines[0].startswith("rank 63 never called all_reduce #12 (returned from its test)")
    assert "[ddp deadlock, partial, " in lines[0]
    assert "(minority: rank 63)" in text and "the ranks part ways at all_reduce #12" in text
    assert any(line.startswith("rank 63: finished (passed); last call all_reduce #11") for line in lines)
    # Every stopped rank waits on the same line; their stacks may differ only in C++ frames
    # Python does not see, so they come as one section or a few.
    stacks = [line for line in lines if line.endswith("Python stacks when stopped " + "-" * 20)]
    assert 1 <= len(stacks) <= 3
    assert len(lines) <= 60 + 10 * (len(stacks) - 1), text
    assert [r.rank for r in result.ranks] == list(range(64))

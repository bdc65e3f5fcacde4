"""torchelastic's ``@record``: a rank's exception goes to the error file
torchrun names in ``TORCHELASTIC_ERROR_FILE``, then propagates as usual."""

import json

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(rank):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    if rank == 1:
        raise ValueError(f"bad sum {t.item()}")
    return t.item()


@pytest.mark.ddp(world_size=2)
def test_record_writes_the_error_file_and_reraises(rank, tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    if rank == 0:
        assert main(rank) == 1.0
        assert not error_file.exists()
    else:
        with pytest.raises(ValueError, match=r"bad sum 1\.0"):
            main(rank)
        message = json.loads(error_file.read_text())["message"]
        assert "ValueError: bad sum 1.0" in message["message"]

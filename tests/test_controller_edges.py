"""The controller's edges: the ranks' environment and shared directory, teardown
errors of stopped groups, durations, headlines and stderr tails."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from pathlib import Path


def test_ranks_get_torchruns_environment(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_env(rank):
            env = os.environ
            assert dist.is_torchelastic_launched()
            expected = {
                "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank),
                "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "2",
                "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            }
            assert {k: env.get(k) for k in expected} == expected
            run_ids = [None, None]
            dist.all_gather_object(run_ids, env["TORCHELASTIC_RUN_ID"])
            assert run_ids[0] == run_ids[1] != ""
        """
    )
    result.assert_outcomes(passed=1)


def test_ddp_shared_path_is_one_directory_for_all_ranks_of_a_test(ddp_pytester) -> None:
    basetemp = ddp_pytester.pytester.path / "basetemp"
    result = ddp_pytester.run(
        """
        import torch.distributed.checkpoint as dcp

        seen = []

        @pytest.mark.ddp(world_size=2)
        def test_files(rank, ddp_shared_path):
            if rank == 0:
                (ddp_shared_path / "note.txt").write_text("from rank 0")
            dist.barrier()
            assert (ddp_shared_path / "note.txt").read_text() == "from rank 0"
            paths = [None, None]
            dist.all_gather_object(paths, str(ddp_shared_path))
            assert paths[0] == paths[1]
            seen.append(ddp_shared_path)
            if rank == 0:
                open("shared.txt", "w").write(str(ddp_shared_path))

        @pytest.mark.ddp(world_size=2)
        def test_checkpoint_round_trip(rank, ddp_shared_path):
            state = {"w": torch.full((4,), float(rank + 1)), "step": torch.tensor(7)}
            dcp.save(state, checkpoint_id=str(ddp_shared_path / "ckpt"))
            loaded = {"w": torch.zeros(4), "step": torch.tensor(0)}
            dcp.load(loaded, checkpoint_id=str(ddp_shared_path / "ckpt"))
            assert int(loaded["step"]) == 7
            # Replicated tensors are saved once, by rank 0: every rank reads rank 0's values.
            assert torch.equal(loaded["w"], torch.full((4,), 1.0))
            seen.append(ddp_shared_path)
            assert seen[0] != seen[1], "each test gets its own directory"
        """,
        f"--basetemp={basetemp}",
    )
    result.assert_outcomes(passed=2)
    shared = Path((ddp_pytester.pytester.path / "shared.txt").read_text())
    # In the session's basetemp, kept after it like tmp_path (pytest's rotation removes it).
    assert shared.parent == basetemp / "ddp_shared"
    assert (shared / "note.txt").read_text() == "from rank 0"


def test_ddp_shared_path_outside_a_ddp_test_says_so(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        def test_plain(ddp_shared_path):
            pass
        """
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*'ddp_shared_path' fixture is only available in tests marked @pytest.mark.ddp*"])

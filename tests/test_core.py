"""The core: a marked test runs on N real ranks and reports as one pytest test."""

from __future__ import annotations

import importlib.metadata
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SUM_TEST = """
@pytest.mark.ddp(world_size={ws})
def test_all_reduce(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert t.item() == sum(range(world_size))
"""


def test_plugin_loads_through_its_entry_point() -> None:
    entry_points = importlib.metadata.entry_points(group="pytest11")
    assert any(ep.name == "ddp" and ep.value == "pytest_ddp.plugin" for ep in entry_points)


@pytest.mark.parametrize("ws", [1, 2, 4, 8])
def test_all_reduce_passes_on_n_ranks(ddp_pytester, ws) -> None:
    result = ddp_pytester.run(SUM_TEST.format(ws=ws), "--strict-markers")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*ddp: 1 test on 1 rank group started*"])


def test_a_test_its_marks_skip_starts_no_rank(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.skip(reason="not today")
        @pytest.mark.ddp(world_size=2)
        def test_skipped():
            raise AssertionError("ran")

        @pytest.mark.skipif(True, reason="never here")
        @pytest.mark.ddp(world_size=2)
        def test_skipped_if():
            raise AssertionError("ran")
        """,
        "-rs",
    )
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]1[]] test_it.py:*: not today", "SKIPPED [[]1[]] test_it.py:*: never here"]
    )
    result.stdout.no_fnmatch_line("*rank group* started*")


def test_world_size_list_makes_one_test_per_size(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=[1, 2])
        def test_size(world_size):
            assert dist.get_world_size() == world_size
        """,
        "-v",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_size?ws1? PASSED*", "*test_size?ws2? PASSED*"])


def test_fixtures_and_torchrun_environment_per_rank(ddp_pytester) -> None:
    ddp_pytester.pytester.makeconftest(
        """
        import pytest

        @pytest.fixture
        def doubled(rank):
            return 2 * rank
        """
    )
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        @pytest.mark.parametrize("n", [3, 5])
        def test_env(rank, world_size, device, process_group, doubled, n, tmp_path, monkeypatch):
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
            assert {k: env.get(k) for k in expected} == expected and int(env["MASTER_PORT"]) > 0
            run_ids = [None, None]
            dist.all_gather_object(run_ids, env["TORCHELASTIC_RUN_ID"])
            assert run_ids[0] == run_ids[1] != ""
            assert str(device) == "cpu" and doubled == 2 * rank
            assert process_group is dist.group.WORLD and dist.get_rank() == rank
            monkeypatch.setenv("PER_TEST", str(n))
            (tmp_path / "mine").write_text(str(rank))
            # Each rank has its own tmp_path: gather them and compare.
            paths = [None, None]
            dist.all_gather_object(paths, str(tmp_path))
            assert paths[0] != paths[1]
        """
    )
    result.assert_outcomes(passed=2)


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


def test_only_ranks_run_the_test_body_and_fixtures(ddp_pytester) -> None:
    """The controller runs neither the test nor its fixtures: rank fixtures outside a rank fail."""
    result = ddp_pytester.run(
        """
        def test_plain(rank):
            pass

        def test_plain_shared(ddp_shared_path):
            pass
        """
    )
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*'rank' fixture is only available in tests marked @pytest.mark.ddp*",
            "*'ddp_shared_path' fixture is only available in tests marked @pytest.mark.ddp*",
        ]
    )


def test_failure_is_labelled_per_rank_with_sections_and_junit(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_fails_on_rank_1(rank):
            print(f"out of rank {rank}")
            print(f"err of rank {rank}", file=sys.stderr)
            assert rank != 1, "rank 1 disagrees"

        @pytest.mark.ddp(world_size=2)
        def test_after():
            pass
        """,
        "-x",
        "--junitxml=junit.xml",
    )
    result.assert_outcomes(failed=1)  # -x stopped the session before test_after
    result.stdout.fnmatch_lines(
        [
            "*rank 1: failed*",
            "*AssertionError: rank 1 disagrees*",
            "*Captured stdout (rank 0)*",
            "out of rank 0",
            "*Captured stderr (rank 1)*",
            "err of rank 1",
        ]
    )
    junit = ET.parse(ddp_pytester.pytester.path / "junit.xml").getroot()
    case = junit.find(".//testcase[@name='test_fails_on_rank_1']")
    assert case is not None and case.find("failure") is not None


def test_skip_on_all_ranks_skips_and_xfail_works(ddp_pytester) -> None:
    result = ddp_pytester.run(
        """
        @pytest.mark.ddp(world_size=2)
        def test_skipped():
            pytest.skip("not today")

        @pytest.mark.ddp(world_size=2)
        @pytest.mark.xfail(reason="known bug", strict=True)
        def test_xfail(rank):
            assert rank == 0

        @pytest.mark.ddp(world_size=2)
        @pytest.mark.xfail(reason="fixed now")
        def test_xpass():
            pass
        """,
        "-rsxX",
    )
    result.assert_outcomes(skipped=1, xfailed=1, xpassed=1)
    result.stdout.fnmatch_lines(["*not today*"])


def test_last_failed_reruns_only_the_failed_ddp_test(ddp_pytester) -> None:
    body = """
        @pytest.mark.ddp(world_size=2)
        def test_good():
            pass

        @pytest.mark.ddp(world_size=2)
        def test_bad(rank):
            assert os.environ.get("FIXED") or rank == 0
        """
    ddp_pytester.write(body)
    pytester = ddp_pytester.pytester
    pytester.runpytest_inprocess().assert_outcomes(passed=1, failed=1)
    rerun = pytester.runpytest_inprocess("--lf", "-v")
    rerun.assert_outcomes(failed=1)
    rerun.stdout.fnmatch_lines(["*test_bad FAILED*"])
    rerun.stdout.no_fnmatch_line("*test_good*")

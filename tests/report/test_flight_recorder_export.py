"""``--ddp-report-dir``'s Flight Recorder dumps (``<test>.fr/``), read by torch's own analyser.

Real hangs on Gloo and (where one can run) on an MPI world, one inner session each, run in
this process: for each, torch's analyser (``torchfrtrace``'s ``main``, called here: a subprocess
would import torch again, 2 s of CPU a run) must name the op, the collective's number and the
ranks that pytest-ddp's verdict names.  Then the conversion on
hand-made states, and the analyser's matching run in this process on dumps read in an order
the test chooses.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.flight_recorder.components import types as fr_types
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.fr_trace import main as torchfrtrace

from conftest import ModuleShared, Session, session_in_process
from pytest_ddp.common.ops import COLLECTIVES, op
from pytest_ddp.diagnose.state import Call, RankState
from pytest_ddp.groups.mpi_group import mpi_unavailable
from pytest_ddp.report import flight_recorder
from pytest_ddp.report.writable import file_name

HANGS = """
@pytest.mark.ddp(world_size=3, timeout=60)
def test_partial(rank):
    dist.all_reduce(torch.ones(4))
    if rank != 2:
        dist.all_reduce(torch.ones(4))


@pytest.mark.ddp(world_size=3, timeout=60)
def test_mismatch(rank):
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(5 if rank == 2 else 4))


@pytest.mark.ddp(world_size=3, timeout=60)
def test_died_in_group(rank):
    group = dist.new_group([1, 2])
    dist.barrier()
    if rank == 2:
        os._exit(3)
    if rank == 1:
        dist.broadcast(torch.ones(2), src=1, group=group)
"""


MPI_HANGS = """
@pytest.mark.ddp(world_size=3, backend="mpi", timeout=60)
def test_partial(comm, rank):
    out = torch.zeros(4)
    comm.Allreduce(torch.ones(4), out)
    if rank != 2:
        comm.Allreduce(torch.ones(4), out)


@pytest.mark.ddp(world_size=3, backend="mpi", timeout=60)
def test_mismatch(comm, rank):
    comm.Bcast(torch.ones(5 if rank == 2 else 4), root=0)
"""
NO_MPI = mpi_unavailable(None)


@pytest.fixture
def sessions(module_shared: ModuleShared, pytester: pytest.Pytester) -> dict[str, Path]:
    """The hangs, on Gloo and (where it can run) on MPI, each run once (in this process, by the
    first test that needs them) with --ddp-report-dir; each one's report folder."""

    def run() -> dict[str, Path]:
        runs = {"gloo": (HANGS, 3)}
        if NO_MPI is None:
            runs["mpi"] = (MPI_HANGS, 2)
        for name, (source, failed) in runs.items():
            session_in_process(pytester, name, Session.of(source, "--ddp-report-dir=reports"), 1).assert_outcomes(
                failed=failed
            )
        return {name: pytester.path / name / "reports" for name in runs}

    return module_shared.once("sessions", run)


@pytest.fixture
def reports(sessions: dict[str, Path]) -> Path:
    return sessions["gloo"]


def verdict_and_analysis(reports: Path, test: str) -> tuple[dict[str, Any], fr_types.Collective, str]:
    """pytest-ddp's JSON report of ``test``, the first collective torchfrtrace found at fault in
    its ``.fr`` folder, and what torchfrtrace logged."""
    name = file_name(f"test_it.py::{test}")
    report = json.loads((reports / f"{name}.json").read_text())
    folder = reports / f"{name}.fr"
    assert sorted(p.name for p in folder.iterdir()) == ["rank_0", "rank_1", "rank_2"]
    database = reports / f"{name}.db"
    log, analyser_logger = io.StringIO(), logging.getLogger("Flight Recorder")
    handler = logging.StreamHandler(log)
    analyser_logger.addHandler(handler)
    try:
        torchfrtrace([str(folder), "-o", str(database)])
    finally:
        analyser_logger.removeHandler(handler)
    _, db = pickle.loads(database.read_bytes())
    failing = [c for c in db.collectives if not c.pass_check or c.missing_ranks]
    assert failing, log.getvalue()
    return report, failing[0], log.getvalue()


def test_the_analyser_names_the_rank_that_skipped_a_collective(reports: Path) -> None:
    report, found, log = verdict_and_analysis(reports, "test_partial")
    assert (report["kind"], report["culprits"], report["call"]) == ("partial", [2], "all_reduce #2")
    assert (found.collective_name, found.collective_seq_id, found.group_id) == ("gloo:all_reduce", 2, "WORLD")
    assert found.missing_ranks == set(report["culprits"])
    assert "missing ranks: {2}" in log


def test_the_analyser_names_the_sides_of_a_mismatch(reports: Path) -> None:
    report, found, _ = verdict_and_analysis(reports, "test_mismatch")
    assert (report["kind"], report["culprits"], report["call"]) == ("mismatch", [2], "all_reduce #2")
    assert (found.collective_name, found.collective_seq_id) == ("gloo:all_reduce", 2)
    # The analyser compares every rank with the first dump it reads (in the folder's order):
    # it names rank 2, or ranks 0 and 1 when it read rank 2's first.
    named = set(found.mismatch_collectives)
    assert {frozenset(named), frozenset({0, 1, 2} - named)} == {frozenset({2}), frozenset({0, 1})}
    assert {m.type_of_mismatch.state for m in found.mismatch_collectives.values()} == {
        fr_types.MatchState.SIZE_OR_SYNTAX_MISMATCH
    }


def test_the_analyser_names_a_rank_that_died_before_a_collective_of_its_group(reports: Path) -> None:
    report, found, _ = verdict_and_analysis(reports, "test_died_in_group")
    assert (report["kind"], report["culprits"], report["collective"]) == ("rank_exited", [2], "broadcast")
    assert (found.collective_name, found.group_id, found.expected_ranks) == ("gloo:broadcast", "1", {1, 2})
    assert found.missing_ranks == {2}
    dead = pickle.loads((reports / f"{file_name('test_it.py::test_died_in_group')}.fr" / "rank_2").read_bytes())
    assert [e["profiling_name"] for e in dead["entries"]] == ["gloo:barrier"]
    assert dead["pg_config"]["1"]["ranks"] == "[1, 2]"


@pytest.mark.skipif(NO_MPI is not None, reason=str(NO_MPI))
def test_the_analyser_names_the_same_ranks_on_an_mpi_world(sessions: dict[str, Path]) -> None:
    report, found, _ = verdict_and_analysis(sessions["mpi"], "test_partial")
    assert (report["kind"], report["culprits"], report["call"]) == ("partial", [2], "Allreduce #2")
    assert (found.collective_name, found.collective_seq_id, found.missing_ranks) == ("nccl:all_reduce", 2, {2})
    report, found, _ = verdict_and_analysis(sessions["mpi"], "test_mismatch")
    assert (report["kind"], report["culprits"], report["call"]) == ("mismatch", [2], "Bcast #1")
    assert (found.collective_name, found.collective_seq_id) == ("nccl:broadcast", 1)
    named = set(found.mismatch_collectives)
    assert {frozenset(named), frozenset({0, 1, 2} - named)} == {frozenset({2}), frozenset({0, 1})}


# -- the conversion, on hand-made states ------------------------------------------------------


def call(index: int, op: str, seq: int, shapes: list[list[int]] | None = None, **fields: Any) -> Call:
    fields.setdefault("group_ranks", (0, 1, 2))
    return Call(
        index=index,
        op=op,
        group=fields.pop("group", "WORLD"),
        seq=seq,
        site=f"train.py:{10 + index}",
        enter=100.0 + index,
        exit=fields.pop("exit", 100.5 + index),
        shapes=[[4]] if shapes is None else shapes,
        dtypes=["float32"] if shapes is None else ["float32"] * len(shapes),
        **fields,
    )


def partial_states() -> list[RankState]:
    """Ranks 0 and 1 wait in all_reduce #2, which rank 2 never called; a send and a receive
    and the making of the group between them."""
    init = call(0, "init_process_group", 0, [])
    first = call(1, "all_reduce", 1)
    return [
        RankState(0, calls=[init, first, call(2, "send", 1, peer=1), call(3, "all_reduce", 2, exit=None)]),
        RankState(1, calls=[init, first, call(2, "recv", 1, peer=0), call(3, "all_reduce", 2, exit=None)]),
        RankState(2, calls=[init, first]),
    ]


def load(folder: Path) -> dict[int, dict[str, Any]]:
    return {int(p.name.removeprefix("rank_")): pickle.loads(p.read_bytes()) for p in folder.iterdir()}


def test_a_dump_per_rank_holds_its_collectives_in_the_format_torch_writes(tmp_path: Path) -> None:
    folder = flight_recorder.write(tmp_path, "test_x.py::test_hang", partial_states(), "gloo", 30)
    assert folder == tmp_path / f"{file_name('test_x.py::test_hang')}.fr"
    dumps = load(folder)
    assert sorted(dumps) == [0, 1, 2]
    assert [len(dumps[r]["entries"]) for r in (0, 1, 2)] == [2, 2, 1]  # no send, recv or init
    stuck = dumps[0]["entries"][1]
    # Every key torch 2.13's Gloo recorder writes, but its thread's name and id.
    assert stuck == {
        "record_id": 1,
        "pg_id": 0,
        "process_group": ("WORLD", "default_pg"),
        "collective_seq_id": 2,
        "p2p_seq_id": 0,
        "op_id": 2,
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": 103_000_000_000,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4]],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "time_discovered_started_ns": 103_000_000_000,
        "time_discovered_completed_ns": None,
        "retired": False,
        "timeout_ms": 30_000,
        "is_p2p": False,
        "frames": [{"name": "all_reduce", "filename": "train.py", "line": 13}],
    }
    assert dumps[0]["entries"][0]["time_discovered_completed_ns"] == 101_500_000_000
    for rank in (0, 1, 2):  # rank 2 never reached all_reduce #2: still a member of WORLD
        assert dumps[rank]["version"] == "2.10"
        assert dumps[rank]["pg_config"] == {"WORLD": {"name": "WORLD", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    assert dumps[0]["pg_status"] == {
        "0": {"last_enqueued_collective": 2, "last_started_collective": 2, "last_completed_collective": 1}
    }
    assert dumps[2]["pg_status"]["0"]["last_enqueued_collective"] == 1


def test_a_rank_outside_a_group_has_none_of_it_and_a_rank_with_no_call_has_a_dump(tmp_path: Path) -> None:
    pair = {"group": "1", "group_ranks": (1, 2)}
    states = [
        RankState(0, alive=False, calls=[call(0, "reduce_scatter_tensor", 1, group_ranks=(), error="no group")]),
        RankState(1, calls=[call(0, "broadcast", 1, root=1, exit=None, **pair)]),
        RankState(2, calls=[]),
    ]
    dumps = load(flight_recorder.write(tmp_path, "t", states, "gloo", 30))
    assert [dumps[r]["entries"] for r in (0, 2)] == [[], []]
    assert dumps[0]["pg_config"] == {}
    assert dumps[2]["pg_config"] == {"1": {"name": "1", "desc": "undefined", "ranks": "[1, 2]"}}
    assert dumps[1]["entries"][0]["process_group"] == ("1", "undefined")


@pytest.mark.parametrize(
    ("op", "shapes", "sizes"),
    [
        ("all_gather", [[2, 3]], ([[2, 3]], [[3, 2, 3]])),  # the output holds the group's inputs
        ("all_gather_into_tensor", [[4]], ([[4]], [[3, 4]])),
        ("reduce_scatter", [[2]], ([[3, 2]], [[2]])),  # the recorder describes its output
        ("reduce_scatter_tensor", [[6]], ([[6]], [[2]])),  # ... and of this one its input
        ("all_to_all_single", [[6]], ([[0]], [[0]])),  # uneven splits: not compared
        ("all_gather_object", [], ([[0]], [[0]])),  # an object: no sizes
        ("barrier", [], ([], [])),
        ("broadcast", [[5, 1]], ([[5, 1]], [[5, 1]])),
    ],
)
def test_sizes_as_the_analyser_checks_them(op: str, shapes: list[list[int]], sizes: tuple[Any, Any]) -> None:
    [entry] = flight_recorder.dump(
        RankState(0, calls=[call(0, op, 1, shapes)]), {"WORLD": (0, 1, 2)}, {"WORLD": 0}, "gloo", 1
    )["entries"]
    assert (entry["input_sizes"], entry["output_sizes"]) == sizes


def test_every_collective_has_a_name_the_analyser_knows() -> None:
    assert {op(name).flight_recorder_name for name in COLLECTIVES} <= fr_types.COLLECTIVES


def test_an_mpi_world_is_written_under_nccl_s_name(tmp_path: Path) -> None:
    states = [RankState(r, calls=[call(0, "mpi.Allreduce", 1, [[3]], group_ranks=(0, 1))]) for r in (0, 1)]
    dumps = load(flight_recorder.write(tmp_path, "t", states, "mpi", 30))
    assert dumps[1]["entries"][0]["profiling_name"] == "nccl:all_reduce"  # the analyser refuses "mpi:"


def analyse(folder: Path, order: list[int]) -> fr_types.Collective:
    """torchfrtrace's matching, here, on the dumps read in ``order``: the first collective at fault."""
    args = JobConfig().parse_args([str(folder)])
    details = {}
    for rank in order:
        data = pickle.loads((folder / f"rank_{rank}").read_bytes())
        details[f"rank_{rank}"] = {"rank": rank, **{k: data[k] for k in ("entries", "version", "pg_config")}}
    db = build_db(details, args, flight_recorder.VERSION)
    return next(c for c in db.collectives if not c.pass_check or c.missing_ranks)


def test_the_analyser_names_the_side_of_a_mismatch_that_differs_from_the_first_dump_it_reads(tmp_path: Path) -> None:
    # Rank 1 left the all_reduce its peers are inside (as Gloo let it, measured): a state that
    # differs, which the analyser would count against it; the dumps say "scheduled" on all.
    states = [
        RankState(0, calls=[call(0, "all_reduce", 1, [[4]], exit=None)]),
        RankState(1, calls=[call(0, "all_reduce", 1, [[4]])]),
        RankState(2, calls=[call(0, "all_reduce", 1, [[5]], exit=None)]),
    ]
    folder = flight_recorder.write(tmp_path, "t", states, "gloo", 30)
    assert set(analyse(folder, [0, 1, 2]).mismatch_collectives) == {2}
    assert set(analyse(folder, [2, 0, 1]).mismatch_collectives) == {0, 1}


def test_the_analyser_finds_no_fault_before_the_skipped_collective(tmp_path: Path) -> None:
    folder = flight_recorder.write(tmp_path, "t", partial_states(), "gloo", 30)
    found = analyse(folder, [0, 1, 2])
    assert (found.collective_seq_id, found.missing_ranks) == (2, {2})  # not the send: it has no entry

"""``--ddp-report-dir``'s files where another could plant links (report/files.py, writable.py): a link
under a report's name is replaced, never written through; a folder of another user's is refused."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest

from conftest import NOBODY
from pytest_ddp.config.settings import writable_dir
from pytest_ddp.config.spec import RankSpec, SpecError
from pytest_ddp.diagnose.state import RankState
from pytest_ddp.groups.runner import StartFailure
from pytest_ddp.report import files, flight_recorder
from pytest_ddp.report.writable import file_name

TEST = "test_x.py::test_x"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to give a folder to another user")


def _failure() -> StartFailure:
    return StartFailure(TEST, RankSpec(2, "gloo", 60.0, 2.0), "rank 1 could not start", 1.0)


def test_a_link_under_a_report_s_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    reports, victim = tmp_path / "reports", tmp_path / "victim"
    reports.mkdir()
    victim.write_text("the victim's own")
    name = file_name(TEST)
    for suffix in (".json", ".trace.json", ".html"):
        (reports / f"{name}{suffix}").symlink_to(victim)
    written = files.write(str(reports), _failure())
    assert victim.read_text() == "the victim's own"
    assert sorted(path.name for path in reports.iterdir()) == sorted(
        f"{name}{suffix}" for suffix in (".json", ".trace.json", ".html")
    )  # no partial file left
    for path in reports.iterdir():
        assert stat.S_ISREG(os.lstat(path).st_mode), path
    assert '"status": "not_started"' in written.read_text()
    files.write(str(reports), _failure())  # a run again, into the same folder: the files replaced
    assert len(list(reports.iterdir())) == 3


def test_a_flight_recorder_folder_that_is_a_link_is_not_written_through(tmp_path: Path) -> None:
    reports, elsewhere = tmp_path / "reports", tmp_path / "elsewhere"
    reports.mkdir()
    elsewhere.mkdir()
    (reports / f"{file_name(TEST)}.fr").symlink_to(elsewhere)
    with pytest.raises(OSError, match=r"\.fr is a link: a report is never written through one"):
        flight_recorder.write(reports, TEST, [RankState(0), RankState(1)], "gloo", 30)
    assert list(elsewhere.iterdir()) == []
    (reports / f"{file_name(TEST)}.fr").unlink()
    folder = flight_recorder.write(reports, TEST, [RankState(0), RankState(1)], "gloo", 30)
    (folder / "rank_1").unlink()
    (folder / "rank_1").symlink_to(elsewhere / "planted")
    flight_recorder.write(reports, TEST, [RankState(0), RankState(1)], "gloo", 30)  # again, in place
    assert list(elsewhere.iterdir()) == [] and sorted(os.listdir(folder)) == ["rank_0", "rank_1"]
    assert pickle.loads((folder / "rank_1").read_bytes())["version"] == flight_recorder.VERSION


def test_a_report_dir_every_user_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SpecError, match=f"--ddp-report-dir='{shared}': is writable by every user; give a folder"):
        writable_dir(str(shared))
    shared.chmod(0o775)  # this user's, shared with its group: as the user chose
    assert writable_dir(str(shared)) == str(shared)


@as_root
def test_a_report_dir_or_a_flight_recorder_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    """Another user made the folder first (a shared ``/tmp/ddp-reports``, mode 0777)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(SpecError, match=f"--ddp-report-dir='{theirs}': is user {NOBODY}'s; give a folder"):
        writable_dir(str(theirs))
    reports = tmp_path / "reports"
    fr = reports / f"{file_name(TEST)}.fr"
    fr.mkdir(parents=True)
    os.chown(fr, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match=f"is user {NOBODY}'s folder, not this user's"):
        flight_recorder.write(reports, TEST, [RankState(0)], "gloo", 30)
    assert list(fr.iterdir()) == []

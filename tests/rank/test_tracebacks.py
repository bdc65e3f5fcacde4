"""A rank's failure shows library frames short (rank/session.py), on a real pytest item."""

from __future__ import annotations

import pytest

from pytest_ddp.rank.session import shorten_library_frames
from pytest_ddp.record import describe

TEST = """
import torch

def test_shapes():
    torch.broadcast_tensors(torch.ones(3), torch.ones(4))
"""


def _failure(pytester: pytest.Pytester, *args: str, shorten: bool = True) -> str:
    (item,) = pytester.getmodulecol(TEST, configargs=list(args)).collect()
    assert isinstance(item, pytest.Function)
    if shorten:
        shorten_library_frames(item)
    with pytest.raises(RuntimeError) as excinfo:
        item.runtest()
    return str(item.repr_failure(excinfo))


def test_a_failure_inside_torch_shows_torchs_frame_in_one_line(pytester: pytest.Pytester) -> None:
    plain = _failure(pytester, shorten=False)
    short = _failure(pytester)
    assert "torch.broadcast_tensors(torch.ones(3), torch.ones(4))" in short  # the test's line, in full
    assert "functional.py:" in short and "in broadcast_tensors" in short  # torch's frame: one line
    assert "def broadcast_tensors" in plain and "def broadcast_tensors" not in short  # not its source
    assert short.count("\n") < plain.count("\n")


def test_another_tb_style_is_left_as_asked(pytester: pytest.Pytester) -> None:
    assert "def broadcast_tensors" in _failure(pytester, "--tb=long")


def test_what_counts_as_a_library() -> None:
    import torch

    assert describe.users_file(torch.__file__) is None and describe.users_file(pytest.__file__) is None
    assert describe.users_file(__file__)


def test_a_failure_a_library_raised_without_its_traceback_shows_its_message_alone(
    pytester: pytest.Pytester,
) -> None:
    """pytest.fail(..., pytrace=False) from a library's frame (pytest-ddp's own: a thread left running)."""
    library = pytester.mkdir("site-packages")
    quiet = "import pytest\n\ndef fail():\n    pytest.fail('said alone', pytrace=False)\n"
    (library / "quiet.py").write_text(quiet)
    pytester.syspathinsert(library)
    (item,) = pytester.getitems("import quiet\n\ndef test_it():\n    quiet.fail()\n")
    shorten_library_frames(item)
    with pytest.raises(pytest.fail.Exception) as excinfo:
        item.runtest()
    assert str(item.repr_failure(excinfo)) == "said alone"

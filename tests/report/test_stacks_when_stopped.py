"""A stopped rank's stacks in the report (report/failure.py's format_dump) on hand-made faulthandler
dumps, shaped as a rank's measured on CPython 3.11 (threads newest first, the main thread last):
the test's thread first, pytest-ddp's own threads left out, idle library threads in one line."""

from __future__ import annotations

from pytest_ddp.report.failure import format_dump

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
START = f"""\
  File "{STDLIB}/threading.py", line 982 in run
  File "{STDLIB}/threading.py", line 1045 in _bootstrap_inner
  File "{STDLIB}/threading.py", line 1002 in _bootstrap
"""
PENDING_WORK = f"""\
Thread 0x00007f2a48b116c0 (most recent call first):
  File "{STDLIB}/threading.py", line 327 in wait
  File "{STDLIB}/threading.py", line 629 in wait
  File "{SITE}/pytest_ddp/record/numbering.py", line 169 in _look
{START}
"""
RERUN_SERVER = f"""\
Thread 0x00007f2a494126c0 (most recent call first):
  File "{STDLIB}/socket.py", line 294 in accept
  File "{SITE}/pytest_rerunfailures.py", line 921 in run_server
{START}
"""
POOL_WORKER = f"""\
Thread 0x00007f2a4{{n}}0000c0 (most recent call first):
  File "{STDLIB}/concurrent/futures/thread.py", line 81 in _worker
{START}
"""
FEEDER = f"""\
Thread 0x00007f2a4a0000c0 (most recent call first):
  File "{STDLIB}/threading.py", line 327 in wait
  File "/src/tests/test_x.py", line 9 in feed
{START}
"""
MAIN = f"""\
Current thread 0x00007f2a6ce39b80 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/src/tests/test_x.py", line 20 in test_x
  File "{SITE}/_pytest/python.py", line 187 in pytest_pyfunc_call
"""


def test_the_main_thread_comes_first_and_pytest_ddps_threads_are_left_out() -> None:
    text = format_dump(PENDING_WORK + FEEDER + MAIN, "/src/tests/test_x.py")
    first, feeder = text.split("\n\n")
    assert first.splitlines()[0].startswith("Current thread 0x00007f2a6ce39b80")
    assert first.splitlines()[2] == '> File "/src/tests/test_x.py", line 20 in test_x'
    assert feeder.splitlines()[0].startswith("Thread 0x00007f2a4a0000c0")  # the test's own thread stays
    assert "numbering.py" not in text


def test_idle_library_threads_are_one_line_after_the_threads_shown() -> None:
    pool = "".join(POOL_WORKER.format(n=n) for n in range(3))
    text = format_dump(PENDING_WORK + RERUN_SERVER + pool + MAIN, "/src/tests/test_x.py")
    assert text.split("\n\n")[-1] == (
        "(4 idle library threads: pytest_rerunfailures.py run_server, waiting in socket.py accept; "
        "concurrent/futures/thread.py _worker (x3))"
    )
    assert text.count("Thread 0x") == 0 and text.count("Current thread") == 1


def test_past_100_threads_the_current_one_leads_and_the_cut_is_said() -> None:
    text = format_dump(FEEDER * 2 + MAIN + "...\n", "/src/tests/test_x.py")
    assert text.startswith("Current thread") and text.count("Thread 0x00007f2a4a0000c0") == 2
    assert text.endswith("(more threads not dumped: faulthandler writes 100 at most)")


def test_text_that_is_not_a_dump_is_shown_as_it_is() -> None:
    assert format_dump("no dump: the file was empty", "t.py") == "no dump: the file was empty"

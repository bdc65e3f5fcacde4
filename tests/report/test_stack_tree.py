"""The ranks' main threads merged into one tree (report/stack_tree.py): the parser, the merge and
the text on hand-made faulthandler dumps, shaped as a rank's dump measured on CPython 3.11
(threads newest first, the main thread last); then a real hang at 4 ranks, one in another
function, its tree in the failure text, the JSON report and the page."""

from __future__ import annotations

import json
import re

from conftest import line_of
from pytest_ddp.report import stack_tree
from pytest_ddp.report.stack_tree import CUT, HARNESS, Frame
from pytest_ddp.report.writable import printable_data

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
OTHER_THREAD = f"""\
Thread 0x00007f7bb16116c0 (most recent call first):
  File "{STDLIB}/threading.py", line 327 in wait
  File "{SITE}/pytest_ddp/record/numbering.py", line 130 in _look
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

"""
UNDER_TEST = f"""\
  File "{SITE}/_pytest/python.py", line 187 in pytest_pyfunc_call
  File "{SITE}/pluggy/_execution.py", line 147 in _multicall
  File "/work/pytest_ddp/rank/entry.py", line 104 in forked_main
  File "{STDLIB}/multiprocessing/forkserver.py", line 274 in main
  File "<string>", line 1 in <module>
"""


def dump(*inner: str, thread: int = 0xD5C90B80) -> str:
    """A rank's dump: a helper thread, then its main thread's frames (innermost first) on the test."""
    frames = "".join(f"  {line}\n" for line in inner)
    return f"{OTHER_THREAD}Current thread 0x00007f{thread:08x} (most recent call first):\n{frames}{UNDER_TEST}"


def waiting_in(op: str, line: int, *test_frames: str) -> str:
    return dump(
        f'File "{SITE}/pytest_ddp/record/recorder.py", line 431 in wait',
        f'File "{SITE}/torch/distributed/distributed_c10d.py", line {line} in {op}',
        f'File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper',
        f'File "{SITE}/pytest_ddp/record/recorder.py", line 225 in recorded',
        *test_frames,
    )


STEP = waiting_in("all_reduce", 3252, 'File "/src/tests/test_train.py", line 12 in step',
                  'File "/src/tests/test_train.py", line 22 in test_train')
ELSEWHERE = waiting_in("barrier", 5356, 'File "/src/tests/test_train.py", line 8 in wait_elsewhere',
                       'File "/src/tests/test_train.py", line 20 in test_train')


# -- the parser ---------------------------------------------------------------------


def test_the_main_thread_is_parsed_outermost_first_with_harness_runs_collapsed() -> None:
    frames = stack_tree.main_thread(STEP)
    assert frames == [
        HARNESS,
        Frame("/src/tests/test_train.py", 22, "test_train"),
        Frame("/src/tests/test_train.py", 12, "step"),
        HARNESS,
        Frame(f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper"),
        Frame(f"{SITE}/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
        HARNESS,
    ]


def test_the_main_thread_is_the_last_one_listed_even_when_another_thread_got_the_signal() -> None:
    text = STEP.replace("Current thread", "Thread").replace("Thread 0x00007f7bb16116c0", "Current thread 0x0000000001")
    assert stack_tree.main_thread(text) == stack_tree.main_thread(STEP)


def test_a_thread_cut_at_faulthandlers_100_frames_starts_with_a_cut_node() -> None:
    deep = dump(*[f'File "/src/rec.py", line 3 in down{i}' for i in range(100)]).replace(UNDER_TEST, "  ...\n")
    frames = stack_tree.main_thread(deep)
    assert frames[0] == CUT and len(frames) == 101
    assert frames[1:3] == [Frame("/src/rec.py", 3, "down99"), Frame("/src/rec.py", 3, "down98")]


def test_when_faulthandler_stopped_at_its_100th_thread_the_main_thread_is_not_guessed() -> None:
    # Measured (CPython 3.11, 120 threads): the newest 100 are written, then "...": the main
    # thread, the oldest, is not among them.  A "Current thread" written (the one the signal
    # landed on) stands in; else the rank has no main thread in the tree, and the text says so.
    many = "".join(OTHER_THREAD for _ in range(3))
    assert stack_tree.main_thread(many + "...\n") == []
    current = STEP[len(OTHER_THREAD):]
    assert stack_tree.main_thread(many + current + "\n...\n") == stack_tree.main_thread(STEP)
    tree = stack_tree.merged({0: STEP, 1: ELSEWHERE, 2: many + "...\n"})
    assert (tree.ranks, tree.unfound) == ([0, 1], [2])
    assert stack_tree.render(tree, "t.py")[-1] == "  (no main thread in the dump of rank 2: see the stacks below)"


def test_text_that_is_not_a_dump_gives_no_frames_and_an_unknown_line_is_kept_as_unknown() -> None:
    for junk in ("", "\x00\xff garbage", 'File "x", line 1 in f', "Thread 0xzz\n  File broken"):
        assert stack_tree.main_thread(junk) == []
    odd = dump('File "/src/we ird\\", line 9 in f.py", line ??? in <lambda>')
    assert stack_tree.main_thread(odd)[1] == Frame('/src/we ird\\", line 9 in f.py', None, "<lambda>")
    tree = stack_tree.merged({0: "", 1: "nothing"})
    assert (tree.ranks, tree.roots, tree.unfound, tree.differs()) == ([], [], [0, 1], False)
    assert stack_tree.render(tree, "t.py") == ["  (no main thread in the dump of ranks 0, 1: see the stacks below)"]


def test_a_harness_line_is_told_by_its_file_in_either_format() -> None:
    assert stack_tree.harness_line(f'  File "{SITE}/_pytest/runner.py", line 5, in call')  # traceback's
    assert stack_tree.harness_line('  File "<frozen runpy>", line 198 in _run_module_as_main')
    assert not stack_tree.harness_line('  File "/src/test_x.py", line 5 in test_pytest_ddp_thing')


# -- the other threads: pytest-ddp's own, idle library ones, the rest --------------------


def thread(*inner: str) -> stack_tree.Thread:
    """A thread's lines as faulthandler writes them, innermost first, started by threading.py."""
    start = [f'File "{STDLIB}/threading.py", line {n} in {f}'
             for n, f in ((982, "run"), (1045, "_bootstrap_inner"), (1002, "_bootstrap"))]
    return stack_tree.Thread("Thread 0x00007f2a494126c0 (most recent call first):",
                             [f"  {line}" for line in [*inner, *start]])


RERUN_SERVER = thread(f'File "{STDLIB}/socket.py", line 294 in accept',
                      f'File "{SITE}/pytest_rerunfailures.py", line 921 in run_server')
PENDING_WORK = thread(f'File "{STDLIB}/threading.py", line 327 in wait',
                      f'File "{STDLIB}/threading.py", line 629 in wait',
                      'File "/work/pytest_ddp/record/numbering.py", line 169 in _look')


def test_a_thread_that_runs_a_function_of_pytest_ddps_is_its_own() -> None:
    assert stack_tree.thread_kind(PENDING_WORK) == "own"
    installed = thread(f'File "{SITE}/pytest_ddp/record/backend_recorder.py", line 210 in wait_all')
    assert stack_tree.thread_kind(installed) == "own"


def test_a_library_thread_whose_innermost_frame_is_a_wait_is_idle_and_said_in_a_few_words() -> None:
    pool = thread(f'File "{STDLIB}/concurrent/futures/thread.py", line 81 in _worker')
    selector = thread(f'File "{STDLIB}/selectors.py", line 415 in select',
                      f'File "{STDLIB}/socketserver.py", line 233 in serve_forever')
    for idle in (RERUN_SERVER, pool, selector):
        assert stack_tree.thread_kind(idle) == "idle"
    assert stack_tree.idle_label(RERUN_SERVER) == "pytest_rerunfailures.py run_server, waiting in socket.py accept"
    assert stack_tree.idle_label(pool) == "concurrent/futures/thread.py _worker"


def test_a_thread_of_the_tests_or_one_at_work_or_in_c_is_shown() -> None:
    users = thread(f'File "{STDLIB}/threading.py", line 327 in wait', 'File "/src/tests/test_x.py", line 9 in feed')
    working = thread(f'File "{SITE}/torch/utils/data/_utils/pin_memory.py", line 40 in do_one_step')
    # The user's thread calls a recorded collective: pytest-ddp's frames are inside, not what it runs.
    collective = thread(f'File "{SITE}/pytest_ddp/record/recorder.py", line 225 in recorded',
                        'File "/src/tests/test_x.py", line 12 in worker')
    in_c = thread()  # threading.Thread(target=a C function): nothing of its own is written
    assert [stack_tree.thread_kind(t) for t in (users, working, collective, in_c)] == ["other"] * 4


# -- the merge and its text ---------------------------------------------------------------


def test_144_ranks_where_rank_60_waits_elsewhere_fit_a_screen_and_name_it() -> None:
    dumps = {r: STEP for r in range(144)} | {60: ELSEWHERE}
    tree = stack_tree.merged(dumps)
    assert tree.ranks == list(range(144)) and tree.differs()
    assert stack_tree.render(tree, "tests/test_train.py") == [
        "  (pytest and pytest-ddp frames)  [ranks 0-143]",
        "> |-- tests/test_train.py:22 in test_train  [ranks 0-59, 61-143; not rank 60]",
        "> |   tests/test_train.py:12 in step",
        "  |   (pytest and pytest-ddp frames)",
        "  |   torch/distributed/c10d_logger.py:83 in wrapper",
        "  |   torch/distributed/distributed_c10d.py:3252 in all_reduce",
        "  |   (pytest and pytest-ddp frames)",
        "> `-- tests/test_train.py:20 in test_train  [rank 60; not ranks 0-59, 61-143]",
        ">     tests/test_train.py:8 in wait_elsewhere",
        "      (pytest and pytest-ddp frames)",
        "      torch/distributed/c10d_logger.py:83 in wrapper",
        "      torch/distributed/distributed_c10d.py:5356 in barrier",
        "      (pytest and pytest-ddp frames)",
    ]


def test_the_same_stack_on_every_rank_is_one_chain_and_no_difference() -> None:
    tree = stack_tree.merged({r: STEP.replace("d5c90b80", f"{r:08x}") for r in range(4)})
    assert not tree.differs()
    lines = stack_tree.render(tree, "tests/test_train.py")
    assert lines[0] == "  (pytest and pytest-ddp frames)  [ranks 0-3]" and len(lines) == 7
    assert not any("[" in line for line in lines[1:])  # one branch: its ranks said once


def test_a_rank_whose_stack_ends_higher_up_is_said_to_end_there() -> None:
    early = dump('File "/src/tests/test_train.py", line 22 in test_train')  # in the test's own frame
    tree = stack_tree.merged({0: STEP, 1: STEP, 2: early})
    assert tree.differs()
    lines = stack_tree.render(tree, "tests/test_train.py")
    assert lines[1:3] == [
        "> tests/test_train.py:22 in test_train",
        "  |-- (stack ends at the frame above)  [rank 2; not ranks 0, 1]",
    ]
    assert lines[3] == "> `-- tests/test_train.py:12 in step  [ranks 0, 1; not rank 2]"


def test_ranks_in_the_same_function_at_other_lines_part_there_and_paths_are_shortened() -> None:
    other_line = STEP.replace("line 22 in test_train", "line 24 in test_train")
    tree = stack_tree.merged({0: STEP, 1: other_line, 2: STEP})
    lines = stack_tree.render(tree, "tests/test_train.py")
    assert [line for line in lines if "[" in line][1:] == [
        "> |-- tests/test_train.py:22 in test_train  [ranks 0, 2; not rank 1]",
        "> `-- tests/test_train.py:24 in test_train  [rank 1; not ranks 0, 2]",
    ]
    helper = Frame("/src/tests/helpers.py", 3, "f")  # beside the test: from the test's root
    stdlib = Frame(f"{STDLIB}/threading.py", 327, "wait")
    paths = stack_tree.Paths("tests/test_train.py", tree)
    assert (paths.label(helper), paths.label(stdlib)) == ("tests/helpers.py:3 in f", "threading.py:327 in wait")


def test_a_bushy_tree_is_cut_to_its_limit_with_a_line_saying_so() -> None:
    dumps = {r: STEP.replace("line 12 in step", f"line {100 + r} in step") for r in range(16)}
    lines = stack_tree.render(stack_tree.merged(dumps), "tests/test_train.py", limit=20)
    assert len(lines) == 20
    assert lines[-1] == "  (63 more lines: the JSON report's stack_tree has them all)"


def test_the_tree_as_data_keeps_every_node_and_its_ranks() -> None:
    data = stack_tree.to_json(stack_tree.merged({0: STEP, 1: ELSEWHERE, 2: STEP}))
    assert (data["thread"], data["ranks"]) == ("main", [0, 1, 2])
    (root,) = data["roots"]
    assert (root["kind"], root["file"], root["ranks"]) == ("harness", None, [0, 1, 2])
    assert [(c["line"], c["function"], c["ranks"]) for c in root["children"]] == [
        (22, "test_train", [0, 2]),
        (20, "test_train", [1]),
    ]
    assert data["unfound"] == []
    # Two ranks 100 distinct frames deep (faulthandler's most): the report's round trip takes it.
    deep = {r: dump(*[f'File "/src/rec.py", line {r} in down{i}' for i in range(150)]) for r in range(2)}
    tree = stack_tree.merged(deep)
    assert [len(stack_tree.main_thread(d)) for d in deep.values()] == [101, 101]  # CUT, then 100
    nested = printable_data(json.loads(json.dumps(stack_tree.to_json(tree))))
    assert [root["kind"] for root in nested["roots"]] == ["cut"]
    assert [child["ranks"] for child in nested["roots"][0]["children"]] == [[0], [1]]


# -- a real hang -----------------------------------------------------------------------------


def test_a_hang_where_one_rank_waits_in_another_function_shows_the_merged_tree(ddp_pytester, tmp_path) -> None:
    reports = tmp_path / "reports"
    result = ddp_pytester.run(
        """
        import threading

        def step(t):
            dist.all_reduce(t)

        def wait_elsewhere():
            dist.barrier()

        @pytest.mark.ddp(world_size=4, timeout=60)
        def test_hang(rank):
            threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()  # not in the tree
            if rank == 2:
                wait_elsewhere()
            else:
                step(torch.ones(2))
        """,
        f"--ddp-report-dir={reports}",
    )
    result.assert_outcomes(failed=1)
    path = ddp_pytester.pytester.path / "test_it.py"
    at = {
        "all_reduce": line_of(path, "dist.all_reduce"),
        "barrier": line_of(path, "dist.barrier"),
        "calls step": line_of(path, "step(torch"),
        "calls wait_elsewhere": line_of(path, "    wait_elsewhere()"),
    }
    text = result.stdout.str()
    title = "ranks 0-3: Python stacks merged (main thread, outermost frame first)"
    assert text.count(title) == 1, text
    tree = text.split(title)[1].split("\n\n")[0]
    branches = [line for line in tree.splitlines() if "[" in line]
    assert branches == [
        "  (pytest and pytest-ddp frames)  [ranks 0-3]",
        f"> |-- test_it.py:{at['calls step']} in test_hang  [ranks 0, 1, 3; not rank 2]",
        f"> `-- test_it.py:{at['calls wait_elsewhere']} in test_hang  [rank 2; not ranks 0, 1, 3]",
    ], tree
    assert f">     test_it.py:{at['barrier']} in wait_elsewhere" in tree.splitlines()
    assert f"> |   test_it.py:{at['all_reduce']} in step" in tree.splitlines()
    assert "time.sleep" not in tree and "threading.py" not in tree  # the other thread is left out
    assert text.index(title) < text.index("Python stacks when stopped")  # beside the per-rank stacks
    (report,) = (p for p in reports.glob("*.json") if not p.name.endswith(".trace.json"))
    data = json.loads(report.read_text())["stack_tree"]
    (root,) = data["roots"]
    assert [(c["line"], c["ranks"]) for c in root["children"]] == [(at["calls step"], [0, 1, 3]),
                                                                      (at["calls wait_elsewhere"], [2])]
    page = report.with_suffix(".html").read_text()
    summaries = re.findall(r"<details open><summary>(.*?)</summary>", page.split('<div class="tree">')[1])
    assert summaries[1:3] == [
        f'<span class="test">test_it.py:{at["calls step"]} in test_hang</span> '
        '<span class="part">[ranks 0, 1, 3; not rank 2]</span>',
        f'<span class="test">test_it.py:{at["calls wait_elsewhere"]} in test_hang</span> '
        '<span class="part">[rank 2; not ranks 0, 1, 3]</span>',
    ]

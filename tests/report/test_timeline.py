"""The picture of a failing test, on hand-made reports: the Chrome trace (timeline.py) and the
HTML page (picture.py).  The page of a real hang in a real browser: test_picture.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pytest_ddp.report import picture, timeline

T0 = 1000.0  # the hand-over, time.time()


def call(index: int, op: str, seq: int, enter: float, exit: float | None, **fields: Any) -> dict[str, Any]:
    """A call as the JSON report has it; ``enter`` and ``exit`` in seconds after the hand-over."""
    state = "running" if exit is None else "raised" if fields.get("error") else "ok"
    return {
        "index": index, "op": op, "group": "WORLD", "group_ranks": [0, 1], "seq": seq, "site": "test_x.py:7",
        "caller": None, "state": state, "enter": T0 + enter, "exit": None if exit is None else T0 + exit,
        "shapes": [[4]], "dtypes": ["float32"], "devices": ["cpu"], "peer": None, "root": None, "async": False,
        "obj_type": None, "obj_size": None, "extra": {}, "error": None, "label": f"{op} #{seq}", **fields,
    }


def rank(number: int, calls: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "rank": number, "line": f"rank {number}: ...", "alive": True, "exit_code": None, "phase": "call",
        "failed": False, "calls": calls, "failure": None, "stack": None, "output": None,
        "finished_at": None, "died_at": None, **fields,
    }


def report(ranks: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "test": "test_x.py::test_hang", "world_size": len(ranks), "backend": "gloo", "timeout": 60.0,
        "status": "deadlock", "kind": "partial", "culprits": [1], "waiting": [0], "collective": "all_reduce",
        "call": "all_reduce #2", "summary": "rank 1 returned from its test without calling all_reduce #2",
        "headline": "ddp: deadlock (partial): rank 1 returned from its test without calling all_reduce #2",
        "elapsed": 0.5, "started": T0, "ended": T0 + 0.5, "sequence_differences": [], "unfinished_work": [],
        "ranks": ranks, **fields,
    }


def partial_hang() -> dict[str, Any]:
    """Rank 1 returns after all_reduce #1; rank 0 waits in all_reduce #2 until the verdict at 0.5 s."""
    return report([
        rank(0, [call(0, "all_reduce", 1, 0.010, 0.020), call(1, "all_reduce", 2, 0.030, None)]),
        rank(1, [call(0, "all_reduce", 1, 0.012, 0.020)], phase="finished", finished_at=T0 + 0.025),
    ])


def events(trace: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


# -- the trace -------------------------------------------------------------------------------------


def test_the_trace_has_a_track_per_rank_and_a_slice_per_call_in_microseconds() -> None:
    trace = json.loads(json.dumps(timeline.trace(partial_hang())))
    threads = {e["tid"]: e["args"]["name"] for e in events(trace, "M") if e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["rank 0", "rank 1"]
    slices = [(threads[e["tid"]], e["name"], e["ts"], e["dur"]) for e in events(trace, "X")]
    assert slices == [
        ("rank 0", "all_reduce #1", 10000.0, 10000.0),
        ("rank 0", "all_reduce #2 [stuck]", 30000.0, 470000.0),  # drawn to the verdict
        ("rank 1", "all_reduce #1", 12000.0, 8000.0),
    ]
    assert events(trace, "X")[0]["args"] == {
        "op": "all_reduce", "seq": 1, "group": "WORLD", "group_ranks": [0, 1], "shapes": [[4]],
        "dtypes": ["float32"], "site": "test_x.py:7", "state": "ok",
    }


def test_the_trace_marks_the_stuck_call_the_ranks_ends_and_the_verdict() -> None:
    trace = timeline.trace(partial_hang())
    [stuck] = [e for e in events(trace, "X") if e["cat"] == "stuck"]
    assert (stuck["cname"], stuck["args"]["state"]) == ("terrible", "stuck")
    instants = {(e.get("tid"), e["name"], e["ts"], e["s"]) for e in events(trace, "i")}
    assert instants == {
        (stuck["tid"], "stuck in all_reduce #2", 500000.0, "t"),
        (2, "rank 1 finished", 25000.0, "t"),
        (None, "verdict: deadlock (partial)", 500000.0, "g"),
    }
    assert trace["otherData"]["headline"].startswith("ddp: deadlock (partial): rank 1 returned")


def test_every_trace_event_has_what_the_trace_event_format_asks_for() -> None:
    trace = json.loads(json.dumps(timeline.trace(partial_hang())))
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    for event in trace["traceEvents"]:
        assert event["ph"] in ("M", "X", "i") and isinstance(event["pid"], int) and isinstance(event["name"], str)
        if event["ph"] == "X":
            assert isinstance(event["tid"], int) and event["ts"] >= 0 and event["dur"] >= 0
        if event["ph"] == "i":
            assert event["s"] in ("t", "g") and ("tid" in event) == (event["s"] == "t")


def test_overlapping_calls_get_a_track_of_their_own() -> None:
    isend = call(0, "isend", 1, 0.010, 0.050, **{"async": True, "peer": 1, "label": "isend #1 to 1"})
    trace = timeline.trace(report([rank(0, [isend, call(1, "all_reduce", 1, 0.020, 0.030)])]))
    threads = {e["tid"]: e["args"]["name"] for e in events(trace, "M") if e["name"] == "thread_name"}
    placed = {e["name"]: threads[e["tid"]] for e in events(trace, "X")}
    assert placed == {"isend #1 to 1": "rank 0", "all_reduce #1": "rank 0 (overlapping calls 1)"}


def test_a_call_its_rank_died_in_ends_at_the_death_and_is_not_stuck() -> None:
    dead = rank(1, [call(0, "all_reduce", 1, 0.010, None)], alive=False, exit_code=-9, died_at=T0 + 0.1)
    line = timeline.timeline(report([dead]))
    [piece] = line.slices
    assert (piece.stuck, piece.died_in, piece.end) == (False, True, pytest.approx(0.1))
    assert line.rank_ends == {1: ("died", pytest.approx(0.1))}
    [event] = events(timeline.trace(report([dead])), "X")
    state = "running when the rank died"
    assert (event["name"], event["cname"], event["args"]["state"]) == ("all_reduce #1", "bad", state)


def test_a_test_that_never_started_has_a_trace_and_a_page_of_its_error() -> None:
    failed = {"test": "t.py::test_x", "world_size": 2, "backend": "gloo", "timeout": 60.0, "status": "not_started",
              "start_error": "the ranks could not start: <boom>", "elapsed": 1.0, "ranks": []}
    trace = timeline.trace(failed)
    assert [e["name"] for e in events(trace, "i")] == ["verdict: not started"]
    page = picture.page(failed)
    assert "<svg" not in page and "the ranks could not start: &lt;boom&gt;" in page


# -- the page --------------------------------------------------------------------------------------


def test_the_page_marks_the_stuck_call_and_the_culprit() -> None:
    page = picture.page(partial_hang())
    [stuck_bar] = re.findall(rf'<rect [^>]*fill="{picture.STUCK}"[^>]*/>', page.split('<div class="legend">')[0])
    assert f'stroke="{picture.STUCK_EDGE}"' in stuck_bar
    width = float(re.search(r'width="([\d.]+)"', stuck_bar)[1])
    x = float(re.search(r' x="([\d.]+)"', stuck_bar)[1])
    assert x + width == pytest.approx(picture.LABEL_W + picture.PLOT_W + picture.TAIL)  # past the verdict
    assert ">stuck in all_reduce #2</text>" in page
    assert "rank 1 &#183; culprit" in page and "rank 0 &#183; waiting" in page
    assert "ddp: deadlock (partial): rank 1 returned from its test without calling all_reduce #2" in page


def test_the_page_escapes_every_text_from_the_report() -> None:
    evil = '<script>alert("x")</script>&'
    hang = partial_hang()
    hang["test"] = f"test_x.py::test_hang[{evil}]"
    hang["headline"] = f"ddp: failed: {evil}"
    hang["ranks"][0]["calls"][0].update(site=f"{evil}.py:1", error=evil, state="raised")
    hang["ranks"][0]["failure"] = f"</pre>{evil}"
    hang["ranks"][1]["line"] = evil
    page = picture.page(hang)
    assert "<script" not in page.lower() and "&lt;/pre&gt;&lt;script&gt;" in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;") >= 6


def test_the_page_refers_to_nothing_outside_itself() -> None:
    page = picture.page(partial_hang())
    assert f'<meta http-equiv="Content-Security-Policy" content="{picture.CSP}">' in page
    assert picture.CSP == "default-src 'none'; style-src 'unsafe-inline'"
    for reference in ("src=", "href=", "url(", "@import", "http:", "https:", "//"):
        assert reference not in page


def test_tiny_calls_are_merged_into_one_bar_and_a_stuck_one_never_is() -> None:
    pieces = [timeline.Slice(0, 0, i * 0.001, i * 0.001 + 0.0005, call(i, "all_reduce", i + 1, 0, 0), False, False)
              for i in range(100)]
    stuck = timeline.Slice(0, 0, 0.2, 0.3, call(100, "barrier", 1, 0.2, None), True, False)
    wide = timeline.Slice(0, 0, 0.12, 0.18, call(101, "barrier", 2, 0.12, 0.18), False, False)
    drawn = picture.bars([*pieces, wide, stuck], lambda t: 1000 * t, 3.0)
    assert [(b.text, b.stuck) for b in drawn] == [("100 calls", False), ("barrier #2", False), ("barrier #1", True)]
    assert (drawn[0].x0, drawn[0].x1) == (0, pytest.approx(99.5))
    assert "100 calls, all_reduce #1 to all_reduce #100" in drawn[0].title


def test_a_page_of_64_ranks_and_many_calls_stays_bounded() -> None:
    ranks = [rank(r, [call(i, "all_reduce", i + 1, i * 1e-4, i * 1e-4 + 5e-5) for i in range(3000)]) for r in range(64)]
    ranks[5]["calls"].append(call(3000, "all_reduce", 3001, 0.31, None))
    page = picture.page(report(ranks, ended=T0 + 0.4))
    svg = page[page.index("<svg"): page.index("</svg>")]
    assert svg.count("<rect") <= picture.MAX_RECTS
    assert all(f">rank {r}</text>" in svg for r in range(64) if r not in (0, 1))
    height = int(re.search(r'<svg width="\d+" height="(\d+)"', svg)[1])
    assert height == picture.AXIS_H + 64 * 12 + 8  # rows of 12 px: all readable on one screen and a half
    assert len(re.findall(rf"<rect [^>]*fill=\"{picture.STUCK}\"", svg)) == 1


@pytest.mark.parametrize(("span", "step"), [(0.014, 0.002), (0.5, 0.1), (1.0, 0.2), (75.0, 10.0), (0.0, 0.001)])
def test_axis_ticks_fall_on_round_numbers(span: float, step: float) -> None:
    assert picture._tick_step(span) == pytest.approx(step)


@pytest.mark.parametrize(
    ("value", "step", "label"),
    [(0.0, 0.2, "0"), (0.4, 0.2, "400 ms"), (1.2, 0.2, "1200 ms"), (0.006, 0.002, "6 ms"), (4.0, 2.0, "4 s"),
     (0.0003, 0.0001, "300 \u00b5s")],
)
def test_tick_labels_are_whole_numbers_of_their_steps_unit(value: float, step: float, label: str) -> None:
    assert picture._tick_label(value, step) == label

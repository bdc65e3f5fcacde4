"""The picture of a real hang: ``--ddp-report-dir`` writes the JSON report, its Chrome trace and
its HTML page, and the page, opened in headless Chromium, shows the stuck call and fetches nothing.

Chromium runs with a profile and a home inside the test's folder, its host names resolving to
nothing (so neither the page nor the browser's own update checks reach a network), and every
process it started is ended before the test ends.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import ModuleShared, Session, session_in_process
from pytest_ddp.report import picture
from pytest_ddp.report.writable import file_name

HANG = """
import pytest, torch, torch.distributed as dist

@pytest.mark.ddp(world_size=2, timeout=60)
def test_rank1_skips_an_all_reduce(rank):
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    if rank != 1:
        dist.all_reduce(torch.ones(4))
"""
NAME = file_name("test_hang.py::test_rank1_skips_an_all_reduce")

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium, or make chromium)"
)
WINDOW = (1280, 800)


@pytest.fixture
def hang(module_shared: ModuleShared, pytester: pytest.Pytester) -> Path:
    """A real 2-rank hang run once with --ddp-report-dir (in this process, by the first test that
    needs it); its report folder."""

    def run() -> Path:
        session_in_process(pytester, "hang", Session({"test_hang.py": HANG}, ("--ddp-report-dir=reports",)), 1)
        return pytester.path / "hang" / "reports"

    return module_shared.once("hang", run)


def test_a_hang_writes_its_report_its_trace_and_its_page(hang: Path) -> None:
    assert sorted(p.name for p in hang.iterdir()) == [NAME + end for end in (".fr", ".html", ".json", ".trace.json")]
    report = json.loads((hang / f"{NAME}.json").read_text())
    assert (report["kind"], report["culprits"], report["call"]) == ("partial", [1], "all_reduce #4")
    assert report["started"] < report["ranks"][0]["calls"][0]["enter"] <= report["ended"]
    trace = json.loads((hang / f"{NAME}.trace.json").read_text())
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    slices = [(threads[e["tid"]], e["name"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    done = [(f"rank {r}", f"all_reduce #{n}") for r in (0, 1) for n in (1, 2, 3)]
    assert sorted(slices) == sorted([*done, ("rank 0", "all_reduce #4 [stuck]")])
    page = (hang / f"{NAME}.html").read_text()
    assert "rank 1 &#183; culprit" in page and ">stuck in all_reduce #4</text>" in page
    assert "&gt; File" in page  # rank 0's stack, the test's line marked as in the failure text


def png_pixels(path: Path) -> np.ndarray:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes) as an array of RGB rows."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, compressed = 8, b""
    while pos < len(data):
        (size,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + size]
        pos += 12 + size
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, colour, interlace) in ((8, 2, 0), (8, 6, 0)), "a PNG this reader does not read"
        elif kind == b"IDAT":
            compressed += body
    step = 3 if colour == 2 else 4
    stride = width * step
    raw = zlib.decompress(compressed)
    rows = np.zeros((height, stride), np.uint8)
    prev = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if kind == 2:  # undo the row's filter (PNG spec, section 9); "up" at once
            line = bytearray((np.frombuffer(line, np.uint8) + np.frombuffer(prev, np.uint8)).tobytes())
        for i in range(stride if kind in (1, 3, 4) else 0):
            a = line[i - step] if i >= step else 0
            b, c = prev[i], (prev[i - step] if i >= step else 0)
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows[y] = np.frombuffer(bytes(line), np.uint8)
        prev = line
    return rows.reshape(height, width, step)[:, :, :3]


def longest_run(pixels: np.ndarray, colour: str) -> int:
    """The longest horizontal run of pixels of exactly ``colour`` (``#rrggbb``)."""
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)
    best = 0
    for row in np.all(pixels == rgb, axis=2):
        edges = np.diff(np.concatenate(([0], row.astype(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        best = max(best, int((ends - starts).max(initial=0)))
    return best


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (a test's own folder)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, ValueError):
            continue
        if entry.isdigit() and text.encode() in cmdline and not zombie:
            found.append(int(entry))
    return found


def end_processes(pids: list[int]) -> None:
    """Kill these processes and wait until each has exited (a pidfd is readable then)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            select.select([fd], [], [], 30)
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)


def open_in_chromium(page: Path, folder: Path) -> tuple[np.ndarray, dict]:
    """Open ``page`` in headless Chromium: the screenshot's pixels, and the net log."""
    assert CHROMIUM is not None
    home, shot, net_log = folder / "home", folder / "shot.png", folder / "net-log.json"
    home.mkdir()
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
        f"--user-data-dir={folder / 'profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--screenshot={shot}", f"--log-net-log={net_log}",
        # The browser's own traffic (update and account checks), and a last guard for any fetch:
        # no host name resolves, so nothing leaves the machine whatever is asked for.
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND",
        page.as_uri(),
    ]
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache")}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        # Its crash handlers start sessions of their own: found by the folder in their command line.
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        end_processes(processes_mentioning(str(folder)))
    assert not processes_mentioning(str(folder)), "Chromium left processes behind"
    assert process.returncode == 0 and shot.exists(), output.decode(errors="replace")[-3000:]
    return png_pixels(shot), json.loads(net_log.read_text())


def fetched_by_page(net_log: dict) -> list[str]:
    """The URLs a page asked for: requests the net log shows started on a page's behalf (the
    browser's own have no initiator, "not an origin")."""
    start = net_log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        event["params"]["url"]
        for event in net_log["events"]
        if event["type"] == start and "url" in event.get("params", {})
        and event["params"].get("initiator") != "not an origin"
    ]


@needs_chromium
def test_chromium_shows_the_stuck_call_of_a_real_hang_and_fetches_nothing(hang: Path, tmp_path: Path) -> None:
    page = hang / f"{NAME}.html"
    pixels, net_log = open_in_chromium(page, tmp_path)
    assert pixels.shape == (WINDOW[1], WINDOW[0], 3)
    # The stuck call runs on past the verdict line by TAIL pixels: a run of its red far longer
    # than the legend's swatch (13 px), the one other thing drawn in it.
    assert longest_run(pixels, picture.STUCK) >= picture.TAIL - 4
    assert longest_run(pixels, picture.KIND_COLOURS["collective"]) >= 3  # the calls before it
    assert fetched_by_page(net_log) == []
    assert page.as_uri() in json.dumps(net_log)  # the log is this page's


@needs_chromium
def test_the_fetch_check_sees_a_page_that_asks_for_something(tmp_path: Path) -> None:
    page = tmp_path / "fetches.html"
    page.write_text('<!DOCTYPE html><p>x</p><img src="http://picture-check.invalid/x.png">')
    _, net_log = open_in_chromium(page, tmp_path)
    assert fetched_by_page(net_log) == ["http://picture-check.invalid/x.png"]

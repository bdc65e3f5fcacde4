"""A failing test's report as one self-contained HTML page: the diagnosis, the timeline as inline
SVG (a row per rank, a bar per call, stuck calls in red past the verdict line), each rank's state,
the failures, the merged stack tree, each rank's stacks and output.

Nothing is fetched (no script, link, image or font) and a Content Security Policy of
``default-src 'none'`` makes a browser refuse anything that slipped in; every text from the report
is escaped.  Pure: the JSON data (:mod:`pytest_ddp.report.json_report`) and the slices of
:mod:`pytest_ddp.report.timeline` in, text out.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_ddp.common.ops import INIT, NEW_GROUP, OPS
from pytest_ddp.diagnose.state import exit_text
from pytest_ddp.diagnose.wording import rank_list
from pytest_ddp.report import stack_tree
from pytest_ddp.report.failure import format_dump, format_stack
from pytest_ddp.report.timeline import Slice, Timeline, headline, timeline, verdict_name

WIDTH = 1240  # the SVG, in CSS pixels
LABEL_W = 140  # rank names
PLOT_W = 800  # the test's time, from hand-over to verdict
TAIL = 30  # past the verdict line: stuck calls run on into it
NOTE_X = LABEL_W + PLOT_W + TAIL + 12  # each rank's state, right of the plot
AXIS_H = 30
MAX_LANES = 3  # drawn per rank; calls overlapping further share the last
MAX_RECTS = 20000  # about the most bars drawn; tiny calls are merged to stay below it
MAX_TEXT = 20000  # characters of one failure, stack or output shown (its end)

KIND_COLOURS = {
    "collective": "#4c78a8",
    "p2p": "#54a24b",
    "batch": "#72b7b2",
    "group": "#a0a0a0",
    "other": "#a0a0a0",
}
RAISED = "#f58518"
STUCK = "#d7191c"
STUCK_EDGE = "#67000d"
CULPRIT_ROW = "#fde3e1"
CSP = "default-src 'none'; style-src 'unsafe-inline'"

STYLE = """
body { font: 13px/1.45 system-ui, sans-serif; color: #1f1f1f; margin: 16px 20px; }
h1 { font-size: 16px; margin: 0 0 6px; word-break: break-all; }
.headline { font-size: 14px; font-weight: 600; white-space: pre-wrap; margin: 0 0 4px; color: #8b0000; }
.facts { color: #555; margin: 0 0 10px; }
.legend { margin: 6px 0 14px; color: #333; }
.legend span { margin-right: 16px; white-space: nowrap; }
.legend svg { vertical-align: -2px; margin-right: 4px; }
svg text { font-family: system-ui, sans-serif; }
table { border-collapse: collapse; margin: 6px 0 12px; }
td { padding: 1px 12px 1px 0; vertical-align: top; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; margin: 4px 0 10px; }
h2 { font-size: 14px; margin: 16px 0 4px; }
summary { cursor: pointer; font-weight: 600; }
.tree { font: 12px/1.5 ui-monospace, monospace; margin: 4px 0 10px; }
.tree details details { margin-left: 18px; }
.tree summary { font-weight: 400; }
.tree .frame { margin-left: 14px; white-space: pre; }
.tree .test { font-weight: 700; }
.tree .part { color: #b00000; font-weight: 700; }
"""


@dataclass(frozen=True)
class Bar:
    """What is drawn for one call, or for a run of calls too short to draw alone."""

    x0: float
    x1: float
    colour: str
    text: str  # written on the bar if it fits
    title: str  # the tooltip
    stuck: bool = False


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _tick_label(value: float, step: float) -> str:
    """``0``, ``200 ms``, ``1.5 s``: a tick's time in the unit its step is a whole number of."""
    if value == 0:
        return "0"
    if step >= 1:
        return f"{round(value, 6):g} s"
    return f"{round(value * 1000, 6):g} ms" if step >= 0.001 else f"{round(value * 1e6, 6):g} \u00b5s"


def _describe(piece: Slice) -> str:
    call = piece.call
    shapes = ", ".join("x".join(map(str, shape)) or "scalar" for shape in call.get("shapes") or [])
    state = "STUCK: still running at the verdict" if piece.stuck else call.get("state", "")
    if piece.died_in:
        state = "running when the rank died"
    parts = [f"rank {piece.rank}: {piece.label}", state, f"at {call.get('site')}"]
    if call.get("caller"):
        parts.append(f"via {call['caller']}")
    if shapes:
        parts.append(f"[{shapes}] {','.join(sorted(set(call.get('dtypes') or [])))}")
    if call.get("error"):
        parts.append(str(call["error"]))
    parts.append(f"{_ms(piece.start)} to {_ms(piece.end)}")
    return "\n".join(parts)


def _colour(piece: Slice) -> str:
    if piece.stuck:
        return STUCK
    if piece.died_in or piece.call.get("state") == "raised":
        return RAISED
    return KIND_COLOURS[piece.kind]


def bars(pieces: list[Slice], x_of: Callable[[float], float], min_px: float) -> list[Bar]:
    """The bars of one lane: a call at least ``min_px`` wide (or stuck) alone, shorter calls close
    together merged, so a lane holds at most about ``2 * PLOT_W / min_px`` bars."""
    runs: list[list[Slice]] = []  # the calls of each bar
    merging = False  # whether the last run is of short calls, which a short call close to it joins
    for piece in pieces:
        alone = piece.stuck or x_of(piece.end) - x_of(piece.start) >= min_px
        if merging and not alone and x_of(piece.start) - x_of(runs[-1][-1].end) < min_px:
            runs[-1].append(piece)
        else:
            runs.append([piece])
        merging = not alone
    return [_drawn(run, x_of) for run in runs]


def _drawn(run: list[Slice], x_of: Callable[[float], float]) -> Bar:
    first = run[0]
    if len(run) == 1:
        x1 = LABEL_W + PLOT_W + TAIL if first.stuck else x_of(first.end)  # stuck: on past the verdict
        return Bar(x_of(first.start), x1, _colour(first), first.label, _describe(first), first.stuck)
    colours = {_colour(p) for p in run}
    if RAISED in colours:
        colour = RAISED
    elif len(colours) == 1:
        colour = colours.pop()
    else:
        colour = KIND_COLOURS["other"]
    title = f"rank {first.rank}: {len(run)} calls, {first.label} to {run[-1].label}, merged: each too short"
    end = max(p.end for p in run)  # the last lane holds overlapping calls too (MAX_LANES)
    return Bar(x_of(first.start), x_of(end), colour, f"{len(run)} calls", title)


def _tick_step(span: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about eight ticks over ``span``."""
    raw = span / 8 if span > 0 else 0.001
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _status(rank: dict[str, Any], stuck: list[Slice]) -> tuple[str, bool]:
    """A rank's state in a few words, and whether it is stuck."""
    if stuck:
        return f"stuck in {stuck[-1].label}", True
    if not rank.get("alive", True):
        return f"died ({exit_text(rank.get('exit_code'))})", False
    if rank.get("phase") == "finished":
        return "finished, " + ("failed" if rank.get("failed") else "passed"), False
    return f"running ({rank.get('phase')}), outside any call", False


def svg(report: dict[str, Any], line: Timeline) -> str:
    """The timeline as an SVG element: a row per rank, a bar per call (or merged run of calls)."""
    ranks = report["ranks"]
    row_h = max(12, min(30, 600 // max(1, len(ranks))))
    height = AXIS_H + row_h * len(ranks) + 8
    span = line.end if line.end > 0 else 1.0

    def x_of(t: float) -> float:
        return LABEL_W + PLOT_W * t / span

    total_lanes = sum(min(MAX_LANES, n) for n in line.lanes.values())
    min_px = max(3.0, 2 * total_lanes * PLOT_W / MAX_RECTS)
    font = min(12, row_h - 3)
    out = [f'<svg width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img">']
    out.append(f"<title>{_esc(report['test'])}: timeline of every rank's calls</title>")
    culprits, waiting = set(report.get("culprits") or []), set(report.get("waiting") or [])
    for row, rank in enumerate(ranks):  # row backgrounds, a culprit's tinted
        fill = CULPRIT_ROW if rank["rank"] in culprits else "#f4f4f4" if row % 2 else "#ffffff"
        out.append(f'<rect x="0" y="{AXIS_H + row * row_h}" width="{WIDTH}" height="{row_h}" fill="{fill}"/>')
    step = _tick_step(span)
    for i in range(int(span / step + 1e-9) + 1):  # the axis: ticks and faint grid lines
        x = x_of(i * step)
        out.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height - 8}" stroke="#dddddd"/>')
        if not -30 < x - x_of(line.verdict) < 120:  # not under the verdict's label
            tick = f'<text x="{x:.1f}" y="{AXIS_H - 10}" font-size="11" fill="#666" text-anchor="middle">'
            out.append(f"{tick}{_tick_label(i * step, step)}</text>")
    by_rank: dict[int, list[Slice]] = {}
    for piece in line.slices:
        by_rank.setdefault(piece.rank, []).append(piece)
    for row, rank in enumerate(ranks):
        number = rank["rank"]
        y = AXIS_H + row * row_h
        baseline = f"{y + row_h / 2 + font / 2.8:.1f}"
        role = " culprit" if number in culprits else " waiting" if number in waiting else ""
        colour = "#b00000" if number in culprits else "#1f1f1f"
        weight = ' font-weight="700"' if role else ""
        name = f"rank {number}" + (f" &#183;{role}" if role else "")
        out.append(f'<text x="6" y="{baseline}" font-size="{font}" fill="{colour}"{weight}>{name}</text>')
        pieces = by_rank.get(number, [])
        status, is_stuck = _status(rank, [p for p in pieces if p.stuck])
        note_colour, note_weight = (STUCK, ' font-weight="700"') if is_stuck else ("#333", "")
        limit = max(8, int((WIDTH - NOTE_X) / (font * 0.55)))
        note = status if len(status) <= limit else status[: limit - 3] + "..."
        out.append(
            f'<text x="{NOTE_X}" y="{baseline}" font-size="{font}" fill="{note_colour}"{note_weight}>'
            f"<title>{_esc(rank.get('line') or status)}</title>{_esc(note)}</text>"
        )
        lanes = min(MAX_LANES, line.lanes.get(number, 1))
        lane_h = (row_h - 6) / lanes
        for lane in range(lanes):
            in_lane = [p for p in pieces if min(p.lane, MAX_LANES - 1) == lane]
            for bar in bars(in_lane, x_of, min_px):
                out.append(_bar(bar, y + 3 + lane * lane_h, lane_h, font))
        if number in line.rank_ends:
            how, when = line.rank_ends[number]
            out.append(_end_marker(number, how, when, x_of(when), y + row_h / 2, row_h))
    x_end = x_of(line.verdict)  # over every row
    dashes = 'stroke="#222" stroke-dasharray="4 3"'
    out.append(f'<line x1="{x_end:.1f}" y1="{AXIS_H - 4}" x2="{x_end:.1f}" y2="{height - 8}" {dashes}/>')
    label = f"verdict, {_ms(line.verdict)}"
    out.append(f'<text x="{x_end + 4:.1f}" y="12" font-size="11" font-weight="700">{label}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _bar(bar: Bar, top: float, height: float, font: int) -> str:
    width = max(1.0, bar.x1 - bar.x0)
    edge = f' stroke="{STUCK_EDGE}" stroke-width="1.5"' if bar.stuck else ""
    parts = [
        f'<g><title>{_esc(bar.title)}</title><rect x="{bar.x0:.1f}" y="{top:.1f}" width="{width:.1f}" '
        f'height="{height:.1f}" fill="{bar.colour}"{edge}/>'
    ]
    text = f"STUCK {bar.text}" if bar.stuck else bar.text
    fits = height >= 13 and width >= len(text) * font * 0.6 + 8
    if fits:
        weight = ' font-weight="700"' if bar.stuck else ""
        parts.append(
            f'<text x="{bar.x0 + 4:.1f}" y="{top + height / 2 + font / 2.8:.1f}" font-size="{font}" '
            f'fill="#ffffff"{weight}>{_esc(text)}</text>'
        )
    parts.append("</g>")
    return "".join(parts)


def _end_marker(rank: int, how: str, when: float, x: float, y: float, row_h: float) -> str:
    """A black dot where a rank's test ended; a dark red cross where it died."""
    r = max(3.0, min(5.0, row_h / 5))
    title = f"<title>rank {rank} {how} at {_ms(when)}</title>"
    if how == "died":
        down = f"M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}"
        up = f"M{x - r:.1f},{y + r:.1f}L{x + r:.1f},{y - r:.1f}"
        path = down + up
        return f'<path d="{path}" stroke="{STUCK_EDGE}" stroke-width="2.5">{title}</path>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="#111">{title}</circle>'


def _swatch(colour: str, edge: str = "") -> str:
    stroke = f' stroke="{edge}" stroke-width="1.5"' if edge else ""
    rect = f'<rect x="0.5" y="0.5" width="13" height="10" fill="{colour}"{stroke}/>'
    return f'<svg width="14" height="11">{rect}</svg>'


def legend() -> str:
    cross = f'<path d="M1,1L9,9M1,9L9,1" stroke="{STUCK_EDGE}" stroke-width="2.5"/>'
    items = [
        (_swatch(KIND_COLOURS["collective"]), "collective"),
        (_swatch(KIND_COLOURS["p2p"]), "send / recv"),
        (_swatch(KIND_COLOURS["batch"]), ", ".join(name for name, op in OPS.items() if op.kind == "batch")),
        (_swatch(KIND_COLOURS["group"]), f"group set-up ({INIT}, {NEW_GROUP})"),
        (_swatch(RAISED), "raised, or the rank died in it"),
        (_swatch(STUCK, STUCK_EDGE), "stuck: still running at the verdict"),
        ('<svg width="10" height="10"><circle cx="5" cy="5" r="4" fill="#111"/></svg>', "rank's test ended"),
        (f'<svg width="10" height="10">{cross}</svg>', "rank died"),
    ]
    spans = "".join(f"<span>{mark}{_esc(text)}</span>" for mark, text in items)
    hint = "<span>hover a bar for its call; the dashed line is the verdict</span>"
    return f'<div class="legend">{spans} {hint}</div>'


def _pre(text: str) -> str:
    cut = len(text) > MAX_TEXT
    shown = text[-MAX_TEXT:] if cut else text
    return f"<pre>{'(earlier text left out)' + chr(10) if cut else ''}{_esc(shown.rstrip())}</pre>"


def _details(report: dict[str, Any]) -> list[str]:
    """What the page shows below the timeline: each rank's state, then what went wrong, the ranks'
    stacks and stderr made readable as the failure text makes them."""
    test_path = str(report["test"]).split("::")[0]
    out: list[str] = []
    if report.get("start_error"):
        out += ["<h2>No rank ran the test</h2>", _pre(report["start_error"])]
    if report["ranks"]:
        rows = "".join(f"<tr><td>{_esc(r.get('line') or r['rank'])}</td></tr>" for r in report["ranks"])
        out += ["<h2>Ranks</h2>", f"<table>{rows}</table>"]
    for key, title in (("sequence_differences", "The ranks' collective sequences differ"),
                       ("unfinished_work", "Asynchronous work still in flight after the test")):
        if report.get(key):
            out += [f"<h2>{title}</h2>", _pre("\n".join(str(d.get("text", d)) for d in report[key]))]
    out += _stack_tree(report, test_path)
    for rank in report["ranks"]:
        sections: list[tuple[str, Any, Callable[[str, str], str], str]] = [
            ("failed", rank.get("failure"), lambda text, _: text, " open"),
            ("Python stacks when stopped", rank.get("stack"), format_dump, " open"),
            ("stderr", (rank.get("output") or {}).get("stderr"), format_stack, ""),
        ]
        for what, text, readable, opened in sections:
            if text and str(text).strip():
                summary = f"<summary>rank {rank['rank']}: {_esc(what)}</summary>"
                out.append(f"<details{opened}>{summary}{_pre(readable(str(text), test_path))}</details>")
    return out


def _stack_tree(report: dict[str, Any], test_path: str) -> list[str]:
    """The merged main threads as nested ``<details>``, a branch's ranks in red where not all;
    nothing under two ranks' stacks."""
    if not report.get("stack_tree"):
        return []
    tree = stack_tree.from_json(report["stack_tree"])
    if len(tree.ranks) < 2:
        return []
    paths = stack_tree.Paths(test_path, tree)

    def frame(node: stack_tree.Node) -> str:
        label = _esc(paths.label(node.frame))
        return f'<span class="test">{label}</span>' if paths.is_test(node.frame) else label

    def ranks(among: list[int]) -> str:
        label = f"[{_esc(stack_tree.ranks_label(among, tree.ranks))}]"
        return f' <span class="part">{label}</span>' if len(among) < len(tree.ranks) else f" {label}"

    def branch(node: stack_tree.Node) -> str:
        nodes = stack_tree.chain(node)
        rest = "".join(f'<div class="frame">{frame(n)}</div>' for n in nodes[1:])
        if nodes[-1].children and (ended := stack_tree.ends_here(nodes[-1])):
            rest += f'<div class="frame">(stack ends at the frame above){ranks(ended)}</div>'
        kids = "".join(branch(child) for child in nodes[-1].children)
        return f"<details open><summary>{frame(node)}{ranks(node.ranks)}</summary>{rest}{kids}</details>"

    title = "Python stacks merged: each rank's main thread, outermost frame first"
    return [f"<h2>{title}</h2>", f'<div class="tree">{"".join(branch(root) for root in tree.roots)}</div>']


def page(report: dict[str, Any]) -> str:
    """The whole HTML page of one failing test's report."""
    line = timeline(report)
    culprits = rank_list(report["culprits"]) if report.get("culprits") else "none"
    waiting = rank_list(report["waiting"]) if report.get("waiting") else "none"
    facts = (
        f"verdict: {_esc(verdict_name(report))} &#183; at fault: {_esc(culprits)} &#183; "
        f"waiting: {_esc(waiting)} &#183; "
        f"{_esc(report.get('world_size'))} ranks, {_esc(report.get('backend'))}"
    )
    body = [
        f"<h1>{_esc(report['test'])}</h1>",
        f'<p class="headline">{_esc(headline(report))}</p>',
        f'<p class="facts">{facts}</p>',
    ]
    if report["ranks"]:
        body += [svg(report, line), legend()]
    body += _details(report)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            f"<title>{_esc(report['test'])}</title>",
            f"<style>{STYLE}</style></head><body>",
            *body,
            "</body></html>",
        ]
    )

"""The ranks' Python stacks merged into one tree, as LLNL's STAT merges an MPI job's, so that the
rank in an odd place stands out among 144 (``[rank 60; not ranks 0-59, 61-143]``).

Only the main thread, which runs the test, is merged; frames merge on file, line and function.
The other threads are told apart here (:func:`thread_kind`): pytest-ddp's own, idle library ones,
and the rest, which the report's stacks show.  Pure: dump text in, tree and lines out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pytest_ddp.diagnose.phrases import rank_list

PLUGIN_PART = "/pytest_ddp/"  # in the path of pytest-ddp's files, installed or not
# Files of the harness under the test: pytest, pluggy, pytest-ddp, and the forkserver's start of a rank.
HARNESS_PARTS = ("/pluggy/", "/_pytest/", PLUGIN_PART, "/multiprocessing/")
HARNESS_NAMES = ("<frozen runpy>", "<string>")
HARNESS_TEXT = "(pytest and pytest-ddp frames)"
MAX_FRAMES = 100  # per thread, the innermost: faulthandler writes no more (text with more is not its dump)
TREE_LINES = 40  # of the text tree; the JSON keeps all of it

# faulthandler: '  File "/x.py", line 12 in f' ('line ???' when unknown); traceback: ', line 12, in f'.
_FILE = re.compile(r'\s*File "(?P<file>.*)", line ')
_FRAME = re.compile(r'\s*File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.*)$')
_THREAD = re.compile(r"(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+|Stack \(most recent call first\)")
_INSTALLED = re.compile(r"^.*/(?:site|dist)-packages/")  # up to the last one
_STDLIB = re.compile(r"^.*/lib/python\d+\.\d+/")
_CUT = "..."  # faulthandler's line after its 100th frame (indented) or its 100th thread (not)


@dataclass(frozen=True)
class Frame:
    """A frame of a rank's stack; or, by ``kind``, a run of harness frames collapsed into one
    (``harness``), or the outer frames faulthandler did not write (``cut``)."""

    file: str
    line: int | None
    function: str
    kind: str = "code"


HARNESS = Frame("", None, "", "harness")
CUT = Frame("", None, "", "cut")


@dataclass
class Node:
    frame: Frame
    ranks: list[int]  # ascending
    children: list[Node] = field(default_factory=list)


@dataclass
class Tree:
    roots: list[Node]
    ranks: list[int]  # those whose main thread is in it
    unfound: list[int]  # those with a dump but no main thread's frames in it

    def differs(self) -> bool:
        """Whether the ranks' main threads are not all the very same stack."""
        return sum(1 for node in _walk(self.roots) if ends_here(node)) > 1


def harness_line(line: str) -> bool:
    """Whether a stack or traceback line is a frame of pytest, pluggy or pytest-ddp."""
    found = _FILE.match(line)
    return found is not None and _harness(found["file"])


def _harness(file: str) -> bool:
    return file in HARNESS_NAMES or any(part in file for part in HARNESS_PARTS)


@dataclass
class Thread:
    """A thread of a faulthandler dump: its header line and the lines under it, innermost frame first."""

    header: str
    lines: list[str]


def threads(dump: str) -> tuple[list[Thread], int | None, bool]:
    """The threads of a faulthandler dump in its order, which of them is the main one (None if
    none), and whether it stopped at its 100th thread."""
    found: list[Thread] = []
    threads_cut = False
    for line in dump.splitlines():
        if _THREAD.match(line):
            found.append(Thread(line, []))
        elif line == _CUT:
            threads_cut = True
        elif found:
            found[-1].lines.append(line)
    if threads_cut:  # the main thread, the oldest, is not among them: the ``Current thread`` stands in
        main = next((i for i, thread in enumerate(found) if thread.header.startswith("Current thread")), None)
    else:  # CPython lists threads newest first
        main = len(found) - 1 if found else None
    return found, main, threads_cut


def main_thread(dump: str) -> list[Frame]:
    """The frames of the main thread in a faulthandler dump of every thread (:func:`threads`),
    outermost first, each run of harness frames as one :data:`HARNESS`; [] when it has none."""
    found, main, _ = threads(dump)
    return _frames(found[main].lines) if main is not None else []


# A thread's innermost frame when it idles in the standard library: (file, function).
IDLE_WAITS = {
    ("threading.py", "wait"),
    ("threading.py", "_wait_for_tstate_lock"),
    ("selectors.py", "select"),
    ("socket.py", "accept"),
    ("queue.py", "get"),
    ("concurrent/futures/thread.py", "_worker"),  # a pool's worker blocks in its queue's get, in C
}
_BOOTSTRAP = {"_bootstrap", "_bootstrap_inner", "run"}  # threading.py's frames under every thread's target


def _written(lines: list[str]) -> list[Frame]:
    """A thread's frames as written, innermost first, without threading.py's start of it."""
    frames, _ = _parsed(lines)
    while frames and short_file(frames[-1].file) == "threading.py" and frames[-1].function in _BOOTSTRAP:
        frames.pop()
    return frames


def thread_kind(thread: Thread) -> str:
    """``own``: a thread of pytest-ddp's (the function it runs is the plugin's); ``idle``: a library
    thread idling (its every frame the standard library's or an installed package's, the innermost
    a wait of :data:`IDLE_WAITS`); else ``other``."""
    frames = _written(thread.lines)
    if not frames:
        return "other"  # a thread running C code: what it does is not written
    if PLUGIN_PART in frames[-1].file:
        return "own"
    library = all(short_file(f.file) != f.file and PLUGIN_PART not in f.file for f in frames)
    return "idle" if library and (short_file(frames[0].file), frames[0].function) in IDLE_WAITS else "other"


def idle_label(thread: Thread) -> str:
    """``pytest_rerunfailures.py run_server, waiting in socket.py accept``: what an idle thread
    runs, and where it waits."""
    frames = _written(thread.lines)
    runs, waits = frames[-1], frames[0]
    label = f"{short_file(runs.file)} {runs.function}"
    return label if waits == runs else f"{label}, waiting in {short_file(waits.file)} {waits.function}"


def _parsed(lines: list[str]) -> tuple[list[Frame], bool]:
    """A thread's lines as frames, innermost first, and whether faulthandler cut its outer frames."""
    inner_first: list[Frame] = []
    cut = False
    for line in lines:
        found = _FRAME.match(line)
        if found:
            number = found["line"]
            line_number = int(number) if number.isdigit() else None
            inner_first.append(Frame(found["file"], line_number, found["function"]))
        elif line.strip() == _CUT:
            cut = True
    return inner_first, cut


def _frames(lines: list[str]) -> list[Frame]:
    """A thread's lines (innermost first) as frames, outermost first, harness runs collapsed."""
    inner_first, cut = _parsed(lines)
    if len(inner_first) > MAX_FRAMES:
        inner_first, cut = inner_first[:MAX_FRAMES], True
    frames: list[Frame] = [CUT] if cut and inner_first else []
    for frame in reversed(inner_first):
        if not _harness(frame.file):
            frames.append(frame)
        elif frames[-1:] != [HARNESS]:
            frames.append(HARNESS)
    return frames


def merged(dumps: dict[int, str]) -> Tree:
    """The prefix tree of the main threads of the ranks' faulthandler dumps (outermost frame
    first); children in the order of their lowest rank."""
    stacks = {rank: main_thread(dump) for rank, dump in dumps.items()}
    roots: list[Node] = []
    index: dict[tuple[int, Frame], Node] = {}  # (id of the parent, 0 for none; frame) -> its node
    for rank, frames in sorted(stacks.items()):
        level, parent = roots, 0
        for frame in frames:
            node = index.get((parent, frame))
            if node is None:
                node = index[parent, frame] = Node(frame, [])
                level.append(node)
            node.ranks.append(rank)
            level, parent = node.children, id(node)
    found = sorted(rank for rank, frames in stacks.items() if frames)
    return Tree(roots, found, sorted(rank for rank, frames in stacks.items() if not frames))


def ends_here(node: Node) -> list[int]:
    """The ranks whose innermost frame is ``node``: all of a leaf's, some of a branch point's."""
    below = {rank for child in node.children for rank in child.ranks}
    return [rank for rank in node.ranks if rank not in below]


def ranks_label(ranks: list[int], among: list[int]) -> str:
    """``ranks 0-59, 61-143; not rank 60``: the ranks, and those of ``among`` not in them."""
    missing = sorted(set(among) - set(ranks))
    return rank_list(ranks) + (f"; not {rank_list(missing)}" if missing else "")


class Paths:
    """Frames written short: the test file as in the test's id, files under it from the same root,
    installed ones from their package (``torch/distributed/c10d_logger.py``)."""

    def __init__(self, test_path: str, tree: Tree) -> None:
        self.test_path = test_path
        self.root: str | None = None
        for node in _walk(tree.roots):
            if test_path and self.is_test(node.frame):
                self.root = node.frame.file[: len(node.frame.file) - len(test_path)]
                break

    def is_test(self, frame: Frame) -> bool:
        if not self.test_path:
            return False
        return frame.file == self.test_path or frame.file.endswith("/" + self.test_path)

    def label(self, frame: Frame) -> str:
        if frame.kind == "harness":
            return HARNESS_TEXT
        if frame.kind == "cut":
            return f"(outer frames not dumped: faulthandler writes a thread's innermost {MAX_FRAMES})"
        file = short_file(frame.file)
        if file == frame.file and self.root and file.startswith(self.root):
            file = file[len(self.root) :]
        return f"{file}:{'?' if frame.line is None else frame.line} in {frame.function}"


def short_file(file: str) -> str:
    """An installed file from its package (``torch/distributed/c10d_logger.py``), one of the
    standard library's from its root (``threading.py``); any other as it is."""
    short = _INSTALLED.sub("", file, count=1)
    return short if short != file else _STDLIB.sub("", file, count=1)


def _walk(nodes: list[Node]) -> Iterable[Node]:
    """Every node, depth first."""
    stack = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def chain(node: Node) -> list[Node]:
    """``node`` and the frames under it that all its ranks share, up to where they part or end."""
    nodes = [node]
    while len(nodes[-1].children) == 1 and nodes[-1].children[0].ranks == node.ranks:
        nodes.append(nodes[-1].children[0])
    return nodes


def render(tree: Tree, test_path: str, limit: int = TREE_LINES) -> list[str]:
    """The tree as text, outermost frame first, a branch indented where ranks part ways and
    labelled (``[rank 60; not ranks 0-59, 61-143]``), the test file's lines marked with ``>``;
    at most ``limit`` lines, and a line saying what was left out."""
    paths = Paths(test_path, tree)
    lines: list[str] = []

    def branch(node: Node, head: str, body: str) -> None:
        nodes = chain(node)
        for i, n in enumerate(nodes):
            mark = "> " if paths.is_test(n.frame) else "  "
            label = f"  [{ranks_label(n.ranks, tree.ranks)}]" if i == 0 else ""
            lines.append(f"{mark}{head if i == 0 else body}{paths.label(n.frame)}{label}")
        if nodes[-1].children and (stopped := ends_here(nodes[-1])):
            lines.append(f"  {body}|-- (stack ends at the frame above)  [{ranks_label(stopped, tree.ranks)}]")
        under(nodes[-1].children, body)

    def under(kids: list[Node], body: str) -> None:
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            branch(kid, body + ("`-- " if last else "|-- "), body + ("    " if last else "|   "))

    if len(tree.roots) == 1:
        branch(tree.roots[0], "", "")
    else:
        under(tree.roots, "")
    if len(lines) > limit:
        left = len(lines) - limit + 1
        lines = [*lines[: limit - 1], f"  ({left} more lines: the JSON report's stack_tree has them all)"]
    if tree.unfound:
        lines.append(f"  (no main thread in the dump of {rank_list(tree.unfound)}: see the stacks below)")
    return lines


def to_json(tree: Tree) -> dict[str, Any]:
    """The tree as data: ``ranks``, ``unfound`` (dumps with no main thread) and ``roots``, each
    node its ``file``, ``line``, ``function``, ``kind`` (``code``, ``harness``: harness frames
    collapsed, ``cut``: outer frames not dumped), ``ranks`` and ``children``."""

    def node(n: Node) -> dict[str, Any]:
        frame = n.frame
        return {"file": frame.file or None, "line": frame.line, "function": frame.function or None,
                "kind": frame.kind, "ranks": n.ranks, "children": [node(c) for c in n.children]}

    roots = [node(r) for r in tree.roots]
    return {"thread": "main", "ranks": tree.ranks, "unfound": tree.unfound, "roots": roots}


def from_json(data: dict[str, Any]) -> Tree:
    """The tree :func:`to_json` wrote."""

    def node(n: dict[str, Any]) -> Node:
        frame = Frame(n["file"] or "", n["line"], n["function"] or "", n["kind"])
        return Node(frame, n["ranks"], [node(c) for c in n["children"]])

    return Tree([node(r) for r in data["roots"]], data["ranks"], data["unfound"])

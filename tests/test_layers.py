"""The package's folders are its layers: every import goes one way, and no module imports itself
back through others (docs/design.md, "The folders").  Read from the source: no processes."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest_ddp

PACKAGE = Path(pytest_ddp.__file__).parent
# The face: the pytest entry, the controller and the public API may import anything.
FACE = {"pytest_ddp", "pytest_ddp.plugin", "pytest_ddp.controller", "pytest_ddp.api"}
# What each layer may import besides itself.  groups/ may import one module of rank/: the entry
# point a spawner starts (as pytest-xdist's workermanage imports its remote module).
ALLOWED: dict[str, set[str]] = {
    "launched": {"groups", "config", "common"},
    # Adopted test classes run in a rank: who it is and its default group's life (rank/), and the
    # exchanges of torch's harness recorded as collectives (record/).
    "adopt": {"rank", "record", "common"},
    "report": {"groups", "diagnose", "common"},
    "groups": {"config", "diagnose", "common", "pytest_ddp.rank.entry"},
    "diagnose": {"common", "faults"},
    "record": {"common", "faults"},
    "rank": {"record", "common", "faults"},
    "config": {"common", "faults"},
    "faults": {"common"},
    "common": set(),
}
# A module near the cap is split where its concerns part (one job per module), never compressed
# to fit: no docstrings reflowed, no loops folded into conditional expressions.
MAX_LINES = 600


def layer(module: str) -> str:
    """``face``, a subpackage's name, or ``faults`` (a public module that lower layers use)."""
    if module in FACE:
        return "face"
    parts = module.split(".")
    return "faults" if parts[1] == "faults" else parts[1]


def sources(root: Path = PACKAGE) -> dict[str, str]:
    """Every module of the package: its dotted name -> its source."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path.read_text()
    return found


def imports(module: str, source: str, modules: Mapping[str, str]) -> Iterator[tuple[str, int]]:
    """The package's modules that ``module`` imports, anywhere in it (function-local and
    TYPE_CHECKING imports included), with the line of each import."""
    package = module if module in modules and _is_package(module, modules) else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from a import b``: b is a module of a, or a name defined in a.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "pytest_ddp" and target != module:
                yield target, node.lineno


def _is_package(module: str, modules: Mapping[str, str]) -> bool:
    return any(other.startswith(module + ".") for other in modules)


def violations(modules: Mapping[str, str]) -> list[str]:
    """Each import against the direction of the layers, as ``importer:line -> imported``."""
    found = []
    for module, source in modules.items():
        own = layer(module)
        if own == "face":
            continue
        for target, line in imports(module, source, modules):
            theirs = layer(target)
            if theirs != own and theirs not in ALLOWED[own] and target not in ALLOWED[own]:
                found.append(f"{module}:{line} -> {target}")
    return sorted(found)


def cycles(modules: Mapping[str, str]) -> list[list[str]]:
    """The import cycles between modules (each strongly connected component of more than one)."""
    graph = {m: sorted({t for t, _ in imports(m, s, modules) if t in modules}) for m, s in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_every_import_goes_the_way_of_the_layers() -> None:
    assert violations(sources()) == []


def test_no_import_cycle() -> None:
    assert cycles(sources()) == []


def test_every_module_belongs_to_a_layer() -> None:
    assert {layer(m) for m in sources()} - {"face"} <= set(ALLOWED)


def test_no_module_over_the_line_cap() -> None:
    long = {m: n for m, s in sources().items() if (n := len(s.splitlines())) > MAX_LINES}
    assert long == {}


# -- the checker itself, on hand-made packages ----------------------------------------------


def test_a_function_local_import_against_the_direction_is_found() -> None:
    modules = {
        "pytest_ddp.common.ops": "",
        "pytest_ddp.diagnose.wording": "",
        "pytest_ddp.rank.session": "def f():\n    from pytest_ddp.diagnose.wording import text\n",
        "pytest_ddp.rank.entry": "from pytest_ddp.common import ops\n",
    }
    assert violations(modules) == ["pytest_ddp.rank.session:2 -> pytest_ddp.diagnose.wording"]


def test_groups_may_import_the_rank_entry_point_only() -> None:
    modules = {
        "pytest_ddp.rank.entry": "",
        "pytest_ddp.rank.channel": "",
        "pytest_ddp.groups.group": "from pytest_ddp.rank.entry import main\nfrom pytest_ddp.rank import channel\n",
    }
    assert violations(modules) == ["pytest_ddp.groups.group:2 -> pytest_ddp.rank.channel"]


def test_a_relative_import_and_the_package_itself_count() -> None:
    modules = {
        "pytest_ddp": "",
        "pytest_ddp.plugin": "",
        "pytest_ddp.common.ops": "from ..plugin import x\nimport pytest_ddp\n",
    }
    assert violations(modules) == [
        "pytest_ddp.common.ops:1 -> pytest_ddp.plugin",
        "pytest_ddp.common.ops:2 -> pytest_ddp",
    ]


def test_a_cycle_through_a_type_checking_import_is_found() -> None:
    modules = {
        "pytest_ddp.launched.world": "from pytest_ddp.launched.group import LaunchedGroup\n",
        "pytest_ddp.launched.group": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pytest_ddp.launched.world import LaunchedWorld\n",
        "pytest_ddp.launched.host": "from pytest_ddp.launched import world\n",
    }
    assert cycles(modules) == [["pytest_ddp.launched.group", "pytest_ddp.launched.world"]]


# -- module paths written as text -----------------------------------------------------------

DOTTED = re.compile(r"\bpytest_ddp(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
ROOT = PACKAGE.parent
# Where the package's module paths are written as text: docstrings, the forkserver's preload
# list, ``-m`` commands, the tests' generated conftests, the docs.
WRITTEN_IN = ["pytest_ddp/**/*.py", "pytest_ddp/**/*.cpp", "tests/**/*.py", "benchmarks/*.py", "examples/**/*.py",
              "docs/**/*.md", "README.md", "pyproject.toml", "Makefile"]


def top_level_names(source: str) -> dict[str, ast.AST]:
    """The names a module defines at its top level (functions, classes, assignments, imports,
    and those its ``__all__`` lists)."""
    names: dict[str, ast.AST] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names[target.id] = node
                if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                    # Public names a module defines on first use (a module __getattr__).
                    names.update(dict.fromkeys(ast.literal_eval(node.value), node))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def unresolved(dotted: str, modules: Mapping[str, str]) -> bool:
    """Whether ``dotted`` names neither a module of the package nor a name defined in one
    (a class's own attributes are looked up in its body too)."""
    parts = dotted.split(".")
    if parts[-1].startswith("__"):  # a module's own attribute: __file__, __version__
        parts.pop()
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            break
    else:
        return True
    rest = parts[cut:]
    if not rest:
        return False
    names = top_level_names(modules[module])
    if rest[0] not in names:
        return True
    node = names[rest[0]]
    if len(rest) > 1 and isinstance(node, ast.ClassDef):
        members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        members |= {t.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(t := n.target, ast.Name)}
        members |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        return rest[1] not in members
    return False


def test_every_module_path_written_as_text_names_a_module_or_a_name_in_one() -> None:
    """An import checker does not see these: a module moved or renamed leaves them pointing nowhere."""
    modules = sources()
    found = []
    for pattern in WRITTEN_IN:
        for path in sorted(ROOT.glob(pattern)):
            if path == Path(__file__):  # its hand-made packages name modules that do not exist
                continue
            for line_number, line in enumerate(path.read_text().splitlines(), 1):
                for dotted in DOTTED.findall(line):
                    if unresolved(dotted.rstrip("."), modules):
                        found.append(f"{path.relative_to(ROOT)}:{line_number} {dotted}")
    assert found == []


def test_the_checker_of_written_paths_finds_a_moved_module_and_a_missing_name() -> None:
    entry = "def serve():\n    pass\nclass Channel:\n    def event(self): pass\n"
    modules = {"pytest_ddp": "", "pytest_ddp.rank.entry": entry}
    assert not unresolved("pytest_ddp.rank.entry.serve", modules)
    assert not unresolved("pytest_ddp.rank.entry.Channel.event", modules)
    assert unresolved("pytest_ddp.rank_session", modules)  # the module moved
    assert unresolved("pytest_ddp.rank.entry.run_pytest", modules)  # not defined there
    assert unresolved("pytest_ddp.rank.entry.Channel.commands", modules)

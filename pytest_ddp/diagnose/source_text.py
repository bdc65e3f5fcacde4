"""The user's source text, parsed, and the names its code goes by: what
:mod:`pytest_ddp.diagnose.code_paths`, :mod:`pytest_ddp.diagnose.rank_tests` and
:mod:`pytest_ddp.diagnose.code_ties` read.  Pure."""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator

# A file's text by the name its call sites give it; None where it cannot be read.
Source = Callable[[str], str | None]


@functools.lru_cache(maxsize=8)  # each rule asks of the same few files, once per verdict
def parsed(source: str) -> ast.Module | None:
    """The text's tree (not to be changed: it is shared); None where it is no Python this reads,
    or nested too deep to parse."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def named(node: ast.expr) -> str | None:
    """The name an expression goes by: ``rank`` of ``rank``, ``self.rank`` and ``dist.get_rank()``
    (``get_rank``); a call's is the name it calls by, ``f`` of ``f(...)`` and of ``x.f(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def function_at(tree: ast.Module, line: int) -> ast.FunctionDef | None:
    """The innermost (non-async) function whose body holds ``line``."""
    holding = [node for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.body[0].lineno <= line <= (node.end_lineno or 0)]
    return max(holding, key=lambda node: node.lineno, default=None)


def names_set(body: list[ast.stmt]) -> set[str]:
    """The names (``x``, ``self.x``'s ``x``) the statements assign to, augmented or not."""
    targets: list[ast.expr] = []
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Assign):
                targets.extend(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets.append(node.target)
    return {name for name in map(named, targets) if name is not None}


def own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The node and what it holds, its nested functions and classes left out (walked without
    recursion: an expression thousands of terms deep parses, and must not overflow the stack)."""
    todo = [node]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node) if not isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))


COMPOUND = (
    ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef
)

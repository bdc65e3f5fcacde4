"""Could a rank's code have gone from one of its calls to the next without making a call it did
not make?  Pure: the source text in, an answer out.

Breaks a two-rank tie history cannot: in ``for ...: dist.all_reduce(g); dist.broadcast(g, 0)`` no
path goes from the broadcast back to it without the all_reduce, so a rank whose broadcast came
right after its broadcast departed from its code.  More questions of the same text: which exits
could a process that ended between calls have taken (:func:`exits_after`), and which ``break`` or
``return`` a rank that went its own way (:func:`leaves_in_own_branch`)?  Which ranks a line runs
on is :mod:`pytest_ddp.diagnose.rank_tests`'.

Sound, or silent: a statement makes a call only where it calls the recorded op by name, not under
a condition (``if``-expression, ``and``/``or``, lambda, comprehension), and the flow is
over-approximated (any statement may raise and leave the function, which may be called again; a
``try`` handler may follow any statement of its body).  Code the walk does not know (generators,
``match``, ``except*``, async code, a line outside any function) answers None."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter

from pytest_ddp.common.ops import SENDS
from pytest_ddp.diagnose import rank_tests
from pytest_ddp.diagnose.source_text import COMPOUND, function_at, named, names_set, own_nodes, parsed

_EXIT = "exit"  # the function's end: returned or raised, and maybe called again
_TRY_STAR = tuple(getattr(ast, name) for name in ["TryStar"] if hasattr(ast, name))  # except*: Python 3.11+
_UNKNOWN = (ast.Match, ast.AsyncFor, ast.AsyncWith, ast.Yield, ast.YieldFrom, ast.Await, *_TRY_STAR)
_CONDITIONAL = (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class _Unknown(Exception):
    """The function holds code whose flow this module does not follow."""


def calls_between(source: str, start: int, end: int, made: dict[int, str]) -> list[int] | None:
    """Where every way from the statement at line ``start`` to the one at ``end`` passes a
    statement calling by name the op recorded at its line (``made``: line -> op), the lines of
    those calls met (those that alone would have led there, else all); ``[]`` where a way passes
    none; None where the code cannot tell."""
    walk = _flow_of(source, start, end)
    if walk is None:
        return None
    flow, first, last = walk
    blocking = {s for s in flow.statements if s is not last and _calls_by_name(s, made)}
    reached, met = _walk(flow, first, last, blocking)
    if reached:
        return []
    if not met:  # no way at all, calls or not: not code this module follows
        return None
    # The calls met that, made, would each have led there alone (else all of them).
    alone = sorted(s.lineno for s in met if _walk(flow, first, last, blocking - {s})[0])
    return alone or sorted(s.lineno for s in met)


_EXITS = frozenset({"_exit", "exit", "quit"})  # os._exit, sys.exit, the site module's exit and quit


def exits_after(source: str, start: int, made: dict[int, str]) -> list[int] | None:
    """The lines of the statements calling an exit by name (``os._exit``, ``sys.exit``) that the
    code may reach from the statement at line ``start`` before any statement calling the op
    recorded at its line (``made``, as :func:`calls_between`'s): where a process that ended
    outside any call may have left; None where the code cannot tell."""
    def exits(statement: ast.stmt) -> bool:
        return not isinstance(statement, COMPOUND) and any(
            named(call) in _EXITS for call in _unconditional_calls(statement))

    reached = _reached_before_calls(source, start, made, ends=exits)
    return None if reached is None else sorted(s.lineno for s in reached if exits(s))


@dataclass(frozen=True)
class Leave:
    """A ``break`` or ``return`` a rank may have left by: its line, and the line of the innermost
    ``if`` or ``while`` holding it, whose test singles out that rank (``own``) or else reads a value
    that may differ between ranks (:func:`pytest_ddp.diagnose.rank_tests.differs_by_rank`)."""

    line: int
    test: int
    own: bool
    leaves: tuple[int, int]  # the first and last lines of the loop a break, or function a return, leaves


def leaves_in_own_branch(
    source: str, start: int, made: dict[int, str], rank: int, from_entry: bool = False
) -> list[Leave] | None:
    """The ``break`` and ``return`` statements the code may reach from the statement at line
    ``start`` (``from_entry``: from the start of the function holding it) before any statement
    calling the op recorded at its line (as :func:`exits_after`), in a branch of the code for
    ``rank`` alone (the innermost :func:`pytest_ddp.diagnose.rank_tests.one_rank_branch` holding
    them singles out that rank) or, where none is, under a test of a value that may differ between
    ranks (and singles out no other rank): how a rank that returned while its peers went on may
    have left (speechbrain#2051: ``if rank == 0 and epoch == 1: break``, an early stop decided on
    the main process only; pytorch#41665: ``if rank == 1: return`` before ``init_process_group``;
    yolov5#4576: ``if stop: break`` where ``stop`` is set under ``if rank == 0:``;
    transformers#17478: a patience counter of each process's own metric); None where the code
    cannot tell."""
    tree = parsed(source)
    reached = None if tree is None else _reached_before_calls(source, start, made, from_entry=from_entry)
    function = None if tree is None else function_at(tree, start)
    if tree is None or reached is None or function is None:
        return None
    differs = rank_tests.differs_by_rank(function)
    found = []
    ways_out = [s for s in reached if isinstance(s, (ast.Break, ast.Return))]
    for statement in sorted(ways_out, key=attrgetter("lineno")):
        line, loop = statement.lineno, _loop_left(function, statement)
        leaves: ast.stmt = function if loop is None else loop
        left = leaves.lineno, leaves.end_lineno or line
        one = rank_tests.branch_for_one_rank(function, line)
        if one is not None:
            if one[1] == rank:
                found.append(Leave(line, one[0], True, left))
            continue
        tests = [b for b in rank_tests.branches_holding(function, line) if rank_tests.reads(b.test, differs)]
        if not tests or any(rank_tests.true_on(b.test, rank) is False for b in tests):
            continue
        # a loop over values that differ between ranks also ends by itself: a counter of its steps
        # (``if step >= max_steps: break``) differs too, and tells nothing of which way it left
        if loop is not None and rank_tests.reads(rank_tests.loop_head(loop), differs):
            return None
        found.append(Leave(line, tests[0].lineno, False, left))
    return found


def sends_after(source: str, waited: int, entered: int, sender: int, receiver: int,
                exchanged: list[int]) -> int | None:
    """Where the statements of one function's body holding lines ``waited`` and ``entered`` come in
    that order, with nothing between them or after ``waited`` in the first that returns or raises,
    no loop around ``waited`` in it, and none of ``exchanged`` (the lines of the sender's sends and
    receives with the receiver) in it, the second a simple statement that reads a name the first
    sets: the line of the first send (:func:`_sends`) after the second, in a later statement of
    the body, that the code may make on ``sender``, with no ``return`` or ``raise`` before it. A
    rank at ``waited`` reaches ``entered`` only after, and with what it received there; a rank at
    ``entered`` sends only after. None where none does, or the code cannot tell."""
    tree = parsed(source)
    function = None if tree is None else function_at(tree, waited)
    if tree is None or function is None or function is not function_at(tree, entered):
        return None
    body = function.body
    w, e = (next((i for i, s in enumerate(body) if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
            for line in (waited, entered))
    if w is None or e is None or w >= e or isinstance(body[e], COMPOUND):
        return None
    first, last = body[w].lineno, body[w].end_lineno or body[w].lineno
    if any(first <= line <= last for line in exchanged) or any(
            isinstance(n, (ast.For, ast.While)) and n.lineno <= waited <= (n.end_lineno or n.lineno)
            for n in own_nodes(body[w])):
        return None  # went through that exchange before, or may go round it again
    if any(isinstance(n, (ast.Return, ast.Raise)) and (i > w or n.lineno > waited)
           for i in range(w, e) for n in own_nodes(body[i])):
        return None
    read = {n.id for n in own_nodes(body[e]) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if not read & names_set([body[w]]):
        return None  # the collective does not need what was received: either order may be meant
    sending = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
               and any(_sends(n, receiver) for n in own_nodes(node))}
    for statement in body[e + 1:]:
        calls = [n for n in own_nodes(statement) if isinstance(n, ast.Call) and (
            _sends(n, receiver) or named(n) in sending)]
        made = [call for call in calls if _may_run_on(function, call.lineno, sender)]
        if made:
            return min(call.lineno for call in made)
        if any(isinstance(n, (ast.Return, ast.Raise)) for n in own_nodes(statement)):
            return None  # it may leave before
    return None


def _sends(node: ast.AST, receiver: int) -> bool:
    """A call of a send by name (:data:`pytest_ddp.common.ops.SENDS`) given a destination
    (``dst=``, ``dest=``, or a second argument), not one whose literal destination is another rank
    (a generator's or a pipe's ``send(x)`` takes no destination)."""
    if not isinstance(node, ast.Call) or named(node) not in SENDS:
        return False
    given = [k.value for k in node.keywords if k.arg in ("dst", "dest")] or node.args[1:2]
    if not given:
        return False
    literal = given[0].value if isinstance(given[0], ast.Constant) else None
    return not isinstance(literal, int) or literal == receiver


def _may_run_on(function: ast.FunctionDef, line: int, rank: int) -> bool:
    """No ``if`` or ``while`` around ``line`` tests the rank's number so that ``rank`` never gets
    there (:func:`pytest_ddp.diagnose.rank_tests.true_on`)."""
    for node in ast.walk(function):
        if not isinstance(node, (ast.If, ast.While)):
            continue
        held = rank_tests.true_on(node.test, rank)
        if node.body and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0) and held is False:
            return False
        if node.orelse and node.orelse[0].lineno <= line <= (node.orelse[-1].end_lineno or 0) and held:
            return False
    return True


def _loop_left(function: ast.FunctionDef, statement: ast.stmt) -> ast.For | ast.While | None:
    """The loop a ``break`` leaves, its innermost; None for a ``return``, which leaves the function."""
    if not isinstance(statement, ast.Break):
        return None
    loops = [node for node in ast.walk(function) if isinstance(node, (ast.For, ast.While))
             and node.body[0].lineno <= statement.lineno <= (node.body[-1].end_lineno or 0)]
    return max(loops, key=lambda node: node.lineno, default=None)


def _reached_before_calls(
    source: str, start: int, made: dict[int, str], ends: Callable[[ast.stmt], bool] = lambda s: False,
    from_entry: bool = False,
) -> set[ast.stmt] | None:
    """The statements the code may reach from the statement at line ``start`` (``from_entry``: from
    the start of its function) without passing a statement calling the op recorded at its line, or
    one that ``ends`` the process; None where the code cannot tell."""
    walk = _flow_of(source, start, start)
    if walk is None:
        return None
    flow, first, _ = walk
    blocking = {s for s in flow.statements if _calls_by_name(s, made)}
    seen: set[ast.stmt | str] = set()
    todo = list(flow.after(_EXIT if from_entry else first))
    while todo:
        node = todo.pop()
        if node in seen or node == _EXIT:  # returned or raised: the test, not the process, ended
            continue
        seen.add(node)
        if not (isinstance(node, ast.stmt) and (node in blocking or ends(node))):
            todo.extend(flow.after(node))
    return {node for node in seen if isinstance(node, ast.stmt)}


def _walk(
    flow: _Flow, first: ast.stmt, last: ast.stmt, blocking: set[ast.stmt]
) -> tuple[bool, set[ast.stmt]]:
    """(whether ``last`` is reached from ``first`` passing no blocking statement, the blocking
    statements met on the way)."""
    seen: set[ast.stmt | str] = set()
    met: set[ast.stmt] = set()
    todo = list(flow.after(first))
    while todo:
        node = todo.pop()
        if node is last:
            return True, met
        if node in seen:
            continue
        seen.add(node)
        if isinstance(node, ast.stmt) and node in blocking:
            met.add(node)  # passed only where it raised before its call (nothing recorded)
            todo.extend(flow.raised(node))
            continue
        todo.extend(flow.after(node))
    return False, met


def _flow_of(source: str, start: int, end: int) -> tuple[_Flow, ast.stmt, ast.stmt] | None:
    """The flow of the one function holding lines ``start`` and ``end``, and its statements at
    each; None where the code cannot tell."""
    tree = parsed(source)
    function = None if tree is None else function_at(tree, start)
    if tree is None or function is None or function is not function_at(tree, end):
        return None
    try:
        flow = _Flow(function)
    except _Unknown:
        return None
    first, last = flow.statement_at(start), flow.statement_at(end)
    return None if first is None or last is None else (flow, first, last)


def _calls_by_name(statement: ast.stmt, made: dict[int, str]) -> bool:
    """The statement is simple and calls, unconditionally, the op recorded at one of its lines."""
    if isinstance(statement, COMPOUND):
        return False
    end = statement.end_lineno or statement.lineno
    ops = {op for line, op in made.items() if statement.lineno <= line <= end}
    return bool(ops) and any(named(call) in ops for call in _unconditional_calls(statement))


def _unconditional_calls(node: ast.AST) -> Iterator[ast.Call]:
    """The calls the node makes whatever its values, in no order (walked without recursion)."""
    todo = [child for child in ast.iter_child_nodes(node) if not isinstance(child, _CONDITIONAL)]
    while todo:
        child = todo.pop()
        if isinstance(child, ast.Call):
            yield child
        todo.extend(inner for inner in ast.iter_child_nodes(child) if not isinstance(inner, _CONDITIONAL))


class _Flow:
    """The statements of one function and which may run right after which."""

    def __init__(self, function: ast.FunctionDef) -> None:
        self.statements: list[ast.stmt] = []
        self._next: dict[ast.stmt | str, set[ast.stmt | str]] = {_EXIT: set()}
        self._raised: dict[ast.stmt, set[ast.stmt | str]] = {}  # where an exception from it goes
        entry = self._block(function.body, _EXIT, None)
        self._next[_EXIT].add(entry)  # called again

    def after(self, node: ast.stmt | str) -> set[ast.stmt | str]:
        return self._next.get(node, set())

    def raised(self, statement: ast.stmt) -> set[ast.stmt | str]:
        return self._raised.get(statement, set())

    def statement_at(self, line: int) -> ast.stmt | None:
        """The innermost statement (a compound one's head line included) holding ``line``."""
        holding = [s for s in self.statements if s.lineno <= line <= (s.end_lineno or s.lineno)]
        simple = [s for s in holding if not isinstance(s, COMPOUND) or s.lineno == line]
        return max(simple, key=lambda s: s.lineno, default=None)

    def _edge(self, a: ast.stmt | str, b: ast.stmt | str, raised: bool = False) -> None:
        self._next.setdefault(a, set()).add(b)
        if raised and isinstance(a, ast.stmt):
            self._raised.setdefault(a, set()).add(b)

    def _block(self, body: list[ast.stmt], after: ast.stmt | str, loop: tuple[ast.stmt, ast.stmt | str] | None
               ) -> ast.stmt | str:
        """Wire the statements of ``body``, the last one to ``after``; its first (``after`` if empty)."""
        entry = after
        for statement in reversed(body):
            entry = self._statement(statement, entry, loop)
        return entry

    def _statement(self, s: ast.stmt, after: ast.stmt | str, loop: tuple[ast.stmt, ast.stmt | str] | None
                   ) -> ast.stmt:
        if any(isinstance(n, _UNKNOWN) for n in own_nodes(s)):
            raise _Unknown
        self.statements.append(s)
        self._edge(s, _EXIT, raised=True)  # anything may raise out of the function
        if isinstance(s, (ast.For, ast.While)):
            self._edge(s, self._block(s.body, s, (s, after)))
            self._edge(s, self._block(s.orelse, after, loop))
        elif isinstance(s, ast.If):
            self._edge(s, self._block(s.body, after, loop))
            self._edge(s, self._block(s.orelse, after, loop))
        elif isinstance(s, ast.With):
            self._edge(s, self._block(s.body, after, loop))
        elif isinstance(s, ast.Try):
            final = self._block(s.finalbody, after, loop)
            handlers = [self._block(h.body, final, loop) for h in s.handlers]
            self._edge(s, self._block(s.body, self._block(s.orelse, final, loop), loop))
            for inner in _statements_in(s.body):  # an exception from any of them
                for handler in [*handlers, final]:
                    self._edge(inner, handler, raised=True)
        elif isinstance(s, ast.Break) and loop is not None:
            self._edge(s, loop[1])
        elif isinstance(s, ast.Continue) and loop is not None:
            self._edge(s, loop[0])
        elif not isinstance(s, (ast.Return, ast.Raise)):  # those leave; a nested def or class is a statement
            self._edge(s, after)
        return s


def _statements_in(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        for node in own_nodes(statement):
            if isinstance(node, ast.stmt):
                yield node

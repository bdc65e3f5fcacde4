"""Could a rank's code have gone from one of its calls to the next without making a call it did
not make?  Pure: the source text in, an answer out.

Breaks a two-rank tie history cannot: in ``for ...: dist.all_reduce(g); dist.broadcast(g, 0)`` no
path goes from the broadcast back to it without the all_reduce, so a rank whose broadcast came
right after its broadcast departed from its code.  More questions of the same text: is a call
made in a branch for one rank only (``if rank == 0:``, :func:`one_rank_branch`), or on some ranks
only (:func:`under_rank_test`), and which exits could a process that ended between calls have
taken (:func:`exits_after`)?

Sound, or silent: a statement makes a call only where it calls the recorded op by name, not under
a condition (``if``-expression, ``and``/``or``, lambda, comprehension), and the flow is
over-approximated (any statement may raise and leave the function, which may be called again; a
``try`` handler may follow any statement of its body).  Code the walk does not know (generators,
``match``, ``except*``, async code, a line outside any function) answers None."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_EXIT = "exit"  # the function's end: returned or raised, and maybe called again
_TRY_STAR = tuple(getattr(ast, name) for name in ["TryStar"] if hasattr(ast, name))  # except*: Python 3.11+
_UNKNOWN = (ast.Match, ast.AsyncFor, ast.AsyncWith, ast.Yield, ast.YieldFrom, ast.Await, *_TRY_STAR)
_CONDITIONAL = (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


# A file's text by the name its call sites give it; None where it cannot be read.
Source = Callable[[str], str | None]


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


# How code names a rank's number (``rank``, ``dist.get_rank()``), and the flags that single out one
# rank (Lightning's ``trainer.is_global_zero``, accelerate's ``state.is_main_process``).
RANK_NUMBERS = frozenset({"rank", "local_rank", "global_rank", "get_rank", "get_local_rank", "process_index"})
ONE_RANK_FLAGS = frozenset({"is_global_zero", "is_main_process", "is_local_main_process", "is_rank_zero"})


def one_rank_branch(source: str, line: int) -> int | None:
    """The line of the innermost ``if`` or ``while`` whose test singles out one rank (``rank ==
    0``, ``is_global_zero``, either of them ``and`` more) and whose body holds the statement at
    ``line``: it runs on that rank only, at whatever world size; None where none does, or the
    code cannot tell."""
    tree = _parsed(source)
    branch = None if tree is None else _branch_for_one_rank(tree, line)
    return None if branch is None else branch[0]


def _branch_for_one_rank(tree: ast.AST, line: int) -> tuple[int, int | None] | None:
    """(:func:`one_rank_branch`'s line, the rank its test singles out where it says which)."""
    found = next((node for node in _branches_holding(tree, line) if _singles_out(node.test)), None)
    return None if found is None else (found.lineno, _rank_singled_out(found.test))


def _branches_holding(tree: ast.AST, line: int) -> list[ast.If | ast.While]:
    """The ``if`` and ``while`` statements whose body holds the statement at ``line``, innermost first."""
    holding = [node for node in ast.walk(tree) if isinstance(node, (ast.If, ast.While))
               and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0)]
    return sorted(holding, key=lambda node: node.lineno, reverse=True)


def one_rank_value_test(source: str, line: int) -> tuple[int, int] | None:
    """(the line of the innermost ``if`` or ``while`` whose body holds the statement at ``line``
    and whose test, or ``for`` whose iterable, reads a name its function sets in a branch for one
    rank and not in that branch's ``else``, or by a conditional expression on one rank; that rank):
    a value kept on one rank alone (transformers#31532: ``if state.is_main_process: progress +=
    1``, a progress bar's count, then ``if progress == 2: gather(...)``; pytorch#77562: ``current
    = reduced.item() if rank == 0 else mine``).  The test may then answer differently on that rank
    alone; which way the code does not say, so the caller checks that the rank it names made the
    call.  A heuristic: the name may be set on every rank elsewhere too; the caller's check keeps
    it from naming a rank that did not make the call.  None where no test does, the branches for
    one rank that set the name single out different ranks, or the code cannot tell."""
    tree = _parsed(source)
    function = None if tree is None else _function_at(tree, line)
    if function is None:
        return None
    kept = _kept_on_one_rank(function)
    for node, test in _tests_holding(function, line):
        only = _one_rank_read(test, kept)
        if only is not None:
            return node.lineno, only
    return None


def one_rank_value_passed(inner: str, line: int, outer: str, outer_line: int) -> tuple[int, int] | None:
    """(``outer_line``, the rank) where the statement at ``line`` of ``inner`` is under a test or a
    loop (:func:`one_rank_value_test`'s) of a parameter of its function, and the call of that
    function at ``outer_line`` of ``outer`` passes there a value kept on one rank (Lightning#7129:
    ``res`` filled under ``if rank == 0:``, then ``log_dict(res)``, whose ``for name, value in
    metrics.items():`` all-gathers each); None where it does not, or the code cannot tell."""
    inner_tree, outer_tree = _parsed(inner), _parsed(outer)
    function = None if inner_tree is None else _function_at(inner_tree, line)
    caller = None if outer_tree is None else _function_at(outer_tree, outer_line)
    if function is None or caller is None:
        return None
    tested = {name for _, test in _tests_holding(function, line) for name in _names_read(test)}
    parameters = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    kept = _kept_on_one_rank(caller)
    calls = [node for node in ast.walk(caller) if isinstance(node, ast.Call) and _named(node) == function.name
             and node.lineno <= outer_line <= (node.end_lineno or node.lineno)]
    for call in calls:
        named = parameters
        if isinstance(call.func, ast.Attribute) and parameters[:1] == ["self"]:
            named = parameters[1:]  # a method called on its object: ``self`` is not among the arguments
        passed = [*zip(named, call.args, strict=False), *((k.arg, k.value) for k in call.keywords if k.arg)]
        ranks = {_one_rank_read(value, kept) for name, value in passed if name in tested}
        [only] = ranks if len(ranks) == 1 else [None]
        if only is not None:
            return outer_line, only
    return None


def _kept_on_one_rank(function: ast.FunctionDef) -> dict[str, set[int | None]]:
    """The names the function sets in a branch for one rank and not in its ``else``, or by a
    conditional expression on one rank -> the ranks those single out."""
    kept: dict[str, set[int | None]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.If) and _singles_out(node.test):
            set_aside = _names_set(node.orelse)
            for name in _names_set(node.body) - set_aside:
                kept.setdefault(name, set()).add(_rank_singled_out(node.test))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.IfExp) and _singles_out(
                node.value.test):
            for name in _names_set([node]):  # x = reduced.item() if rank == 0 else mine
                kept.setdefault(name, set()).add(_rank_singled_out(node.value.test))
    return kept


def _one_rank_read(node: ast.AST, kept: dict[str, set[int | None]]) -> int | None:
    """The one rank whose kept values (:func:`_kept_on_one_rank`) the node reads; None where it
    reads none, or those of several."""
    ranks: set[int | None] = set().union(*(kept[name] for name in _names_read(node) if name in kept))
    return ranks.pop() if len(ranks) == 1 else None


def _names_read(node: ast.AST) -> set[str]:
    return {name for part in ast.walk(node) if isinstance(part, (ast.Name, ast.Attribute))
            and (name := _named(part)) is not None}


def _tests_holding(function: ast.AST, line: int) -> list[tuple[ast.stmt, ast.expr]]:
    """The ``if`` and ``while`` statements, with their tests, and the ``for`` statements, with their
    iterables, whose body holds the statement at ``line``, innermost first."""
    holding = [node for node in ast.walk(function) if isinstance(node, (ast.If, ast.While, ast.For))
               and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0)]
    return [(node, node.iter if isinstance(node, ast.For) else node.test)
            for node in sorted(holding, key=lambda node: node.lineno, reverse=True)]


def _names_set(body: list[ast.stmt]) -> set[str]:
    """The names (``x``, ``self.x``'s ``x``) the statements assign to, augmented or not."""
    targets: list[ast.expr] = []
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Assign):
                targets.extend(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets.append(node.target)
    return {name for name in map(_named, targets) if name is not None}


def _rank_singled_out(test: ast.expr) -> int | None:
    """The rank a test that singles out one rank (:func:`_singles_out`) is true on, where it says:
    0 for a flag of the main process, ``k`` for ``rank == k`` (``_singles_out`` has checked that one
    side names a rank)."""
    if isinstance(test, (ast.Name, ast.Attribute)):  # a local main process is rank 0 on one host only
        return 0 if _named(test) in ONE_RANK_FLAGS - {"is_local_main_process"} else None
    if isinstance(test, ast.BoolOp):
        ranks = [_rank_singled_out(value) for value in test.values if _singles_out(value)]
        return ranks[0] if ranks else None
    if isinstance(test, ast.Compare):
        number = test.comparators[0] if _named(test.left) in RANK_NUMBERS else test.left
        return number.value if isinstance(number, ast.Constant) and type(number.value) is int else None
    return None


def under_rank_test(source: str, line: int) -> bool | None:
    """Whether the statement at ``line`` is in the body or the ``else`` of an ``if`` or ``while``
    whose test reads a rank's number or a one-rank flag (``rank``, ``is_main_process``): code that
    runs on some ranks only; None where the code cannot tell."""
    tree = _parsed(source)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.If, ast.While)):
            continue
        held = node.lineno < line <= (node.end_lineno or 0)
        if held and any(_named(part) in RANK_NUMBERS | ONE_RANK_FLAGS
                        for part in ast.walk(node.test) if isinstance(part, ast.expr)):
            return True
    return False


def _singles_out(test: ast.expr) -> bool:
    if isinstance(test, (ast.Name, ast.Attribute)):
        return _named(test) in ONE_RANK_FLAGS
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_singles_out(value) for value in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [_named(side) in RANK_NUMBERS for side in (test.left, test.comparators[0])]
        return sides.count(True) == 1
    return False


def _named(node: ast.expr) -> str | None:
    """The name an expression goes by: ``rank`` of ``rank``, ``self.rank`` and ``dist.get_rank()``
    (``get_rank``); a call's is the name it calls by, ``f`` of ``f(...)`` and of ``x.f(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


_EXITS = frozenset({"_exit", "exit", "quit"})  # os._exit, sys.exit, the site module's exit and quit


def exits_after(source: str, start: int, made: dict[int, str]) -> list[int] | None:
    """The lines of the statements calling an exit by name (``os._exit``, ``sys.exit``) that the
    code may reach from the statement at line ``start`` before any statement calling the op
    recorded at its line (``made``, as :func:`calls_between`'s): where a process that ended
    outside any call may have left; None where the code cannot tell."""
    def exits(statement: ast.stmt) -> bool:
        return not isinstance(statement, _COMPOUND) and any(
            _named(call) in _EXITS for call in _unconditional_calls(statement))

    reached = _reached_before_calls(source, start, made, ends=exits)
    return None if reached is None else sorted(s.lineno for s in reached if exits(s))


@dataclass(frozen=True)
class Leave:
    """A ``break`` or ``return`` a rank may have left by: its line, and the line of the innermost
    ``if`` or ``while`` holding it, whose test singles out that rank (``own``) or else reads a value
    that may differ between ranks (:func:`differs_by_rank`)."""

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
    ``rank`` alone (the innermost :func:`one_rank_branch` holding them singles out that rank) or,
    where none is, under a test of a value that may differ between ranks (and singles out no other
    rank): how a rank that returned while its peers went on may have left (speechbrain#2051: ``if
    rank == 0 and epoch == 1: break``, an early stop decided on the main process only;
    pytorch#41665: ``if rank == 1: return`` before ``init_process_group``; yolov5#4576: ``if stop:
    break`` where ``stop`` is set under ``if rank == 0:``; transformers#17478: a patience counter
    of each process's own metric); None where the code cannot tell."""
    tree = _parsed(source)
    reached = None if tree is None else _reached_before_calls(source, start, made, from_entry=from_entry)
    function = None if tree is None else _function_at(tree, start)
    if tree is None or reached is None or function is None:
        return None
    differs = differs_by_rank(function)
    found = []
    for statement in sorted((s for s in reached if isinstance(s, (ast.Break, ast.Return))), key=_first_line):
        line, left = statement.lineno, _left_lines(function, statement)
        one = _branch_for_one_rank(function, line)
        if one is not None:
            if one[1] == rank:
                found.append(Leave(line, one[0], True, left))
            continue
        tests = [b for b in _branches_holding(function, line) if _reads(b.test, differs)]
        if tests and all(_true_on(b.test, rank) is not False for b in tests):
            found.append(Leave(line, tests[0].lineno, False, left))
    return found


def _first_line(statement: ast.stmt) -> int:
    return statement.lineno


def _left_lines(function: ast.FunctionDef, statement: ast.stmt) -> tuple[int, int]:
    """The lines of what a ``return`` leaves, its function, or a ``break``, its innermost loop."""
    if isinstance(statement, ast.Break):
        loops = [node for node in ast.walk(function) if isinstance(node, (ast.For, ast.While))
                 and node.body[0].lineno <= statement.lineno <= (node.body[-1].end_lineno or 0)]
        if loops:
            loop = max(loops, key=lambda node: node.lineno)
            return loop.lineno, loop.end_lineno or loop.lineno
    return function.lineno, function.end_lineno or function.lineno


def _true_on(test: ast.expr, rank: int) -> bool | None:
    """Whether a test of the rank's number against constants (``rank != 1``, ``rank in (0, 1)``,
    either ``and``/``or`` more) holds on ``rank``; None where it reads anything else too."""
    if isinstance(test, ast.BoolOp):
        values = [_true_on(value, rank) for value in test.values]
        decisive = isinstance(test.op, ast.Or)  # True decides an ``or``, False an ``and``
        return decisive if decisive in values else None if None in values else not decisive
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = _true_on(test.operand, rank)
        return None if value is None else not value
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or _named(test.left) not in RANK_NUMBERS:
        return None
    try:
        other = ast.literal_eval(test.comparators[0])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # not a literal
        return None
    checks: dict[type[ast.cmpop], Callable[[Any], bool]] = {
        ast.Eq: lambda v: rank == v, ast.NotEq: lambda v: rank != v, ast.Lt: lambda v: rank < v,
        ast.LtE: lambda v: rank <= v, ast.Gt: lambda v: rank > v, ast.GtE: lambda v: rank >= v,
        ast.In: lambda v: rank in v, ast.NotIn: lambda v: rank not in v,
    }  # fmt: skip
    check = checks.get(type(test.ops[0]))
    try:
        return None if check is None else bool(check(other))
    except TypeError:
        return None


def uneven_loop(source: str, line: int) -> int | None:
    """The line of the innermost ``for`` whose iterable, or ``while`` whose test, reads a value that
    may differ between ranks (:func:`differs_by_rank`) and whose body holds the statement at
    ``line``: a loop each rank runs as often as its own data says (pytorch#38174: ``for x in
    batches`` of a rank's shard; pytorch#100069: ``for _ in range(new_tokens)``, a rank's own count
    of tokens to generate); None where none does, or the code cannot tell."""
    tree = _parsed(source)
    function = None if tree is None else _function_at(tree, line)
    if function is None:
        return None
    differs = differs_by_rank(function)
    loops = [node for node in ast.walk(function) if isinstance(node, (ast.For, ast.While))
             and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0)]
    for loop in sorted(loops, key=lambda node: node.lineno, reverse=True):
        if _reads(loop.iter if isinstance(loop, ast.For) else loop.test, differs):
            return loop.lineno
    return None


# Calls after which the tensors or lists passed to them hold the same on every rank, or whose
# result does: a value that went through one no longer differs by rank.
_AGREEING = frozenset({
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "broadcast_object_list", "gather_for_metrics", "all_gather_base",
})  # fmt: skip


def differs_by_rank(function: ast.FunctionDef) -> set[str]:
    """The names whose value may differ between ranks, as the function's text tells: set from an
    expression that reads a rank's number, a one-rank flag or such a name (``shard =
    data[rank::world_size]``, ``bad = bad + 1`` after ``metric = x if rank == 0 else y``), filled
    by a method called with one (``batches.append(batch)``), or set in the body of an ``if``,
    ``while`` or ``for`` whose test or iterable reads one.  A name passed to or set from a call
    that makes it alike on every rank (``all_reduce``, ``broadcast``) is left out.  A heuristic:
    what a name holds on each rank at run time is not known here."""
    agreed = _agreed(function)
    differs: set[str] = set()
    size = -1
    while size != len(differs):  # to a fixed point: a name may feed one set earlier in the text
        size = len(differs)
        _mark_differs(function.body, False, differs, agreed)
    return differs


def _mark_differs(body: list[ast.stmt], control: bool, differs: set[str], agreed: set[str]) -> None:
    """Add to ``differs`` the names the statements set from, or under, what differs by rank."""
    for s in body:
        if isinstance(s, (ast.If, ast.While)):
            inner = control or _reads(s.test, differs)
            _mark_differs(s.body, inner, differs, agreed)
            _mark_differs(s.orelse, inner, differs, agreed)
        elif isinstance(s, ast.For):
            inner = control or _reads(s.iter, differs)
            if inner:
                differs.update({n.id for n in ast.walk(s.target) if isinstance(n, ast.Name)} - agreed)
            _mark_differs(s.body, inner, differs, agreed)
            _mark_differs(s.orelse, control, differs, agreed)
        elif isinstance(s, (ast.With, ast.Try)):
            for part in (s.body, *(h.body for h in getattr(s, "handlers", [])), getattr(s, "orelse", []),
                         getattr(s, "finalbody", [])):
                _mark_differs(part, control, differs, agreed)
        elif not isinstance(s, _COMPOUND) and (control or _reads(s, differs)):
            differs.update((_names_set([s]) | _filled(s)) - agreed)


def _reads(node: ast.AST, differs: set[str]) -> bool:
    """The node reads a rank's number, a one-rank flag or a name in ``differs`` (a method called,
    ``x.item()``'s ``item``, is no name read; a function, ``get_rank()``, is)."""
    names = RANK_NUMBERS | ONE_RANK_FLAGS | differs
    methods = {id(part.func) for part in ast.walk(node) if isinstance(part, ast.Call)
               and isinstance(part.func, ast.Attribute) and _named(part.func) not in RANK_NUMBERS}
    return any(_named(part) in names for part in ast.walk(node)
               if isinstance(part, (ast.Name, ast.Attribute)) and id(part) not in methods)


def _filled(statement: ast.stmt) -> set[str]:
    """The names a statement fills by a method call on them: ``batches`` of ``batches.append(b)``."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, (ast.Name, ast.Attribute)):
            name = _named(func.value)
            return set() if name is None or func.attr in _AGREEING else {name}
    return set()


def _agreed(function: ast.FunctionDef) -> set[str]:
    """The names passed to, or set from, a call by name in :data:`_AGREEING`."""
    agreed: set[str] = set()
    for node in _own_nodes(function):
        if isinstance(node, ast.Call) and _named(node) in _AGREEING:
            agreed.update(name for arg in node.args if (name := _named(arg)) is not None)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                _named(node.value) in _AGREEING):
            agreed.update(_names_set([node]))
    return agreed


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


def _parsed(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _flow_of(source: str, start: int, end: int) -> tuple[_Flow, ast.stmt, ast.stmt] | None:
    """The flow of the one function holding lines ``start`` and ``end``, and its statements at
    each; None where the code cannot tell."""
    tree = _parsed(source)
    function = None if tree is None else _function_at(tree, start)
    if tree is None or function is None or function is not _function_at(tree, end):
        return None
    try:
        flow = _Flow(function)
    except _Unknown:
        return None
    first, last = flow.statement_at(start), flow.statement_at(end)
    return None if first is None or last is None else (flow, first, last)


def _function_at(tree: ast.Module, line: int) -> ast.FunctionDef | None:
    """The innermost (non-async) function whose body holds ``line``."""
    holding = [node for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.body[0].lineno <= line <= (node.end_lineno or 0)]
    return max(holding, key=lambda node: node.lineno, default=None)


def _calls_by_name(statement: ast.stmt, made: dict[int, str]) -> bool:
    """The statement is simple and calls, unconditionally, the op recorded at one of its lines."""
    if isinstance(statement, _COMPOUND):
        return False
    end = statement.end_lineno or statement.lineno
    ops = {op for line, op in made.items() if statement.lineno <= line <= end}
    return bool(ops) and any(_named(call) in ops for call in _unconditional_calls(statement))


def _unconditional_calls(node: ast.AST) -> Iterator[ast.Call]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _CONDITIONAL):
            continue
        if isinstance(child, ast.Call):
            yield child
        yield from _unconditional_calls(child)


_COMPOUND = (
    ast.For, ast.While, ast.If, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef
)


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
        simple = [s for s in holding if not isinstance(s, _COMPOUND) or s.lineno == line]
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
        if any(isinstance(n, _UNKNOWN) for n in _own_nodes(s)):
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


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The node and what it holds, its nested functions and classes left out."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield from _own_nodes(child)


def _statements_in(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        for node in _own_nodes(statement):
            if isinstance(node, ast.stmt):
                yield node

"""Which ranks the user's code runs a line on, and which of its values differ between ranks.
Pure: the source text in, an answer out.

A call made in a branch for one rank only (``if rank == 0:``, :func:`one_rank_branch`), or under a
test of a value kept on one rank (:func:`one_rank_value_test`), names that rank where the run
ties; a value set from the rank, or under a test or loop of one, may differ between ranks
(:func:`differs_by_rank`): a loop over it runs as often as each rank's data says
(:func:`uneven_loop`).  Heuristics, each kept sound by the caller's check on the run: the rank a
rule names made the call it names."""

from __future__ import annotations

import ast
import itertools
import operator
from collections.abc import Callable
from typing import Any

from pytest_ddp.common.ops import AGREEING
from pytest_ddp.diagnose.source_text import COMPOUND, function_at, named, names_set, own_nodes, parsed

# How code names a rank's number (``rank``, ``dist.get_rank()``), and the flags, or methods of no
# argument, that single out one rank (Lightning's ``trainer.is_global_zero``, accelerate's
# ``state.is_main_process``, transformers' ``trainer.is_world_process_zero()`` and, before 4.0,
# ``is_world_master()``); those of one host's main process single out one rank of each host.
RANK_NUMBERS = frozenset({"rank", "local_rank", "global_rank", "get_rank", "get_local_rank", "process_index"})
LOCAL_FLAGS = frozenset({"is_local_main_process", "is_local_process_zero", "is_local_master"})
ONE_RANK_FLAGS = LOCAL_FLAGS | {
    "is_global_zero", "is_main_process", "is_rank_zero", "is_world_process_zero", "is_world_master",
}


def one_rank_branch(source: str, line: int) -> int | None:
    """The line of the innermost ``if`` or ``while`` whose test singles out one rank (``rank ==
    0``, ``is_global_zero``, either of them ``and`` more) and whose body holds the statement at
    ``line``: it runs on that rank only, at whatever world size; None where none does, or the
    code cannot tell."""
    tree = parsed(source)
    branch = None if tree is None else branch_for_one_rank(tree, line)
    return None if branch is None else branch[0]


def branch_for_one_rank(tree: ast.AST, line: int) -> tuple[int, int | None] | None:
    """(:func:`one_rank_branch`'s line, the rank its test singles out where it says which)."""
    found = next((node for node in branches_holding(tree, line) if _singles_out(node.test)), None)
    return None if found is None else (found.lineno, _rank_singled_out(found.test))


def else_lines(source: str, line: int) -> tuple[int, int] | None:
    """The first and last lines of the ``else`` (or ``elif``) of the ``if`` at ``line``; None where
    it has none, or the code cannot tell."""
    tree = parsed(source)
    found = None if tree is None else next(
        (node for node in ast.walk(tree) if isinstance(node, ast.If) and node.lineno == line), None)
    if found is None or not found.orelse:
        return None
    return found.orelse[0].lineno, found.orelse[-1].end_lineno or found.orelse[-1].lineno


def branches_holding(tree: ast.AST, line: int) -> list[ast.If | ast.While]:
    """The ``if`` and ``while`` statements whose body holds the statement at ``line``, innermost first."""
    holding = [node for node in ast.walk(tree) if isinstance(node, (ast.If, ast.While))
               and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0)]
    return sorted(holding, key=lambda node: node.lineno, reverse=True)


def branch_for_ranks(source: str, line: int, inside: list[int], outside: list[int]) -> int | None:
    """The line of the innermost ``if`` or ``while`` whose body holds the statement at ``line`` and
    whose test of the rank's number (:func:`true_on`) fails on every rank of ``outside`` and not on
    those of ``inside``: code those ranks alone run (llm-compressor#2869: ``if rank in (0, 1):`` around a
    helper that makes a ``new_group`` of every rank); None where none does, or the code cannot tell."""
    tree = parsed(source)
    if tree is None:
        return None
    for node in branches_holding(tree, line):
        # the ranks inside took it, whatever else it reads; none outside could
        if all(true_on(node.test, r) is not False for r in inside) and all(
                true_on(node.test, r) is False for r in outside):
            return node.lineno
    return None


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
    tree = parsed(source)
    function = None if tree is None else function_at(tree, line)
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
    inner_tree, outer_tree = parsed(inner), parsed(outer)
    function = None if inner_tree is None else function_at(inner_tree, line)
    caller = None if outer_tree is None else function_at(outer_tree, outer_line)
    if function is None or caller is None:
        return None
    # a parameter the helper sets anew (``metrics = broadcast(metrics)``) no longer holds what was passed
    tested = {name for _, test in _tests_holding(function, line) for name in _names_read(test)}
    tested -= names_set(function.body)
    parameters = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    kept = _kept_on_one_rank(caller)
    calls = [node for node in ast.walk(caller) if isinstance(node, ast.Call) and named(node) == function.name
             and node.lineno <= outer_line <= (node.end_lineno or node.lineno)]
    for call in calls:
        receiving = parameters
        if isinstance(call.func, ast.Attribute) and parameters[:1] == ["self"]:
            receiving = parameters[1:]  # a method called on its object: ``self`` is not among the arguments
        keywords = [(k.arg, k.value) for k in call.keywords if k.arg]
        positional = itertools.takewhile(lambda a: not isinstance(a, ast.Starred), call.args)  # before *args
        passed = [*zip(receiving, positional, strict=False), *keywords]
        ranks = {_one_rank_read(value, kept) for name, value in passed if name in tested}
        [only] = ranks if len(ranks) == 1 else [None]
        if only is not None:
            return outer_line, only
    return None


def _kept_on_one_rank(function: ast.FunctionDef) -> dict[str, set[int | None]]:
    """The names the function sets in a branch for one rank and not in its ``else``, or by a
    conditional expression on one rank -> the ranks those single out."""
    kept: dict[str, set[int | None]] = {}
    agreed = _agreed(function)  # broadcast from that rank: alike on every rank after it
    for node in ast.walk(function):
        if isinstance(node, ast.If) and _singles_out(node.test):
            set_aside = names_set(node.orelse)
            for name in names_set(node.body) - set_aside:
                kept.setdefault(name, set()).add(_rank_singled_out(node.test))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.IfExp) and _singles_out(
                node.value.test) and not _none_on_one_side(node.value):
            for name in names_set([node]):  # x = reduced.item() if rank == 0 else mine
                kept.setdefault(name, set()).add(_rank_singled_out(node.value.test))
    return {name: ranks for name, ranks in kept.items() if name not in agreed}


def _none_on_one_side(choice: ast.IfExp) -> bool:
    """``x1 = batch[1] if rank == 0 else None``: an input some ranks have and the rest lack.  Which
    departs, the ranks that run what only the input makes them run or those without it, the code
    does not say: the field blames the ranks without it for a model's submodule they skip
    (pytorch#148334, #152964), and would blame the rank with it for a metric's reduction only it
    makes.  So such a value counts as kept on no rank: a tie, not a guess."""
    return any(isinstance(side, ast.Constant) and side.value is None for side in (choice.body, choice.orelse))


def _one_rank_read(node: ast.AST, kept: dict[str, set[int | None]]) -> int | None:
    """The one rank whose kept values (:func:`_kept_on_one_rank`) the node reads; None where it
    reads none, or those of several."""
    ranks: set[int | None] = set().union(*(kept[name] for name in _names_read(node) if name in kept))
    return ranks.pop() if len(ranks) == 1 else None


def _names_read(node: ast.AST) -> set[str]:
    return {name for part in ast.walk(node) if isinstance(part, (ast.Name, ast.Attribute))
            and (name := named(part)) is not None}


def _tests_holding(function: ast.AST, line: int) -> list[tuple[ast.stmt, ast.expr]]:
    """The ``if`` and ``while`` statements, with their tests, and the ``for`` statements, with their
    iterables, whose body holds the statement at ``line``, innermost first."""
    holding = [node for node in ast.walk(function) if isinstance(node, (ast.If, ast.While, ast.For))
               and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0)]
    return [(node, node.iter if isinstance(node, ast.For) else node.test)
            for node in sorted(holding, key=lambda node: node.lineno, reverse=True)]


def loop_head(loop: ast.For | ast.While) -> ast.expr:
    """What decides how often a loop runs: a ``for``'s iterable, a ``while``'s test."""
    return loop.iter if isinstance(loop, ast.For) else loop.test


def _rank_singled_out(test: ast.expr) -> int | None:
    """The rank a test that singles out one rank (:func:`_singles_out`) is true on, where it says:
    0 for a flag of the main process, ``k`` for ``rank == k`` (``_singles_out`` has checked that one
    side names a rank)."""
    if _is_flag(test):  # a local main process is rank 0 on one host only
        return 0 if named(test) in ONE_RANK_FLAGS - LOCAL_FLAGS else None
    if isinstance(test, ast.BoolOp):
        ranks = [_rank_singled_out(value) for value in test.values if _singles_out(value)]
        return ranks[0] if ranks else None
    if isinstance(test, ast.Compare):
        number = test.comparators[0] if named(test.left) in RANK_NUMBERS else test.left
        return number.value if isinstance(number, ast.Constant) and type(number.value) is int else None
    return None


def under_rank_test(source: str, line: int) -> bool | None:
    """Whether the statement at ``line`` is in the body or the ``else`` of an ``if`` or ``while``
    whose test reads a rank's number or a one-rank flag (``rank``, ``is_main_process``): code that
    runs on some ranks only; None where the code cannot tell."""
    tree = parsed(source)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.If, ast.While)):
            continue
        held = node.lineno < line <= (node.end_lineno or 0)
        if held and any(named(part) in RANK_NUMBERS | ONE_RANK_FLAGS
                        for part in ast.walk(node.test) if isinstance(part, ast.expr)):
            return True
    return False


def _singles_out(test: ast.expr) -> bool:
    if _is_flag(test):
        return named(test) in ONE_RANK_FLAGS
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_singles_out(value) for value in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [named(side) in RANK_NUMBERS for side in (test.left, test.comparators[0])]
        return sides.count(True) == 1
    return False


def _is_flag(test: ast.expr) -> bool:
    """A name, an attribute or a call of either with no argument: what a flag may be."""
    if isinstance(test, ast.Call) and not test.args and not test.keywords:
        test = test.func
    return isinstance(test, (ast.Name, ast.Attribute))


# A comparison of the rank (left) with a constant (right).
_COMPARED: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip


def true_on(test: ast.expr, rank: int) -> bool | None:
    """Whether a test of the rank's number against constants (``rank != 1``, ``rank in (0, 1)``,
    either ``and``/``or`` more) holds on ``rank``; None where it reads anything else too."""
    if isinstance(test, ast.BoolOp):
        values = [true_on(value, rank) for value in test.values]
        decisive = isinstance(test.op, ast.Or)  # True decides an ``or``, False an ``and``
        return decisive if decisive in values else None if None in values else not decisive
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = true_on(test.operand, rank)
        return None if value is None else not value
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or named(test.left) not in RANK_NUMBERS:
        return None
    try:
        other = ast.literal_eval(test.comparators[0])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # not a literal
        return None
    check = _COMPARED.get(type(test.ops[0]))
    try:
        return None if check is None else bool(check(rank, other))
    except TypeError:
        return None


def uneven_loop(source: str, line: int) -> int | None:
    """The line of the innermost ``for`` whose iterable, or ``while`` whose test, reads a value that
    may differ between ranks (:func:`differs_by_rank`) and whose body holds the statement at
    ``line``: a loop each rank runs as often as its own data says (pytorch#38174: ``for x in
    batches`` of a rank's shard; pytorch#100069: ``for _ in range(new_tokens)``, a rank's own count
    of tokens to generate); None where none does, or the code cannot tell."""
    tree = parsed(source)
    function = None if tree is None else function_at(tree, line)
    if function is None:
        return None
    differs = differs_by_rank(function)
    loops = [node for node in ast.walk(function) if isinstance(node, (ast.For, ast.While))
             and node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0)]
    for loop in sorted(loops, key=lambda node: node.lineno, reverse=True):
        if reads(loop_head(loop), differs):
            return loop.lineno
    return None


# ops.AGREEING, and accelerate's gather (as all_gather): a value that went through one no longer
# differs by rank.
_AGREEING = frozenset({*AGREEING, "gather_for_metrics"})


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
            inner = control or reads(s.test, differs)
            _mark_differs(s.body, inner, differs, agreed)
            _mark_differs(s.orelse, inner, differs, agreed)
        elif isinstance(s, ast.For):
            inner = control or reads(s.iter, differs)
            if inner:
                differs.update({n.id for n in ast.walk(s.target) if isinstance(n, ast.Name)} - agreed)
            _mark_differs(s.body, inner, differs, agreed)
            _mark_differs(s.orelse, control, differs, agreed)
        elif isinstance(s, (ast.With, ast.Try)):
            for part in (s.body, *(h.body for h in getattr(s, "handlers", [])), getattr(s, "orelse", []),
                         getattr(s, "finalbody", [])):
                _mark_differs(part, control, differs, agreed)
        elif not isinstance(s, COMPOUND) and (control or reads(s, differs)):
            differs.update((names_set([s]) | _filled(s)) - agreed)


# Where a rank's number says only where a value lives, not what it holds: ``model.to(rank)``,
# ``torch.cuda.set_device(rank)``, ``DDP(model, device_ids=[rank])``.
_PLACING = frozenset({"to", "cuda", "set_device", "device"})
_DEVICE_KEYWORDS = frozenset({"device", "device_ids", "output_device", "device_id", "device_mesh"})


def reads(node: ast.AST, differs: set[str]) -> bool:
    """The node reads a rank's number, a one-rank flag or a name in ``differs`` (a method called,
    ``x.item()``'s ``item``, is no name read; a function, ``get_rank()``, is, as is a flag's method,
    ``is_world_process_zero()``; a device a value is placed on is no value read)."""
    names = RANK_NUMBERS | ONE_RANK_FLAGS | differs
    unread: set[int] = set()
    for part in ast.walk(node):
        if not isinstance(part, ast.Call):
            continue
        if isinstance(part.func, ast.Attribute) and named(part.func) not in RANK_NUMBERS | ONE_RANK_FLAGS:
            unread.add(id(part.func))
        placed = [*part.args, *part.keywords] if named(part) in _PLACING else [
            k.value for k in part.keywords if k.arg in _DEVICE_KEYWORDS]
        unread.update(id(inner) for argument in placed for inner in ast.walk(argument))
    return any(named(part) in names for part in ast.walk(node)
               if isinstance(part, (ast.Name, ast.Attribute)) and id(part) not in unread)


# The methods that fill a container with their arguments.
_FILLING = frozenset({"append", "extend", "add", "update", "insert", "put", "setdefault", "appendleft"})


def _filled(statement: ast.stmt) -> set[str]:
    """The local name a statement fills by a method call on it: ``batches`` of
    ``batches.append(b)`` (not ``dist`` of ``dist.init_process_group(rank=rank)``)."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr in _FILLING:
            return {func.value.id}
    return set()


def _agreed(function: ast.FunctionDef) -> set[str]:
    """The names passed first to (what it fills: ``all_gather(out, mine)``'s ``out``), or set
    from, a call by name in :data:`_AGREEING`."""
    agreed: set[str] = set()
    for node in own_nodes(function):
        if isinstance(node, ast.Call) and named(node) in _AGREEING:
            agreed.update(name for arg in node.args[:1] if (name := named(arg)) is not None)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                named(node.value) in _AGREEING):
            agreed.update(names_set([node]))
    return agreed

"""The injected-fault matrix: each failure kind in each family of code, at the first,
a middle and the last rank, in worlds of 2, 4 and 8, with the answer each cell must get.

A cell is a family's body (tests/matrix/families.py), the rank at fault, and how its fault is
made: injected with :mod:`pytest_ddp.faults` where the fault fires at a call, written in the
body's code (``Plan.variant``) where it is a rank's own code doing something else (a step less, a
wrong init, groups in the other order) or where faults cannot reach (mpi4py's calls).
:func:`cells` generates them; :data:`ABSENT` says why a (family, kind) has no cell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pytest_ddp import faults
from pytest_ddp.faults import Fault
from tests.matrix import families
from tests.matrix.families import DELAY, Plan

WORLDS = (2, 4, 8)
POSITIONS = ("first", "middle", "last")
KINDS = (
    "skip", "extra", "op", "shape", "dtype", "reduce_op", "unmatched_send", "unmatched_recv", "cycle",
    "raise", "kill", "exit", "oom", "disconnect", "hang", "init_world_size", "init_rank", "init_never", "delay",
)
FAMILIES = (
    "classic", "p2p", "objects", "ddp", "fsdp2", "dtensor", "functional", "compiled", "pipelining",
    "tensor_parallel", "mpi",
)
CLASSIC_FAMILIES = ("classic", "p2p", "objects", "ddp")
PROCESS_KINDS = ("raise", "kill", "exit", "oom", "disconnect", "hang", "delay")  # faults that fire at a call


@dataclass(frozen=True)
class Expected:
    """The right answer.  ``outcomes`` empty: the cell passes.  Else the diagnosis's kind is one
    of ``kinds``, its culprits are ``culprits`` (and any of ``may_name``; a tie's likely culprits
    where it names them), and its call (``Diagnosis.call``) is one
    of ``ops`` (empty: not checked), number ``seq`` (None: not checked), at a line tagged one of
    ``lines`` (empty: not checked)."""

    outcomes: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    culprits: tuple[int, ...] = ()
    ops: tuple[str, ...] = ()
    seq: int | None = None
    lines: tuple[str, ...] = ()
    # Ranks the verdict may name beside the culprits without naming one falsely: the other ends
    # of a broken connection, which raised on it as the culprit did.
    may_name: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cell:
    family: str
    kind: str
    world: int
    position: str
    culprit: int
    body: Callable[..., object]
    plan: Plan
    expected: Expected
    faults: tuple[Fault, ...] = ()
    init: bool = True
    timeout: float = 20.0
    backend: str | None = None

    @property
    def name(self) -> str:
        return f"{self.family}-{self.kind}-w{self.world}-{self.position}"


@dataclass(frozen=True)
class Recipe:
    """How a family makes the faults injected at a call: the op and call number they fire at,
    and the call the waiting ranks then wait in."""

    body: Callable[..., object]
    at: str  # the operation injected faults fire at (its 2nd call)
    ops: tuple[str, ...]  # the call at fault, as Diagnosis.call names it
    seq: int | None
    lines: tuple[str, ...]
    timeout: float = 20.0
    written: tuple[str, ...] = ()  # kinds made by Plan.variant in the body's code
    injected: dict[str, Callable[[int], Fault]] = field(default_factory=dict)  # kind -> fault on a rank


def _process_faults(at: str) -> dict[str, Callable[[int], Fault]]:
    return {
        "raise": lambda r: faults.raise_(rank=r, at=at, call=2),
        "kill": lambda r: faults.kill(rank=r, at=at, call=2),
        "exit": lambda r: faults.exit(rank=r, at=at, call=2),
        "oom": lambda r: faults.oom(rank=r, at=at, call=2),
        "disconnect": lambda r: faults.disconnect(rank=r, at=at, call=2),
        "hang": lambda r: faults.hang(rank=r, at=at, call=2),
        "delay": lambda r: faults.delay(rank=r, at=at, seconds=DELAY, call=2),
    }


CALL_FAULTS: dict[str, Callable[[int], Fault]] = {
    "skip": lambda r: faults.skip(rank=r, at="all_reduce", call=2),
    "extra": lambda r: faults.extra(rank=r, at="all_reduce", call=2),
    "op": lambda r: faults.change(rank=r, at="all_reduce", call=2, op="broadcast"),
    "shape": lambda r: faults.change(rank=r, at="all_reduce", call=2, shape=(5,)),
    "dtype": lambda r: faults.change(rank=r, at="all_reduce", call=2, dtype="float64"),
    "reduce_op": lambda r: faults.change(rank=r, at="all_reduce", call=2, reduce_op="MAX"),
}
STEP_KINDS = ("skip", "extra")  # a library family's rank that makes a step less or more
LIBRARY_TIMEOUT = 40.0
HANG_TIMEOUT = {True: 6.0, False: 20.0}  # classic family or not -> a hang cell's timeout

RECIPES: dict[str, Recipe] = {
    # all_reduce #2 is the group's collective #3 (all_reduce, broadcast, all_reduce)
    "classic": Recipe(families.classic, "all_reduce", ("all_reduce",), 3, ("classic.all_reduce",), 10.0,
                      injected={**CALL_FAULTS, **_process_faults("all_reduce")}),
    # where the ring breaks, and so the number of the call left waiting, depends on the culprit
    "p2p": Recipe(families.p2p, "send", ("send", "recv"), None, (), 10.0, injected={
        "unmatched_send": lambda r: faults.skip(rank=r, at="recv", call=2),
        "unmatched_recv": lambda r: faults.skip(rank=r, at="send", call=2),
        "extra": lambda r: faults.extra(rank=r, at="send", call=2),
        "shape": lambda r: faults.change(rank=r, at="send", call=2, shape=(5,)),
        "dtype": lambda r: faults.change(rank=r, at="send", call=2, dtype="float64"),
        **_process_faults("send"),
    }),
    "objects": Recipe(families.objects, "all_gather_object", ("all_gather_object",), 3, ("objects.gather",), 10.0,
                      injected={
                          "skip": lambda r: faults.skip(rank=r, at="all_gather_object", call=2),
                          "extra": lambda r: faults.extra(rank=r, at="all_gather_object", call=2),
                          **_process_faults("all_gather_object"),
                      }),
    "ddp": Recipe(families.ddp, "all_reduce", ("all_reduce",), None, ("ddp.backward",), LIBRARY_TIMEOUT,
                  written=(*STEP_KINDS, "dtype"), injected=_process_faults("all_reduce")),
    "fsdp2": Recipe(families.fsdp2, "all_gather_single", (), None, ("fsdp2.step",), LIBRARY_TIMEOUT,
                    written=(*STEP_KINDS, "dtype"), injected=_process_faults("all_gather_single")),
    "dtensor": Recipe(families.dtensor, "all_gather_into_tensor", (), None,
                      ("dtensor.distribute", "dtensor.redistribute"), LIBRARY_TIMEOUT,
                      written=(*STEP_KINDS, "shape", "dtype"), injected=_process_faults("all_gather_into_tensor")),
    "functional": Recipe(families.functional, "all_reduce", ("all_reduce",), None, ("functional.all_reduce",),
                         LIBRARY_TIMEOUT, written=(*STEP_KINDS, "op", "shape", "dtype", "reduce_op"),
                         injected=_process_faults("all_reduce")),
    "compiled": Recipe(families.compiled, "all_reduce", ("all_reduce",), 2, ("compiled.all_reduce",),
                       LIBRARY_TIMEOUT, written=(*STEP_KINDS, "shape"), injected=_process_faults("all_reduce")),
    "pipelining": Recipe(families.pipelining, "isend", (), None, (), LIBRARY_TIMEOUT, written=STEP_KINDS,
                         injected=_process_faults("isend")),
    "tensor_parallel": Recipe(families.tensor_parallel, "all_reduce", ("all_reduce",), None, ("tp.forward",),
                              LIBRARY_TIMEOUT, written=(*STEP_KINDS, "shape", "dtype"),
                              injected=_process_faults("all_reduce")),
    "mpi": Recipe(families.mpi, "mpi.Allreduce", (), None, (), 20.0, written=(
        "skip", "extra", "op", "shape", "dtype", "reduce_op", "unmatched_send", "unmatched_recv",
        "raise", "kill", "exit", "oom", "hang", "delay")),
}

# (family, kind) -> why the matrix has no cell there.
ABSENT: dict[tuple[str, str], str] = {}
_WHY = {
    "op": "the library chooses its collectives: no user code makes another op",
    "shape": "ranks may feed batches of different sizes: correct code for this library",
    "reduce_op": "the library chooses its reduce op",
    "unmatched_send": "no point-to-point call in this family's code",
    "cycle": "made once, in the classic family (two groups in another order); p2p's own cycle is in"
             " tests/scenarios/test_point_to_point.py",
    "init_world_size": "init_process_group is the same for every family: in the classic family only",
    "disconnect": "faults.disconnect breaks a rank's TCP connections; mpi4py's faults are written in the"
                  " code, and MPICH's gforker ranks talk through shared memory",
}
for _family in FAMILIES:
    for _kind in KINDS:
        _recipe = RECIPES[_family]
        if _kind in _recipe.injected or _kind in _recipe.written:
            continue
        if _family == "classic" and _kind in ("cycle", "init_world_size", "init_rank", "init_never"):
            continue
        _key = "init_world_size" if _kind.startswith("init_") else "unmatched_send" if _kind.startswith(
            "unmatched") else _kind
        ABSENT[(_family, _kind)] = _WHY.get(_key, "")
ABSENT.update({
    ("p2p", "skip"): "a skipped send or recv is the unmatched recv or send",
    ("p2p", "op"): "a send has no other op but a recv: the unmatched kinds",
    ("p2p", "reduce_op"): "a send has no reduce op",
    ("objects", "op"): "change(op=) takes a tensor collective; an object collective has no other op with its arguments",
    ("objects", "shape"): "an object has no shape: its pickled size differs between ranks in correct code",
    ("objects", "dtype"): "an object has no dtype",
    ("objects", "reduce_op"): "no object collective reduces",
    ("compiled", "op"): "the same calls as the functional family, compiled: its op is in the functional family",
    ("compiled", "dtype"): "the same calls as the functional family, compiled: its dtype is in the functional family",
    ("compiled", "reduce_op"): "the same calls as the functional family, compiled",
    ("pipelining", "shape"): "a stage's shapes come from its microbatch: another microbatch count is skip/extra",
    ("pipelining", "dtype"): "the stages exchange the dtype in their metadata, as shapes",
    ("pipelining", "unmatched_send"): "the schedule makes the stages' sends and receives: skip/extra are its"
                                      " unmatched sends and receives",
    ("pipelining", "unmatched_recv"): "the schedule makes the stages' sends and receives: skip/extra are its"
                                      " unmatched sends and receives",
    ("ddp", "shape"): _WHY["shape"],
    ("fsdp2", "shape"): _WHY["shape"],
})


def positions(world: int) -> dict[str, int]:
    """first, middle, last -> rank; a world of 2 has no middle rank apart from its last."""
    found = {"first": 0, "middle": world // 2, "last": world - 1}
    return {name: rank for name, rank in found.items() if not (name == "middle" and rank == world - 1)}


def expected(family: str, kind: str, world: int, culprit: int) -> Expected:
    """The right answer of a cell."""
    recipe = RECIPES[family]
    if kind == "delay":
        return Expected()
    call = {"ops": recipe.ops, "seq": recipe.seq, "lines": recipe.lines}
    if kind in ("skip", "extra", "op", "shape", "dtype", "reduce_op", "cycle"):
        call = {"ops": (), "seq": None, "lines": ()}  # the first call that differs: checked on the ranks' sequences
        return Expected(("deadlock", "failed"), ("mismatch", "partial", "p2p_unmatched", "p2p_cycle"),
                        (culprit,), **call)
    if kind.startswith("unmatched"):
        # The call left unmatched: the skipped one shifts the numbers after it, so no number is checked.
        # MPI: a send returns with its message buffered, and the message is left unreceived.
        ops = ("send", "recv") if family == "p2p" else ()
        # At 2 ranks the ring's two ends are each other's peers: a receive skipped leaves both
        # ranks in a send (a send skipped, both in a receive), waiting for each other: a cycle,
        # the very calls of a send more (the "extra" cell, whose answer allows a cycle).
        cycle = ("p2p_cycle",) if family in ("p2p", "mpi") and world == 2 else ()
        return Expected(("deadlock",), ("p2p_unmatched", "partial", "unreceived", *cycle), (culprit,), ops)
    if kind.startswith("init_"):
        return Expected(("deadlock", "timeout", "failed"), ("init", "timeout"), (culprit,))
    if kind == "hang":
        return Expected(("timeout",), ("timeout",), (culprit,), **call)
    if kind == "disconnect":  # every peer's connection to the culprit broke: any may raise first
        return Expected(("deadlock", "failed"), ("rank_exited", "failed"), (culprit,), may_name=tuple(range(world)))
    return Expected(("deadlock", "failed", "timeout"), ("rank_exited",), (culprit,), **call)


def _cell(family: str, kind: str, world: int, position: str, culprit: int) -> Cell:
    recipe = RECIPES[family]
    body, init = recipe.body, True
    injected: tuple[Fault, ...] = ()
    variant = ""
    if family == "classic" and kind == "cycle":
        body, variant = families.two_groups, "cycle"
    elif family == "classic" and kind.startswith("init_"):
        body, init = families.init, False
        if kind == "init_never":
            injected = (faults.hang(rank=culprit, at="init_process_group"),)
        else:
            variant = kind
    elif kind in recipe.injected:
        injected = (recipe.injected[kind](culprit),)
    else:
        variant = kind
    # A hang is judged at the test's timeout: long enough for the family to reach its fault.
    timeout = min(recipe.timeout, HANG_TIMEOUT[family in CLASSIC_FAMILIES]) if kind in (
        "hang", "init_never") else recipe.timeout
    return Cell(family, kind, world, position, culprit, body, Plan(world, culprit, variant),
                expected(family, kind, world, culprit), injected, init, timeout,
                "mpi" if family == "mpi" else None)


def cells(
    families_: tuple[str, ...] = FAMILIES,
    kinds: tuple[str, ...] = KINDS,
    worlds: tuple[int, ...] = WORLDS,
    positions_: tuple[str, ...] = POSITIONS,
) -> Iterator[Cell]:
    """Every cell of the matrix that makes sense, in world, family, kind, position order."""
    for world in worlds:  # world by world: a run cut short has judged the small worlds whole
        for family in families_:
            for kind in kinds:
                if (family, kind) in ABSENT:
                    continue
                for position, culprit in positions(world).items():
                    if position in positions_:
                        yield _cell(family, kind, world, position, culprit)

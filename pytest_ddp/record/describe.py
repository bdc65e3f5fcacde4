"""A torch.distributed call's site, group, tensors, objects, root or peer, as fragments of the
``call`` event's JSON (:mod:`pytest_ddp.common.protocol`); the usual cases cached (hot path).
"""

from __future__ import annotations

import datetime
import errno
import functools
import ipaddress
import json
import os
import pickle
import re
import socket
import sys
import weakref
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pytest_ddp.common.ops import BACKEND_REDUCTION, DEFAULT_REDUCTION, INIT, NEW_GROUP, OPS, BackendOp, Op
from pytest_ddp.record import backend_hook


def _package_dir(module: ModuleType) -> str:
    assert module.__file__ is not None  # a regular package, never a namespace one
    return os.path.dirname(module.__file__) + os.sep


_INTERNAL_DIRS = tuple(
    _package_dir(module)
    for module in (torch, sys.modules["pytest_ddp"], __import__("pluggy"), __import__("_pytest"))
)

json_text = json.JSONEncoder(separators=(",", ":"), default=str).encode


def add_internal(module: ModuleType) -> None:
    """Frames in that package are not call sites either (mpi4py, for the MPI recorder)."""
    global _INTERNAL_DIRS
    if _package_dir(module) in _INTERNAL_DIRS:
        return
    _INTERNAL_DIRS = (*_INTERNAL_DIRS, _package_dir(module))
    _shown.cache_clear()
    users_file.cache_clear()


# Not call sites either: frozen modules, and inductor's generated code (its caller is the compiled
# function).  An FX graph module's code is shown as the user's line its node came from, if known.
_GENERATED = ("<frozen ", *filter(None, [os.environ.get("TORCHINDUCTOR_CACHE_DIR")]))
_INDUCTOR_CACHE = os.sep + "torchinductor_"  # in the default one's name
_FX_GRAPH = "<eval_with_key>"  # how an FX graph module's code file is named; shown as ""
_TRACE_LINE = re.compile(r'File "(.+)", line (\d+), in ')


@functools.cache
def _shown(filename: str) -> str | None:
    """How a call site shows a frame's file (JSON-escaped), shortest where it is known; None for
    internal files."""
    if filename.startswith(_INTERNAL_DIRS) or filename.startswith(_GENERATED) or _INDUCTOR_CACHE in filename:
        return None
    if filename.startswith(_FX_GRAPH):
        return ""
    library = max((filename.rfind(d) + len(d) for d in _LIBRARY_DIRS if d in filename), default=0)
    if library:  # accelerate/accelerator.py, not the whole path to the environment's site-packages
        filename = filename[library:]
    elif filename.startswith(_STDLIB):
        filename = filename[len(_STDLIB) :]
    elif os.path.isabs(filename):
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            filename = relative
    return json_text(filename)[1:-1]


_LIBRARY_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_STDLIB = os.path.dirname(os.__file__) + os.sep


def site(frame: FrameType | None) -> str:
    """``"site":"tests/test_x.py:12"``: the user's innermost frame outside torch, pytest, this plugin
    and libraries; for a call made inside a library, also ``"caller":"accelerate/accelerator.py:2861"``
    (the library's frame is the site where no user frame led there); and the user's lines that led
    to the site, ``"outer":["tests/test_x.py:30"]`` (a function of theirs called in a branch for one
    rank: code_ties.one_rank_call)."""
    while frame is not None:
        found = _frame_site(frame)
        if found is not None:
            place, in_library = found
            if not in_library:
                return f'"site":"{place}"{_outer(frame.f_back)}'
            user = _user_frame(frame.f_back)
            if user is None:
                return f'"site":"{place}"'
            line = f"{users_file(user.f_code.co_filename)}:{user.f_lineno}"
            return f'"site":"{line}","caller":"{place}"{_outer(user.f_back)}'
        frame = frame.f_back
    return '"site":"?"'


# The most outer lines a call keeps: a test's helpers calling helpers; the walk stops sooner, at
# the first frame that is not the user's (pytest's, which called the test).
_OUTER_DEPTH = 8


def _outer(frame: FrameType | None) -> str:
    """``,"outer":["t.py:30"]``: the user's frames from ``frame`` up, to the first that is not;
    "" where there is none."""
    lines: list[str] = []
    while frame is not None and len(lines) < _OUTER_DEPTH:
        shown = users_file(frame.f_code.co_filename)
        if shown is None:
            break
        lines.append(f'"{shown}:{frame.f_lineno}"')
        frame = frame.f_back
    return f',"outer":[{",".join(lines)}]' if lines else ""


def _frame_site(frame: FrameType) -> tuple[str, bool] | None:
    """``("tests/test_x.py:12", in a library)`` for a frame that can be a call site (an FX graph
    module's: the innermost line outside torch, pytest and this plugin in its node's stack trace);
    None for a frame of torch, pytest or this plugin."""
    filename = frame.f_code.co_filename
    shown = _shown(filename)
    if shown:
        return f"{shown}:{frame.f_lineno}", _in_library(filename)
    if shown is None:
        return None
    for filename, line in reversed(_TRACE_LINE.findall(backend_hook.graph_node_trace(frame) or "")):
        shown = _shown(filename)
        if shown:
            return f"{shown}:{line}", _in_library(filename)
    return None


def _in_library(filename: str) -> bool:
    """An installed library's file, or the standard library's: not the user's code."""
    return filename.startswith(_STDLIB) or any(part in filename for part in _LIBRARY_DIRS)


@functools.cache
def users_file(filename: str) -> str | None:
    """How a call site shows a file of the user's code (:func:`_shown`, JSON-escaped); None for a
    library's, torch's, pytest's or this plugin's."""
    shown = _shown(filename)
    return shown if shown and not _in_library(filename) else None


def _user_frame(frame: FrameType | None) -> FrameType | None:
    """The first user frame from ``frame`` up, outside libraries; None where none is."""
    while frame is not None and users_file(frame.f_code.co_filename) is None:
        frame = frame.f_back
    return frame


class Group(NamedTuple):
    name: str  # "WORLD" for the default group, else its group_name (the same on every rank)
    ranks: list[int]  # global ranks, in group rank order
    text: str  # '"group":"WORLD","ranks":[0,1]'


NO_GROUP = Group("WORLD", [], '"group":"WORLD"')  # before init_process_group
_groups: dict[int, tuple[weakref.ref[Any], Group]] = {}  # id(group) -> (group, description)


def group_of(group: Any) -> Group:
    """A group argument described; cached, as its name and ranks never change."""
    world = c10d.GroupMember.WORLD
    if group is None:
        group = world
    cached = _groups.get(id(group))
    if cached is not None and cached[0]() is group:
        return cached[1]
    if group is None:  # before init_process_group
        return NO_GROUP
    try:
        name = "WORLD" if group is world else _name_in_test(str(group.group_name))
        ranks = dist.get_process_group_ranks(group)
    except Exception:  # not a member (NON_GROUP_MEMBER), or destroyed
        return Group("?", [], '"group":"?"')
    described = Group(name, ranks, group_text(name, ranks))
    _groups[id(group)] = (weakref.ref(group), described)
    return described


def group_text(name: str, ranks: list[int]) -> str:
    return f'"group":{json_text(name)},"ranks":{json_text(ranks)}'


@functools.lru_cache(maxsize=64)
def _type_name(thing: Any) -> str:
    """``"float32"`` for torch.float32, ``"cpu"`` for a device: few, and hashable."""
    return '"' + str(thing).replace("torch.", "") + '"'


def tensors(value: Any) -> str:
    """``,"shapes":...,"dtypes":...,"devices":...`` for a tensor or a list of them, else ""."""
    listed = value if isinstance(value, (list, tuple)) else [value]
    tensors = [v for v in listed if isinstance(v, torch.Tensor)]
    if not tensors:
        return ""
    shapes = ",".join(f"[{','.join(map(str, t.shape))}]" for t in tensors)
    dtypes = ",".join(_type_name(t.dtype) for t in tensors)
    devices = ",".join(_type_name(t.device) for t in tensors)
    return f',"shapes":[{shapes}],"dtypes":[{dtypes}],"devices":[{devices}]'


class _ByteCounter:
    """A file that only counts what is written: a pickled size without a second copy."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: bytes) -> None:
        self.size += len(data)


def _pickled_size(objects: list[Any]) -> int | None:
    """Bytes pickle.dumps makes of each object (as torch sends them); None if one cannot be pickled."""
    counter = _ByteCounter()
    try:
        for obj in objects:
            pickle.Pickler(counter).dump(obj)
    except Exception:  # the real call raises the same, and that is recorded
        return None
    return counter.size


def _given_or_env(value: Any, env: str) -> int | None:
    if value is not None and value != -1:
        return int(value)
    text = os.environ.get(env, "")
    return int(text) if text.lstrip("-").isdigit() else None


def _dialled(method: str) -> str | None:
    """``host:port`` of the store a TCP rendezvous dials (``env://``'s MASTER_ADDR and MASTER_PORT,
    or ``tcp://``'s), as given; None for another rendezvous or where not given."""
    if method.startswith("tcp://"):
        return method[len("tcp://"):].partition("?")[0] or None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{host}:{port}" if method.startswith("env://") and host and port else None


def _elsewhere(address: str | None) -> bool | None:
    """Whether the host of a dialled ``host:port`` is an IP address that is none of this machine's
    (it cannot be bound here: EADDRNOTAVAIL), so that no process here can serve a store there;
    None for a name, which only a lookup that may block would tell, or where no address is dialled."""
    if address is None:
        return None
    host = address.rpartition(":")[0].strip("[]")
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:  # no IPv6 here: EAFNOSUPPORT, not told
            probe.bind((host, 0))
    except OSError as error:
        return True if error.errno == errno.EADDRNOTAVAIL else None
    return False


def _extra(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """What init_process_group and new_group will use: their arguments, else the environment; the
    timeout the group's calls wait, where given."""
    extra: dict[str, Any] = {}
    if op == INIT:
        method = args.get("init_method") or ("store" if args.get("store") is not None else "env://")
        extra["rank"] = _given_or_env(args.get("rank"), "RANK")
        extra["world_size"] = _given_or_env(args.get("world_size"), "WORLD_SIZE")
        extra["init_method"] = method
        extra["address"] = _dialled(method)
        extra["elsewhere"] = _elsewhere(extra["address"])
        extra["backend"] = args.get("backend")  # None: torch's default for the devices
    elif op == NEW_GROUP:
        ranks = args.get("ranks")
        if not ranks:  # None or []: every rank
            extra["ranks"] = list(range(dist.get_world_size()))
        elif isinstance(ranks, (list, tuple, range, set)):  # not an iterator: the real call consumes it
            extra["ranks"] = sorted(ranks)  # sorted, as torch sorts them by default
        # Made by its members only (their ranks name it), not by every rank of the default group.
        if args.get("use_local_synchronization"):
            extra["local"] = True
    else:
        return None
    timeout = args.get("timeout")
    if isinstance(timeout, datetime.timedelta):
        extra["timeout"] = timeout.total_seconds()
    return {k: v for k, v in extra.items() if v is not None} or None


def optional_fields(fields: dict[str, Any]) -> str:
    """``,"key":value`` for each field that is not None or empty."""
    return "".join(f',"{k}":{json_text(v)}' for k, v in fields.items() if v not in (None, [], {}))


def _root(spec: Op, args: dict[str, Any], group: Group) -> int | None:
    """The root or peer as a global rank, however it was given; None if not given."""
    root = args.get(spec.rank) if spec.rank else None
    group_rank = args.get(spec.group_rank) if spec.group_rank else None
    if root is None and group_rank is not None and 0 <= group_rank < len(group.ranks):
        return group.ranks[group_rank]
    return root


def _object_fields(spec: Op, args: dict[str, Any], root: int | None) -> str:
    """``,"obj_type":...,"obj_size":...`` of what a *_object call sends."""
    assert spec.obj is not None
    value = args.get(spec.obj)
    if value is None or (spec.obj_from_root and root != dist.get_rank()):
        return ""
    objects = [value]
    name = type(value).__name__
    if spec.obj.endswith("_list"):
        objects = list(value)
        name = "list[" + ",".join(dict.fromkeys(type(v).__name__ for v in objects)) + "]"
    return optional_fields({"obj_type": name, "obj_size": _pickled_size(objects)})


# (group, the event's fields after "t", the key of the sequence counter the call advances, or None)
Described = tuple[Group, str, "tuple[Any, ...] | None"]


_RED_OP_TYPE = dist.ReduceOp.RedOpType


def reduction(value: Any) -> str:
    """A reduce op's name as torch spells it (``MAX``), however it was given."""
    if type(value) is _RED_OP_TYPE:  # the usual: ReduceOp.MAX
        return str(value.name)
    if isinstance(value, str):
        return value.upper()
    if isinstance(value, torch.ScriptObject):  # c10d's ReduceOp, as its backend operations get it
        value = dist.ReduceOp.RedOpType(value.op())  # type: ignore[attr-defined]
    name = getattr(value, "name", None) or getattr(getattr(value, "op", None), "name", None)
    return str(name) if name else type(value).__name__


@functools.lru_cache(maxsize=64)
def _extra_field(via_backend: bool, reduce_op: str | None) -> str:
    """``,"extra":{...}`` of a reduce op, marked as recorded at the dispatcher or not (a few values)."""
    extra = {"via": "backend", "op": reduce_op} if via_backend else {"op": reduce_op}
    return optional_fields({"extra": {k: v for k, v in extra.items() if v is not None}})


def _call_fields(
    spec: Op, group: Group, described: Any, root: int | None, extra: str, asynchronous: bool
) -> Described:
    """A collective, or a send or receive (numbered per direction and peer), however it was called:
    ``described`` its tensors, ``root`` its root or peer as a global rank (None: it has none, or a
    receive from any source), ``extra`` its ``extra`` field."""
    fields = tensors(described) + extra
    if root is not None:
        fields += f',"{"peer" if spec.pairs else "root"}":{root}'
    if asynchronous:
        fields += ',"async":true'
    return group, fields, (group.name, spec.direction, root) if spec.pairs else (group.name,)


def _describe_call(spec: Op, args: dict[str, Any]) -> Described:
    """A torch.distributed function's collective, send or receive."""
    group = group_of(args.get("group"))
    extra = ""
    if spec.reduction:
        given = args.get(spec.reduction)
        extra = _extra_field(False, DEFAULT_REDUCTION if given is None else reduction(given))
    root = _root(spec, args, group)
    if root is None and spec.rank and not spec.pairs:
        root = 0  # torch's default root
    described = args.get(spec.tensors) if spec.tensors else None
    group, fields, key = _call_fields(spec, group, described, root, extra, bool(args.get("async_op")))
    if spec.obj:
        fields += _object_fields(spec, args, root)
    return group, fields, key


def backend_call(spec: BackendOp, args: dict[str, Any], group: Any, asynchronous: bool) -> Described:
    """A call recorded at the dispatcher (its parameters named as in its schema, its root or peer a
    rank in ``group``): marked as such, with its reduce op."""
    op = OPS[spec.op]
    described_group = group_of(group)
    root = None
    if spec.rank is not None:
        given = args[spec.rank]
        ranks = described_group.ranks
        root = ranks[given] if 0 <= given < len(ranks) else given
    given = args.get(BACKEND_REDUCTION) if op.reduction else None
    extra = _extra_field(True, None if given is None else reduction(given))
    described = args.get(spec.tensors) if spec.tensors else None
    return _call_fields(op, described_group, described, root, extra, asynchronous)


def _describe_batch(spec: Op, args: dict[str, Any]) -> Described:
    """batch_isend_irecv: many peers at once, so a count of its own and no peer."""
    ops = args.get("p2p_op_list") or []
    group = group_of(ops[0].group if ops else None)
    return group, tensors([p.tensor for p in ops]), (group.name, "batch")


def _describe_group_op(spec: Op, args: dict[str, Any]) -> Described:
    """init_process_group, new_group, destroy_process_group: set up or tear down, in no sequence."""
    group = NO_GROUP if spec.name == INIT else group_of(None)
    return group, optional_fields({"extra": _extra(spec.name, args)}), None


DESCRIBERS: dict[str, Callable[[Op, dict[str, Any]], Described]] = {
    "collective": _describe_call,
    "p2p": _describe_call,
    "batch": _describe_batch,
    "group": _describe_group_op,
}


_groups_before_test: int | None = None  # torch's count of groups made when the current test began


def _name_in_test(torch_name: str) -> str:
    """A group's name in reports.  torch numbers groups for the life of the warm process, so the
    test's are numbered from 1 (alike on every member: making a group is collective) and earlier
    ones are ``before-<torch's name>``."""
    if not torch_name.isdigit() or _groups_before_test is None:  # named by the user, or hashed
        return torch_name
    number = int(torch_name) - _groups_before_test + 1  # torch names a group by the count before it
    return str(number) if number > 0 else f"before-{torch_name}"


def start_test() -> None:
    """A new test begins: groups are named from here on (see :func:`_name_in_test`)."""
    global _groups_before_test
    _groups_before_test = backend_hook.groups_made()
    _groups.clear()

"""The recorder: every torch.distributed call of a rank, written before and after it runs.

Installed in each rank before test modules are imported.  It replaces the
public collective and point-to-point functions in ``torch.distributed`` and
``torch.distributed.distributed_c10d`` (so ``from torch.distributed import
all_reduce`` after install gets the wrapper too) and writes a ``call`` event
on entry and a ``ret`` event on exit to the rank's event log (see
:mod:`pytest_ddp.state`).  The event is on disk before the call blocks, so the
controller sees where a rank is stuck while it is stuck, and after it died.

Only the outermost call is recorded: ``all_gather_object`` calls
``all_gather`` inside, through the module's globals, which are wrapped too; a
per-thread depth counter keeps the inner calls out.

DDP's reducer talks to the process group from C++, past these functions. Its
constructor (parameter checks and broadcast) is recorded as one call,
``DistributedDataParallel``, and its gradient allreduces through a
communication hook that records each bucket as ``allreduce`` (a hook the user
registers is wrapped the same way).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import pickle
import sys
import threading
import time
from typing import Any, Callable

from .state import GROUP_OPS, P2P_OPS, EventLog

# op -> (parameter holding the tensor(s) to describe, parameter naming the root or peer)
COLLECTIVES: dict[str, tuple[str | None, str | None]] = {
    "all_reduce": ("tensor", None),
    "all_gather": ("tensor", None),
    "all_gather_into_tensor": ("input_tensor", None),
    "all_gather_object": (None, None),
    "reduce_scatter": ("output", None),
    "reduce_scatter_tensor": ("input", None),
    "all_to_all": ("input_tensor_list", None),
    "all_to_all_single": ("input", None),
    "broadcast": ("tensor", "src"),
    "broadcast_object_list": (None, "src"),
    "reduce": ("tensor", "dst"),
    "gather": ("tensor", "dst"),
    "gather_object": (None, "dst"),
    "scatter": ("tensor", "src"),
    "scatter_object_list": (None, "src"),
    "barrier": (None, None),
    "monitored_barrier": (None, None),
    "send": ("tensor", "dst"),
    "recv": ("tensor", "src"),
    "isend": ("tensor", "dst"),
    "irecv": ("tensor", "src"),
    "send_object_list": (None, "dst"),
    "recv_object_list": (None, "src"),
    "batch_isend_irecv": (None, None),
    "init_process_group": (None, None),
    "new_group": (None, None),
    "destroy_process_group": (None, None),
    # DDP, recorded through its constructor and its communication hook.
    "DistributedDataParallel": (None, None),
    "allreduce": ("tensor", None),
}
# The object argument of *_object calls, whose type and pickled size are recorded.
OBJECT_ARGS = {
    "all_gather_object": "obj",
    "broadcast_object_list": "object_list",
    "gather_object": "obj",
    "scatter_object_list": "scatter_object_input_list",
    "send_object_list": "object_list",
}
INTERNAL_DIRS = tuple(
    os.path.dirname(path) + os.sep
    for path in (
        __file__,
        os.path.dirname(__import__("torch").__file__) + os.sep + "x",
        __import__("pluggy").__file__,
        __import__("_pytest").__file__,
    )
)

_local = threading.local()
_lock = threading.Lock()
_log: EventLog | None = None
_originals: dict[tuple[Any, str], Any] = {}
_test = {"index": 0, "seq": {}}  # per test: next call index, sequence counters


def start_test() -> None:
    """A new test begins: call numbers and sequence numbers start again."""
    with _lock:
        _test["index"] = 0
        _test["seq"] = {}


# -- what a call looks like ----------------------------------------------------


@functools.lru_cache(maxsize=None)
def _site_name(filename: str) -> str | None:
    """How a file is shown in a call site; None for frames of torch, pytest and this plugin."""
    if filename.startswith(INTERNAL_DIRS) or filename.startswith("<"):
        return None
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def _call_site() -> str:
    frame: Any = sys._getframe(1)
    while frame is not None:
        name = _site_name(frame.f_code.co_filename)
        if name is not None:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


_world_ranks: dict[int, list[int]] = {}  # id of the default group -> its ranks


def _group(group: Any) -> tuple[str, list[int]]:
    """(name, global ranks) of a process group argument; "WORLD" for the default group."""
    import torch.distributed as dist

    world = dist.GroupMember.WORLD
    if group is None or group is world:
        if world is None:
            return "WORLD", []
        if id(world) not in _world_ranks:
            _world_ranks.clear()
            _world_ranks[id(world)] = list(range(dist.get_world_size()))
        return "WORLD", _world_ranks[id(world)]
    try:
        return str(group.group_name), dist.get_process_group_ranks(group)
    except Exception:  # a group this rank is not part of, or a destroyed one
        return "?", []


@functools.lru_cache(maxsize=64)
def _name(thing: Any) -> str:
    """``float32`` for torch.float32, ``cpu`` for a device: cached, these are hashable and few."""
    return str(thing).replace("torch.", "")


def _describe_tensors(value: Any, event: dict[str, Any]) -> None:
    tensors = value if isinstance(value, (list, tuple)) else [value]
    shapes, dtypes, devices = [], [], []
    for tensor in tensors:
        if hasattr(tensor, "shape"):
            shapes.append(list(tensor.shape))
            dtypes.append(_name(tensor.dtype))
            devices.append(_name(tensor.device))
    if shapes:
        event.update(shapes=shapes, dtypes=dtypes, devices=devices)


def _describe_object(value: Any, event: dict[str, Any]) -> None:
    event["obj_type"] = type(value).__name__ if not isinstance(value, list) else (
        "list[" + ",".join(sorted({type(v).__name__ for v in value})) + "]"
    )
    try:
        event["obj_size"] = len(pickle.dumps(value))
    except Exception:
        pass  # unpicklable: the real call raises, and that is recorded


def _init_extra(args: dict[str, Any]) -> dict[str, Any]:
    """What init_process_group will use: the arguments, else the environment."""
    def given(name: str, env: str) -> Any:
        value = args.get(name)
        if value is None or value == -1:
            value = os.environ.get(env)
            return int(value) if value is not None and value.lstrip("-").isdigit() else None
        return value

    return {
        "rank": given("rank", "RANK"),
        "world_size": given("world_size", "WORLD_SIZE"),
        "init_method": args.get("init_method") or ("store" if args.get("store") is not None else "env://"),
        "backend": str(args.get("backend")),
    }


def _event(op: str, args: dict[str, Any]) -> dict[str, Any]:
    tensor_arg, root_arg = COLLECTIVES.get(op, (None, None))
    event: dict[str, Any] = {"e": "call", "op": op, "site": _call_site(), "t": time.time()}
    if op == "init_process_group":
        event["extra"] = _init_extra(args)
        event["group"] = "WORLD"
        event["i"], event["seq"] = _number(None)
        return event
    group, ranks = _group(args.get("group"))
    event["group"], event["ranks"] = group, ranks
    if tensor_arg is not None and tensor_arg in args:
        _describe_tensors(args[tensor_arg], event)
    if op in OBJECT_ARGS and OBJECT_ARGS[op] in args:
        _describe_object(args[OBJECT_ARGS[op]], event)
    if op == "batch_isend_irecv":
        _describe_tensors([p.tensor for p in args.get("p2p_op_list", [])], event)
    if args.get("async_op"):
        event["async"] = True
    root = args.get(root_arg) if root_arg else None
    key: tuple[Any, ...] | None
    if op == "batch_isend_irecv":  # many peers at once: a count of its own
        event["peer"] = None
        key = (group, op)
    elif op in P2P_OPS:
        event["peer"] = root
        key = (group, "recv" if "recv" in op else "send", root)
    elif op in GROUP_OPS:
        key = None
    else:
        if root is not None:
            event["root"] = root
        key = (group,)
    event["i"], event["seq"] = _number(key)
    return event


def _number(key: tuple[Any, ...] | None) -> tuple[int, int]:
    """This call's index in the test, and its sequence number under ``key`` (0 without one)."""
    with _lock:
        index = _test["index"]
        _test["index"] += 1
        if key is None:
            return index, 0
        seq = _test["seq"].get(key, 0) + 1
        _test["seq"][key] = seq
        return index, seq


# -- writing --------------------------------------------------------------------

# Keys whose values the fast path below can format: strings, ints, lists of them.
_FAST_KEYS = frozenset({"e", "op", "site", "t", "group", "ranks", "shapes", "dtypes", "devices", "i", "seq", "peer", "root", "async"})
_json = json.JSONEncoder(separators=(",", ":"))


@functools.lru_cache(maxsize=1024)
def _quoted(text: str) -> str:
    return _json.encode(text)


@functools.lru_cache(maxsize=256)
def _names(names: tuple[str, ...]) -> str:
    return _json.encode(list(names))


@functools.lru_cache(maxsize=256)
def _ints(values: tuple[int, ...]) -> str:
    return _json.encode(list(values))


def _call_line(event: dict[str, Any]) -> str:
    """The event's JSON line, from a template for the usual keys: the recorder's hot
    path (the general encoder costs several microseconds a call)."""
    if not _FAST_KEYS.issuperset(event):
        return _json.encode(event)
    line = (
        f'{{"e":"call","op":{_quoted(event["op"])},"site":{_quoted(event["site"])},"t":{event["t"]!r},'
        f'"group":{_quoted(event["group"])},"ranks":{_ints(tuple(event["ranks"]))},"i":{event["i"]},"seq":{event["seq"]}'
    )
    if "shapes" in event:
        line += (
            f',"shapes":{event["shapes"]},"dtypes":{_names(tuple(event["dtypes"]))},'
            f'"devices":{_names(tuple(event["devices"]))}'
        )
    for key in ("peer", "root"):
        if key in event:
            line += f',"{key}":{"null" if event[key] is None else int(event[key])}'
    if event.get("async"):
        line += ',"async":true'
    return line + "}"


# -- the wrappers --------------------------------------------------------------


def _record(op: str, args: dict[str, Any], call: Callable[[], Any]) -> Any:
    """Write the call, run it, write how it ended."""
    depth = getattr(_local, "depth", 0)
    if depth or _log is None:
        return call()
    _local.depth = 1
    try:
        try:
            event = _event(op, args)
        except Exception:  # describing must never break the user's call
            return call()
        index = event["i"]
        _log.write_line(_call_line(event))
        try:
            result = call()
        except BaseException as exc:
            _log.write({"e": "ret", "i": index, "t": time.time(), "ok": False, "err": f"{type(exc).__name__}: {exc}"})
            raise
        _log.write_line(f'{{"e":"ret","i":{index},"t":{time.time()!r},"ok":true}}')
        return result
    finally:
        _local.depth = 0


def _wrap(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    names = list(inspect.signature(original).parameters)

    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        bound = dict(zip(names, args))
        bound.update(kwargs)
        return _record(op, bound, lambda: original(*args, **kwargs))

    recorded.__pytest_ddp_original__ = original  # type: ignore[attr-defined]
    return recorded


def _patch(owner: Any, name: str, replacement: Any) -> None:
    _originals.setdefault((owner, name), getattr(owner, name))
    setattr(owner, name, replacement)


def install(log: EventLog) -> None:
    """Record this process's torch.distributed calls into ``log`` (idempotent)."""
    global _log
    _log = log
    if _originals:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for op in COLLECTIVES:
        original = getattr(c10d, op, None)
        if original is None:
            continue
        wrapped = _wrap(op, original)
        _patch(c10d, op, wrapped)
        if getattr(dist, op, None) is original:
            _patch(dist, op, wrapped)
    _install_ddp()


def uninstall() -> None:
    global _log
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()
    _log = None


# -- DDP -----------------------------------------------------------------------


def _recording_hook(hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A DDP communication hook that records each bucket's allreduce around ``hook``."""

    # No annotations: DDP rejects a hook whose annotations are not GradBucket/Future.
    def recorded_hook(state, bucket):  # type: ignore[no-untyped-def]
        if _log is None:
            return hook(state, bucket)
        group = state if state is not None and hasattr(state, "group_name") else None
        event = _event("allreduce", {"group": group, "tensor": bucket.buffer()})
        event["extra"] = {"via": "ddp"}
        index = event["i"]
        _log.write(event)
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            future = hook(state, bucket)
        finally:
            _local.depth -= 1

        def finished(done: Any) -> Any:
            try:
                value = done.value()
            except BaseException as exc:
                _log.write({"e": "ret", "i": index, "t": time.time(), "ok": False, "err": f"{type(exc).__name__}: {exc}"})
                raise
            _log.write({"e": "ret", "i": index, "t": time.time(), "ok": True})
            return value

        return future.then(finished)

    recorded_hook.__qualname__ = getattr(hook, "__qualname__", "hook")
    return recorded_hook


def _install_ddp() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_init = DDP.__init__
    original_register = DDP.register_comm_hook
    original_forward = DDP.forward

    @functools.wraps(original_init)
    def init(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        _record(
            "DistributedDataParallel",
            {"group": kwargs.get("process_group")},
            lambda: original_init(self, module, *args, **kwargs),
        )

    @functools.wraps(original_register)
    def register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> None:
        original_register(self, state, _recording_hook(hook))

    @functools.wraps(original_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        # No hook of the user's by the first forward: record with DDP's default one.
        if not self._comm_hooks and not getattr(self, "_pytest_ddp_hooked", False):
            self._pytest_ddp_hooked = True
            original_register(self, self.process_group, _recording_hook(allreduce_hook))
        return original_forward(self, *args, **kwargs)

    _patch(DDP, "__init__", init)
    _patch(DDP, "register_comm_hook", register_comm_hook)
    _patch(DDP, "forward", forward)

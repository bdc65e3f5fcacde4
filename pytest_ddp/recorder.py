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

DDP talks to its process group from C++ (its constructor through
``dist._verify_params_across_processes`` and ``dist._broadcast_coalesced``, the
gradient buckets through ``dist.Reducer``), past the Python functions.  Torch
offers no way to put a Python object between a ProcessGroup and its C++
backend (``Backend`` has no Python constructor, and a Python subclass of
``ProcessGroupGloo`` is not dispatched to from C++), but a Python subclass of
``ProcessGroup`` *is* (PyProcessGroup trampoline).  So those three entry
points are handed a :class:`_RecordingGroup` in place of the group: a view of
it that records ``allreduce``, ``allgather`` and ``broadcast`` (all DDP uses)
in the group's own sequence, marked ``"extra": {"via": "ddp"}`` (``"c10d"``
when something other than DDP called the entry point), and passes anything
else straight to the real group's backends.  The user's groups are untouched:
``dist.get_backend()`` still says "gloo", DDP's ``process_group`` is the
user's group, and DDP runs its own built-in allreduce, not a hook.  Those
calls are asynchronous in C++; each one's ``ret`` is written when its work
completes, so a rank waiting for a gradient bucket shows as inside
``allreduce #k``.
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
import weakref
from datetime import timedelta
from types import CodeType, FrameType
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .state import EventLog


class _Op(NamedTuple):
    """How to describe one torch.distributed function's call."""

    kind: str  # "collective", "p2p", "batch" (batch_isend_irecv) or "group" (init/new/destroy)
    tensors: str | None = None  # parameter holding the tensor(s) described
    rank: str | None = None  # parameter holding the root (collectives) or peer (p2p), a global rank
    group_rank: str | None = None  # the same given as a rank in the group (group_src, group_dst)
    obj: str | None = None  # *_object calls: parameter holding the object(s) sent
    obj_from_root: bool = False  # only the root's objects mean anything (broadcast, scatter)


OPS: dict[str, _Op] = {
    "all_reduce": _Op("collective", "tensor"),
    "all_gather": _Op("collective", "tensor"),
    "all_gather_into_tensor": _Op("collective", "input_tensor"),
    "all_gather_object": _Op("collective", obj="obj"),
    "reduce_scatter": _Op("collective", "output"),
    "reduce_scatter_tensor": _Op("collective", "input"),
    "all_to_all": _Op("collective", "input_tensor_list"),
    "all_to_all_single": _Op("collective", "input"),
    "broadcast": _Op("collective", "tensor", "src", "group_src"),
    "broadcast_object_list": _Op("collective", None, "src", "group_src", "object_list", True),
    "reduce": _Op("collective", "tensor", "dst", "group_dst"),
    "gather": _Op("collective", "tensor", "dst", "group_dst"),
    "gather_object": _Op("collective", None, "dst", "group_dst", "obj"),
    "scatter": _Op("collective", "tensor", "src", "group_src"),
    "scatter_object_list": _Op("collective", None, "src", "group_src", "scatter_object_input_list", True),
    "barrier": _Op("collective"),
    "monitored_barrier": _Op("collective"),
    "send": _Op("p2p", "tensor", "dst", "group_dst"),
    "recv": _Op("p2p", "tensor", "src", "group_src"),
    "isend": _Op("p2p", "tensor", "dst", "group_dst"),
    "irecv": _Op("p2p", "tensor", "src", "group_src"),
    "send_object_list": _Op("p2p", None, "dst", "group_dst", "object_list"),
    "recv_object_list": _Op("p2p", None, "src", "group_src"),
    "batch_isend_irecv": _Op("batch"),
    "init_process_group": _Op("group"),
    "new_group": _Op("group"),
    "destroy_process_group": _Op("group"),
}

_DIRECTIONS = {"send": "send", "isend": "send", "send_object_list": "send"}  # else "recv"
_INTERNAL_DIRS = tuple(
    os.path.dirname(module.__file__) + os.sep
    for module in (torch, sys.modules[__package__], __import__("pluggy"), __import__("_pytest"))
)


_DDP_FILE = torch.nn.parallel.distributed.__file__


class _Depth(threading.local):
    depth = 0  # > 0 while this thread is inside a recorded call


_local = _Depth()
_log: EventLog | None = None
_originals: dict[tuple[Any, str], Any] = {}
# (call index, work) of the current test's asynchronous calls: isend, irecv,
# batch_isend_irecv and async_op=True collectives.  Checked when the test ends.
_works: list[tuple[int, Any]] = []


# -- numbering -------------------------------------------------------------------


class _Numbers:
    """Call index and sequence numbers of the current test.  The call event is written
    under the same lock that numbers it, so indices reach the log in order, as
    ``RankState.apply`` expects (``ret`` events find their call by index)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()  # notified when a late ret is written
        self.generation = 0  # which test: a late ret of an earlier test is dropped
        self.index = 0
        self.seq: dict[tuple[Any, ...], int] = {}
        self.late: set[int] = set()  # calls of this test whose ret another thread will write

    def reset(self) -> None:
        with self.lock:
            self.generation += 1
            self.index = 0
            self.seq = {}
            self.late = set()

    def write_call(self, log: EventLog, body: str, key: tuple[Any, ...] | None) -> tuple[int, int]:
        """Number the call (seq 0 without a key), write it; returns (index, generation)."""
        with self.lock:
            index = self.index
            self.index += 1
            seq = 0
            if key is not None:
                seq = self.seq[key] = self.seq.get(key, 0) + 1
            log.write_line(f'{{"e":"call","i":{index},"seq":{seq},{body}}}')
            return index, self.generation

    def expect_late_ret(self, index: int) -> None:
        with self.lock:
            self.late.add(index)

    def write_late_ret(self, log: EventLog, index: int, generation: int, error: BaseException | None) -> None:
        """The ret of a call that completed in another thread, unless its test is over."""
        with self.lock:
            if generation == self.generation:
                _write_ret(log, index, error)
                self.late.discard(index)
                self.lock.notify_all()

    def wait_for_late_rets(self, deadline: float) -> list[int]:
        """Wait until every late ret is written or the deadline passes; the calls still without one."""
        with self.lock:
            self.lock.wait_for(lambda: not self.late, max(deadline - time.monotonic(), 0))
            return sorted(self.late)


_numbers = _Numbers()


def start_test() -> None:
    """A new test begins: call numbers and sequence numbers start again."""
    _numbers.reset()
    _works.clear()


def unfinished_work(wait: float) -> list[dict[str, Any]]:
    """The current test's asynchronous calls whose work has not completed: each
    gets up to ``wait`` seconds in all.  ``[{"i": call index, "err": why}]``.

    Work the test waited for is complete already and costs nothing here.
    Gloo marks send and receive work complete only inside ``wait()``, so the
    rest is waited for, with a timeout: never without one (a receive nobody
    sends to would block forever), and never twice (a second wait on a send
    waits for another send).

    DDP's collectives get their ret written by a callback, which may run in
    Gloo's thread just after DDP's wait returned: those rets are waited for,
    so that the log is whole before the rank says it is done.
    """
    deadline = time.monotonic() + wait
    unfinished = []
    for index, work in _works:
        if work.is_completed():
            continue
        # c10d reads a zero timeout as "no timeout".
        remaining = timedelta(seconds=max(deadline - time.monotonic(), 0.001))
        try:
            work.wait(remaining)
        except Exception as exc:  # timed out, or the work failed
            unfinished.append({"i": index, "err": (str(exc).strip().splitlines() or ["?"])[0][:200]})
    _works.clear()
    unfinished += [{"i": index, "err": "still running"} for index in _numbers.wait_for_late_rets(deadline)]
    return unfinished


# -- what a call looks like ----------------------------------------------------

_json = json.JSONEncoder(separators=(",", ":"), default=str).encode
_UNSEEN = object()
_site_files: dict[str, str | None] = {}  # co_filename -> how a site shows it (escaped), None if internal


def _site_file(filename: str) -> str | None:
    if filename.startswith(_INTERNAL_DIRS) or filename.startswith("<frozen "):
        return None
    if os.path.isabs(filename):
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            filename = relative
    return _json(filename)[1:-1]


def _shown(filename: str) -> str | None:
    """How a call site shows a frame's file (JSON-escaped); None for internal files (cached)."""
    shown = _site_files.get(filename, _UNSEEN)
    if shown is _UNSEEN:
        shown = _site_files[filename] = _site_file(filename)
    return shown  # type: ignore[return-value]


_sites: dict[tuple[int, int], tuple[CodeType, str]] = {}  # (id(code), f_lasti) -> (code, site)


def _site(frame: FrameType | None) -> str:
    """``"site":"tests/test_x.py:12"``: the first frame outside torch, pytest and this plugin.

    Cached per instruction: ``f_lineno`` scans the code's line table, which costs
    microseconds in a long function.  The cache holds the code object, so its id
    cannot be reused by another while cached."""
    while frame is not None:
        code = frame.f_code
        key = (id(code), frame.f_lasti)
        cached = _sites.get(key)
        if cached is not None and cached[0] is code:
            return cached[1]
        shown = _shown(code.co_filename)
        if shown is not None:
            if len(_sites) > 10000:
                _sites.clear()
            site = f'"site":"{shown}:{frame.f_lineno}"'
            _sites[key] = (code, site)
            return site
        frame = frame.f_back
    return '"site":"?"'


def _called_by_ddp(frame: FrameType | None) -> bool:
    """Whether DDP's module is among the internal frames above the user's call site."""
    while frame is not None and _shown(frame.f_code.co_filename) is None:
        if frame.f_code.co_filename == _DDP_FILE:
            return True
        frame = frame.f_back
    return False


class _Group(NamedTuple):
    name: str  # "WORLD" for the default group, else its group_name (the same on every rank)
    ranks: list[int]  # global ranks, in group rank order
    text: str  # '"group":"WORLD","ranks":[0,1]'


_NO_GROUP = _Group("WORLD", [], '"group":"WORLD"')  # before init_process_group
_groups: dict[int, tuple[weakref.ref[Any], _Group]] = {}  # id(group) -> (group, description)


def _group(group: Any) -> _Group:
    """A group argument described; cached, as its name and ranks never change."""
    world = c10d.GroupMember.WORLD
    if group is None:
        group = world
    cached = _groups.get(id(group))
    if cached is not None and cached[0]() is group:
        return cached[1]
    if group is None:  # before init_process_group
        return _NO_GROUP
    try:
        name = "WORLD" if group is world else str(group.group_name)
        ranks = dist.get_process_group_ranks(group)
    except Exception:  # not a member (NON_GROUP_MEMBER), or destroyed
        return _Group("?", [], '"group":"?"')
    described = _Group(name, ranks, f'"group":{_json(name)},"ranks":{_json(ranks)}')
    _groups[id(group)] = (weakref.ref(group), described)
    return described


@functools.lru_cache(maxsize=64)
def _type_name(thing: Any) -> str:
    """``"float32"`` for torch.float32, ``"cpu"`` for a device: few, and hashable."""
    return '"' + str(thing).replace("torch.", "") + '"'


def _describe_tensors(tensors: list[torch.Tensor]) -> str:
    shapes = ",".join(f"[{','.join(map(str, t.shape))}]" for t in tensors)
    dtypes = ",".join(_type_name(t.dtype) for t in tensors)
    devices = ",".join(_type_name(t.device) for t in tensors)
    return f',"shapes":[{shapes}],"dtypes":[{dtypes}],"devices":[{devices}]'


_single_tensors: dict[tuple[Any, ...], str] = {}  # (shape, dtype, device) -> description


def _tensors(value: Any) -> str:
    """``,"shapes":...,"dtypes":...,"devices":...`` for a tensor or a list of them, else ""."""
    if isinstance(value, torch.Tensor):  # the usual case: cached
        key = (value.shape, value.dtype, value.device)
        text = _single_tensors.get(key)
        if text is None:
            if len(_single_tensors) > 4096:
                _single_tensors.clear()
            text = _single_tensors[key] = _describe_tensors([value])
        return text
    if isinstance(value, (list, tuple)):
        tensors = [v for v in value if isinstance(v, torch.Tensor)]
        if tensors:
            return _describe_tensors(tensors)
    return ""


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


def _objects(value: Any, is_list: bool) -> str:
    """``,"obj_type":...,"obj_size":...`` of what a *_object call sends."""
    objects = list(value) if is_list else [value]
    name = type(value).__name__
    if is_list:
        name = "list[" + ",".join(dict.fromkeys(type(v).__name__ for v in objects)) + "]"
    return _optional({"obj_type": name, "obj_size": _pickled_size(objects)})


def _given_or_env(value: Any, env: str) -> int | None:
    if value is not None and value != -1:
        return int(value)
    text = os.environ.get(env, "")
    return int(text) if text.lstrip("-").isdigit() else None


def _extra(op: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """What init_process_group and new_group will use: their arguments, else the environment."""
    if op == "init_process_group":
        method = args.get("init_method") or ("store" if args.get("store") is not None else "env://")
        extra = {
            "rank": _given_or_env(args.get("rank"), "RANK"),
            "world_size": _given_or_env(args.get("world_size"), "WORLD_SIZE"),
            "init_method": method,
            "backend": args.get("backend"),  # None: torch's default for the devices
        }
        return {k: v for k, v in extra.items() if v is not None}
    if op == "new_group":
        ranks = args.get("ranks")
        if not ranks:  # None or []: every rank
            return {"ranks": list(range(dist.get_world_size()))}
        # Sorted, as torch sorts them by default; an iterator is left for the real call to consume.
        return {"ranks": sorted(ranks)} if isinstance(ranks, (list, tuple, range, set)) else None
    return None


def _optional(fields: dict[str, Any]) -> str:
    """``,"key":value`` for each field that is not None or empty."""
    return "".join(f',"{k}":{_json(v)}' for k, v in fields.items() if v not in (None, [], {}))


def _root(spec: _Op, args: dict[str, Any], group: _Group) -> int | None:
    """The root or peer as a global rank, however it was given; None if not given."""
    root = args.get(spec.rank) if spec.rank else None
    group_rank = args.get(spec.group_rank) if spec.group_rank else None
    if root is None and group_rank is not None and 0 <= group_rank < len(group.ranks):
        return group.ranks[group_rank]
    return root


def _object_fields(spec: _Op, args: dict[str, Any], root: int | None) -> str:
    obj = args.get(spec.obj) if spec.obj else None
    if obj is None or (spec.obj_from_root and root != dist.get_rank()):
        return ""
    return _objects(obj, spec.obj.endswith("_list"))  # type: ignore[union-attr]


# What a describer returns: the group, the event's fields after "t", the key of the
# sequence counter the call advances (None: it advances none).
_Described = tuple[_Group, str, "tuple[Any, ...] | None"]


def _describe_collective(op: str, spec: _Op, args: dict[str, Any]) -> _Described:
    group = _group(args.get("group"))
    fields = _tensors(args.get(spec.tensors)) if spec.tensors else ""
    root = None
    if spec.rank:
        root = _root(spec, args, group)
        root = 0 if root is None else root  # torch's default root
        fields += f',"root":{root}'
    if spec.obj:
        fields += _object_fields(spec, args, root)
    if args.get("async_op"):
        fields += ',"async":true'
    return group, fields, (group.name,)


def _describe_p2p(op: str, spec: _Op, args: dict[str, Any]) -> _Described:
    group = _group(args.get("group"))
    fields = _tensors(args.get(spec.tensors)) if spec.tensors else ""
    peer = _root(spec, args, group)  # None: a receive from any source
    if peer is not None:
        fields += f',"peer":{peer}'
    if spec.obj:
        fields += _object_fields(spec, args, peer)
    return group, fields, (group.name, _DIRECTIONS.get(op, "recv"), peer)


def _describe_batch(op: str, spec: _Op, args: dict[str, Any]) -> _Described:
    """batch_isend_irecv: many peers at once, so a count of its own and no peer."""
    ops = args.get("p2p_op_list") or []
    group = _group(ops[0].group if ops else None)
    return group, _tensors([p.tensor for p in ops]), (group.name, "batch")


def _describe_group_op(op: str, spec: _Op, args: dict[str, Any]) -> _Described:
    """init_process_group, new_group, destroy_process_group: set up or tear down, in no sequence."""
    group = _NO_GROUP if op == "init_process_group" else _group(None)
    return group, _optional({"extra": _extra(op, args)}), None


_DESCRIBERS: dict[str, Callable[[str, _Op, dict[str, Any]], _Described]] = {
    "collective": _describe_collective,
    "p2p": _describe_p2p,
    "batch": _describe_batch,
    "group": _describe_group_op,
}


def _write_ret(log: EventLog, index: int, error: BaseException | None) -> None:
    if error is None:
        log.write_line(f'{{"e":"ret","i":{index},"t":{time.time()!r},"ok":true}}')
    else:
        log.write({"e": "ret", "i": index, "t": time.time(), "ok": False, "err": f"{type(error).__name__}: {error}"})


# -- the Python functions ------------------------------------------------------


def _wrap(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    spec = OPS[op]
    describe = _DESCRIBERS[spec.kind]
    names = tuple(inspect.signature(original).parameters)
    prefix = f'"op":"{op}",'

    # The recorder's hot path: write the call, run it, write how it ended.
    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        log = _log
        if log is None or _local.depth:
            return original(*args, **kwargs)
        _local.depth = 1
        try:
            try:
                bound = dict(zip(names, args))
                bound.update(kwargs)
                group, fields, key = describe(op, spec, bound)
                body = f'{prefix}{group.text},{_site(sys._getframe(1))},"t":{time.time()!r}{fields}'
            except Exception:  # describing must never break the user's call
                return original(*args, **kwargs)
            index, _ = _numbers.write_call(log, body, key)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                _write_ret(log, index, exc)
                raise
            log.write_line(f'{{"e":"ret","i":{index},"t":{time.time()!r},"ok":true}}')
            if result is not None and (spec.kind in ("p2p", "batch") or bound.get("async_op")):
                for work in result if isinstance(result, list) else [result]:
                    if isinstance(work, dist.Work):
                        _works.append((index, work))
            return result
        finally:
            _local.depth = 0

    return recorded


# -- DDP: the C++ side, through a recording view of the group --------------------


def _backend_type(name: str) -> Any:
    return dist.Backend.backend_type_map.get(name, dist.ProcessGroup.BackendType.CUSTOM)


class _RecordingGroup(dist.ProcessGroup):
    """The real group ``inner`` as C++ callers see it, with allreduce, allgather and broadcast
    recorded.  It holds the real group's backends, so any other call reaches them unrecorded.

    Each recorded call is written on entry; its ``ret`` when its work completes (in
    the backend's thread: the caller waits on the work's future, not on this code)."""

    def __init__(self, inner: dist.ProcessGroup, via: str) -> None:
        super().__init__(inner.rank(), inner.size())
        for device in inner._device_types:
            backend = inner._get_backend(device)
            self._register_backend(device, _backend_type(backend.name()), backend)
        self._set_default_backend(_backend_type(inner._get_backend_name()))
        if inner.bound_device_id is not None:
            self.bound_device_id = inner.bound_device_id
        self._inner = inner
        self._group = _group(inner)
        self._extra = f',"extra":{{"via":"{via}"}}'

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._record("allreduce", tensors, "", lambda: self._inner.allreduce(tensors, opts))

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._record("allgather", inputs, "", lambda: self._inner.allgather(outputs, inputs, opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        ranks = self._group.ranks
        root = f',"root":{ranks[opts.rootRank] if opts.rootRank < len(ranks) else opts.rootRank}'
        return self._record("broadcast", tensors, root, lambda: self._inner.broadcast(tensors, opts))

    def _record(self, op: str, tensors: list[torch.Tensor], fields: str, submit: Callable[[], Any]) -> Any:
        log = _log
        if log is None or _local.depth:  # a Python function's call, recorded already
            return submit()
        try:
            site = _site(sys._getframe(1))
            body = f'"op":"{op}",{self._group.text},{site},"t":{time.time()!r}{_tensors(tensors)}{fields}{self._extra}'
        except Exception:  # describing must never break the call
            return submit()
        index, generation = _numbers.write_call(log, body, (self._group.name,))
        try:
            work = submit()
        except BaseException as exc:
            _write_ret(log, index, exc)
            raise
        _numbers.expect_late_ret(index)
        work.get_future().add_done_callback(functools.partial(_completed, log, index, generation))
        return work


def _completed(log: EventLog, index: int, generation: int, future: Any) -> None:
    error = None
    try:
        future.value()
    except Exception as exc:
        error = exc
    _numbers.write_late_ret(log, index, generation, error)


def _recording_view(group: dist.ProcessGroup, via: str) -> dist.ProcessGroup:
    """The recording view of ``group``; the group itself where none can be made (a kind of
    group this was not written for): recording must never break the user's code."""
    try:
        return _RecordingGroup(group, via)
    except Exception:
        return group


def _group_arg_viewed(original: Callable[..., Any]) -> Callable[..., Any]:
    """A C++ function whose first argument is a group, given the recording view instead."""

    @functools.wraps(original)
    def viewed(process_group: dist.ProcessGroup, *args: Any, **kwargs: Any) -> Any:
        via = "ddp" if _called_by_ddp(sys._getframe(1)) else "c10d"
        return original(_recording_view(process_group, via), *args, **kwargs)

    return viewed


def _recording_reducer(reducer: type) -> type:
    """``dist.Reducer`` whose process group (4th argument) is the recording view."""

    class RecordingReducer(reducer):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if len(args) > 3:
                args = (*args[:3], self._keep_view(args[3]), *args[4:])
            else:
                kwargs["process_group"] = self._keep_view(kwargs["process_group"])
            super().__init__(*args, **kwargs)

        def _update_process_group(self, new_process_group: dist.ProcessGroup) -> None:
            super()._update_process_group(self._keep_view(new_process_group))

        def _keep_view(self, group: dist.ProcessGroup) -> dist.ProcessGroup:
            # Kept here: the C++ reducer alone would not keep the Python half of the view alive.
            self._recording_group = _recording_view(group, "ddp")
            return self._recording_group

    return RecordingReducer


# -- install -------------------------------------------------------------------


def _patch(owner: Any, name: str, replacement: Any) -> None:
    _originals.setdefault((owner, name), getattr(owner, name))
    setattr(owner, name, replacement)


def install(log: EventLog) -> None:
    """Record this process's torch.distributed calls into ``log`` (idempotent; a second
    call only switches the log)."""
    global _log
    _log = log
    if _originals:
        return
    for op in OPS:
        original = getattr(c10d, op, None)
        if original is None:  # not in this torch
            continue
        wrapped = _wrap(op, original)
        _patch(c10d, op, wrapped)
        if getattr(dist, op, None) is original:
            _patch(dist, op, wrapped)
    # DDP's C++ entry points (private names: skipped where this torch lacks one).
    if hasattr(dist, "Reducer"):
        _patch(dist, "Reducer", _recording_reducer(dist.Reducer))
    for name in ("_broadcast_coalesced", "_verify_params_across_processes"):
        if hasattr(dist, name):
            _patch(dist, name, _group_arg_viewed(getattr(dist, name)))


def uninstall() -> None:
    """Put torch.distributed back as it was (for tests)."""
    global _log
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()
    _groups.clear()
    _log = None

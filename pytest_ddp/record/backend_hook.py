"""Every collective that reaches a process group's backend, whoever issued it.

Every issuer (torch.distributed, DDP's reducer, functional collectives, FSDP2) goes through a
``c10d::`` dispatcher operation.  A Python kernel registered under BackendSelect sees every call,
also under inference mode and inside other kernels, where the autograd keys are excluded; it hands
the call to the recorder, which redispatches it.  Such a kernel is dear (the process group and
options are boxed), so:

- The functional collectives are recorded at their own, cheaper operations,
  and ``_c10d_functional::wait_tensor``, where their caller blocks, is hooked.
  One missing from :data:`pytest_ddp.common.ops.FUNCTIONAL_OPS`, or any in a
  torch whose waits do not cross threads, arms the c10d kernels instead.
- The c10d kernels are registered only while a test may issue collectives
  outside those (:func:`arm` to :func:`disarm`).

Every private torch name the plugin relies on is used here alone; where this torch lacks one,
:func:`install` returns False and only the torch.distributed functions are recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import FrameType, FunctionType
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as _functional_collectives

from pytest_ddp.common.ops import BACKEND_OPS, FUNCTIONAL_OPS, BackendOp

Record = Callable[[BackendOp, "dict[str, Any]", Callable[[], Any]], Any]
# handle(args, kwargs, run): what a kernel does with a call, ``run()`` handing it on
Handle = Callable[["tuple[Any, ...]", "dict[str, Any]", Callable[[], Any]], Any]
F = TypeVar("F", bound=Callable[..., Any])
# Whether a call should be handed to ``record`` now (False inside a recorded function's call)
Recording = Callable[[], bool]
# wait(tensor, run): the caller blocks in run() until the collective producing ``tensor`` is done
Wait = Callable[[torch.Tensor, Callable[[], Any]], Any]

# The registrations live as long as these library objects.
_functional_library: Any = None
_collectives_library: Any = None
_arm_with: tuple[Record, Recording] | None = None  # what arm() registers the c10d kernels with
_arming = threading.Lock()
_traced_as: list[Callable[..., Any]] = []  # what traced_as added to torch.compile's table
_NOT_FUNCTIONAL_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd")


class _IssuedBy(threading.local):
    # The functional collective that issued the c10d operation being recorded (its name in
    # FUNCTIONAL_OPS, "" where it has none), or None.
    functional: str | None = None


issued_by = _IssuedBy()


def install(record: Record, record_functional: Record, wait: Wait, recording: Recording) -> bool:
    """Hook the functional collectives and be ready to :func:`arm`; False where this torch cannot."""
    global _functional_library, _arm_with
    if _functional_library is not None:
        return True
    try:
        at_own_operations = _waits_across_threads()
        functional_record = record_functional if at_own_operations else None
        _functional_library = _functional_kernels(functional_record, wait, recording)
    except Exception:  # a torch without these operations, keys or registration API
        return False
    _arm_with = (record, recording)
    return True


def arm() -> None:
    """Hook every c10d operation until :func:`disarm`: collectives may now bypass the functions."""
    global _collectives_library, _arm_with
    if _collectives_library is not None or _arm_with is None:
        return
    with _arming:
        if _collectives_library is None and _arm_with is not None:
            try:
                _collectives_library = _collective_kernels(*_arm_with)
            except Exception:  # this torch cannot: only the torch.distributed functions are recorded
                _arm_with = None


def disarm() -> None:
    """Unhook the c10d operations: the next test pays for the hook only if it needs it."""
    global _collectives_library
    with _arming:
        if _collectives_library is not None:
            _collectives_library._destroy()
            _collectives_library = None


def armed() -> bool:
    """Whether every c10d operation is hooked."""
    return _collectives_library is not None


def uninstall() -> None:
    """Remove the kernels (dropping the libraries deregisters them), and what traced_as added."""
    global _functional_library, _collectives_library, _arm_with
    while _traced_as:
        _functional_collectives.traceable_collective_remaps.pop(_traced_as.pop(), None)
    for library in (_functional_library, _collectives_library):
        if library is not None:
            library._destroy()
    _functional_library = _collectives_library = _arm_with = None


def _collective_kernels(record: Record, recording: Recording) -> Any:
    collectives = torch.library.Library("c10d", "IMPL")
    for name, spec in BACKEND_OPS.items():
        if not torch._C._dispatch_has_kernel(f"c10d::{name}"):  # not in this torch
            continue
        overload = getattr(torch.ops.c10d, name).default
        kernel = _kernel(overload, _by_name(overload, record, spec), recording)
        collectives.impl(name, kernel, "BackendSelect", with_keyset=True)
    return collectives


def _waits_across_threads() -> bool:
    """Whether a wait_tensor in one thread finds the work that a functional collective of another
    thread registered (not in torch 2.8).  Where not, the recorder needs each one's Work, which
    only the c10d operation it issues has (see :func:`_issuing`)."""
    c10d_c: Any = torch._C._distributed_c10d
    tensor = torch.empty(1)
    done: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    done.set_result([tensor])
    before = c10d_c._get_work_registry_size()  # this thread's
    c10d_c._register_work(tensor, c10d_c._create_work_from_future(done))
    waiting = threading.Thread(target=torch.ops._c10d_functional.wait_tensor, args=(tensor,))
    waiting.start()
    waiting.join()
    found = c10d_c._get_work_registry_size() == before
    if not found:
        torch.ops._c10d_functional.wait_tensor(tensor)  # its registry's entry goes
    return found


def _functional_kernels(record: Record | None, wait: Wait, recording: Recording) -> Any:
    """Their kernels and wait_tensor's (``record`` None: each arms the c10d kernels instead)."""
    functional = torch.library.Library("_c10d_functional", "IMPL")
    wait_tensor = torch.ops._c10d_functional.wait_tensor.default
    waiting = _kernel(wait_tensor, lambda args, kwargs, run: wait(args[0], run))  # wait_tensor(tensor)
    functional.impl("wait_tensor", waiting, "BackendSelect", with_keyset=True)
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, name = qualified.partition("::")
        if namespace != "_c10d_functional" or name in _NOT_FUNCTIONAL_COLLECTIVES:
            continue
        packet = getattr(torch.ops._c10d_functional, name)
        spec = FUNCTIONAL_OPS.get(name)
        for overload in packet.overloads():
            registered = name if overload == "default" else f"{name}.{overload}"
            operation = getattr(packet, overload)
            if spec is not None and record is not None:
                kernel = _kernel(operation, _by_name(operation, record, spec), recording)
            else:
                kernel = _kernel(operation, _issuing(spec.op if spec else ""))
            functional.impl(registered, kernel, "BackendSelect", with_keyset=True)
    return functional


def out_of_compile(function: F, recursive: bool = True) -> F:
    """``function`` kept out of torch.compile (a graph break; its frames, and where ``recursive``
    those it runs, not compiled), as ``torch._dynamo.skip`` does without importing Dynamo (a
    second).  Dynamo would trace the recorder with fake tensors, or recompile it each call."""
    function._torchdynamo_disable = True  # type: ignore[attr-defined]
    frames: Any = getattr(torch._C, "_dynamo", None)
    frames = getattr(frames, "eval_frame", None)
    if hasattr(frames, "set_code_exec_strategy"):  # else this torch's Dynamo compiles its frame
        action = frames._FrameAction
        nested = action.SKIP if recursive else action.DEFAULT
        frames.set_code_exec_strategy(function.__code__, frames._FrameExecStrategy(action.SKIP, nested))
    return function


out_of_compile(arm)  # what the recorder's wrappers that stay in compiled code call (recorder._arming)


def traced_as(original: Callable[..., Any], replacement: Callable[..., Any]) -> None:
    """Have torch.compile trace ``replacement`` as it traces torch.distributed's ``original``: as a
    functional collective in the graph, which the recorder records when the compiled code runs."""
    remaps = getattr(_functional_collectives, "traceable_collective_remaps", None)
    if isinstance(remaps, dict) and isinstance(original, FunctionType) and original in remaps:
        remaps[replacement] = remaps[original]
        _traced_as.append(replacement)


def graph_node_trace(frame: FrameType) -> str | None:
    """The stack trace Dynamo recorded for the node an FX graph module's frame runs, or None."""
    try:
        module: Any = frame.f_locals.get("self")
        index = module._lineno_map.get(frame.f_lineno - module._prologue_start)
        trace = list(module.graph.nodes)[index].meta.get("stack_trace")
    except Exception:  # not a graph module's frame, or one of another torch
        return None
    return trace if isinstance(trace, str) else None


def tensors_in(values: Any) -> Iterator[torch.Tensor]:
    """Every tensor in an operation's arguments (tensors, lists of them, lists of lists)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from tensors_in(value)


# The keys a kernel at BackendSelect hands its call on with: those of the call, past this hook.
_PAST_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
# A call whose keys hold Meta runs on fake or meta tensors (fake mode includes Meta too): it is
# traced, not run, and no collective takes place.  It is handed on unrecorded.
_META = torch._C.DispatchKey.Meta
_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE
_dispatch_mode = torch._C._get_dispatch_mode


def tracing() -> bool:
    """Whether a fake tensor mode is on (torch.export, make_fx): a collective now sends nothing."""
    return _dispatch_mode(_FAKE_MODE) is not None


def _kernel(overload: Any, handle: Handle, recording: Recording = lambda: True) -> Callable[..., Any]:
    """``overload``'s kernel: a call that runs (not traced) while ``recording()`` goes to ``handle``."""
    redispatch = overload._handle.redispatch_boxed  # what overload.redispatch calls, a frame less

    def kernel(keys: Any, *args: Any, **kwargs: Any) -> Any:
        keys = keys & _PAST_BACKEND_SELECT
        # A c10d operation's usual case: the torch.distributed function recorded it.
        if keys.has(_META) or not recording():
            return redispatch(keys, *args, **kwargs)
        return handle(args, kwargs, lambda: redispatch(keys, *args, **kwargs))

    return out_of_compile(kernel)


def _by_name(overload: Any, record: Record, spec: BackendOp) -> Handle:
    """``record(spec, arguments by name, run)``: the handle of a recorded operation."""
    names = [argument.name for argument in overload._schema.arguments]

    def handle(args: tuple[Any, ...], kwargs: dict[str, Any], run: Callable[[], Any]) -> Any:
        arguments = dict(zip(names, args))
        arguments.update(kwargs)
        return record(spec, arguments, run)

    return handle


def _issuing(name: str) -> Handle:
    """A functional collective recorded at the c10d operation it issues (``name`` "": not in
    FUNCTIONAL_OPS)."""

    def issue(args: tuple[Any, ...], kwargs: dict[str, Any], run: Callable[[], Any]) -> Any:
        arm()
        outer, issued_by.functional = issued_by.functional, name
        try:
            return run()
        finally:
            issued_by.functional = outer

    return issue


def wait_tensor(tensor: torch.Tensor) -> None:
    """Wait for the functional collective that produces ``tensor`` (no timeout; at once if none)."""
    torch.ops._c10d_functional.wait_tensor(tensor)


def groups_made() -> int | None:
    """How many process groups torch has named in this process; None where this torch does not say."""
    count = getattr(getattr(dist.distributed_c10d, "_world", None), "group_count", None)
    return count if isinstance(count, int) else None


def process_group(arguments: dict[str, Any]) -> dist.ProcessGroup:
    """The ProcessGroup a c10d operation was called on (its argument is a script object)."""
    return dist.ProcessGroup.unbox(arguments["process_group"])


def named_group(arguments: dict[str, Any]) -> dist.ProcessGroup:
    """The ProcessGroup a functional collective was called on: its ``group_name``, a name or a boxed group."""
    group = arguments["group_name"]
    if isinstance(group, str):
        resolve: Any = dist.distributed_c10d._resolve_process_group  # typed for a NewType of str
        return resolve(group)
    return dist.ProcessGroup.unbox(group)


def work_of(result: Any) -> dist.Work | None:
    """The Work a c10d operation returned (alone, or after its tensors); None if it returns none."""
    boxed = result[-1] if isinstance(result, tuple) and result else result
    if isinstance(boxed, torch.ScriptObject):
        return dist.Work.unbox(boxed)
    return None


def collectives_handed(group: Any) -> int | None:
    """How many collectives ``group`` (None: the default) has handed its backend, or None."""
    chosen: Any = group or dist.distributed_c10d.GroupMember.WORLD  # read on every collective: no checks
    try:
        return chosen._get_sequence_number_for_group()
    except Exception:  # no group (before init_process_group), not a member, a backend that keeps none
        return None


def raised_before_backend(group: Any, handed_before: int | None) -> bool:
    """A collective on a Gloo group raised before its backend was handed it (an argument check),
    so the group is as good as before.  On Gloo the count moves for every collective the backend
    takes, failed or timed out included (not for send or receive)."""
    if handed_before is None:
        return False
    try:
        gloo = dist.get_backend(group) == "gloo"
    except Exception:
        return False
    return gloo and collectives_handed(group) == handed_before

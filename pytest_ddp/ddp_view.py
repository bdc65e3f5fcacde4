"""DDP's collectives, recorded through a view of its process group.

DDP talks to its process group from C++ (its constructor through
``dist._verify_params_across_processes`` and ``dist._broadcast_coalesced``, the
gradient buckets through ``dist.Reducer``), past the Python functions.  Torch
offers no way to put a Python object between a ProcessGroup and its C++
backend (``Backend`` has no Python constructor, and a Python subclass of
``ProcessGroupGloo`` is not dispatched to from C++), but a Python subclass of
``ProcessGroup`` *is* (PyProcessGroup trampoline).  So those three entry
points are handed a :class:`RecordingGroup` in place of the group: a view of
it that records ``allreduce``, ``allgather`` and ``broadcast`` (all DDP uses)
and passes anything else straight to the real group's backends.  The user's
groups are untouched: ``dist.get_backend()`` still says "gloo", DDP's
``process_group`` is the user's group, and DDP runs its own built-in
allreduce, not a hook.

Every private torch name the plugin relies on is used here and nowhere else,
each with its fallback: where this torch lacks one (or a group is of a kind
the view cannot copy), DDP's collectives go unrecorded and nothing else
changes.
"""

from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import Any, Callable

import torch
import torch.distributed as dist

# Starts the real call and returns its Work.
Submit = Callable[[], Any]
# The recorder's side: record(view, op, tensors, root as a group rank or None, submit) -> Work.
Record = Callable[["RecordingGroup", str, "list[torch.Tensor]", "int | None", Submit], Any]
# The C++ entry points that take DDP's process group as their first argument.
GROUP_FIRST_ENTRY_POINTS = ("_broadcast_coalesced", "_verify_params_across_processes")


def _backend_type(name: str) -> Any:
    return dist.Backend.backend_type_map.get(name, dist.ProcessGroup.BackendType.CUSTOM)


class RecordingGroup(dist.ProcessGroup):
    """The real group ``inner`` as C++ callers see it, with allreduce, allgather and broadcast
    handed to ``record``.  It holds the real group's backends, so any other call reaches them
    unrecorded."""

    def __init__(self, inner: dist.ProcessGroup, via: str, record: Record) -> None:
        super().__init__(inner.rank(), inner.size())
        for device in inner._device_types:
            backend = inner._get_backend(device)
            self._register_backend(device, _backend_type(backend.name()), backend)
        self._set_default_backend(_backend_type(inner._get_backend_name()))
        if inner.bound_device_id is not None:
            self.bound_device_id = inner.bound_device_id
        self.inner = inner
        self.via = via  # "ddp", or "c10d" when something other than DDP called the entry point
        self._record = record

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._record(self, "allreduce", tensors, None, lambda: self.inner.allreduce(tensors, opts))

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        return self._record(self, "allgather", inputs, None, lambda: self.inner.allgather(outputs, inputs, opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._record(self, "broadcast", tensors, opts.rootRank, lambda: self.inner.broadcast(tensors, opts))


def recording_view(group: dist.ProcessGroup, via: str, record: Record) -> dist.ProcessGroup:
    """The recording view of ``group``; the group itself where none can be made (a torch
    without these private names, a kind of group this was not written for)."""
    try:
        return RecordingGroup(group, via, record)
    except Exception:
        return group


def _group_arg_viewed(
    original: Callable[..., Any], record: Record, called_by_ddp: Callable[[FrameType], bool]
) -> Callable[..., Any]:
    """A C++ function whose first argument is a group, given the recording view instead."""

    @functools.wraps(original)
    def viewed(process_group: dist.ProcessGroup, *args: Any, **kwargs: Any) -> Any:
        via = "ddp" if called_by_ddp(sys._getframe(1)) else "c10d"
        return original(recording_view(process_group, via, record), *args, **kwargs)

    return viewed


def _recording_reducer(reducer: type, record: Record) -> type:
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
            self._recording_group = recording_view(group, "ddp", record)
            return self._recording_group

    return RecordingReducer


def entry_points(
    distributed: Any, record: Record, called_by_ddp: Callable[[FrameType], bool]
) -> dict[str, Any]:
    """Replacements for DDP's C++ entry points in ``distributed`` (torch.distributed), by
    name: only for those this torch has."""
    replacements: dict[str, Any] = {}
    if hasattr(distributed, "Reducer"):
        replacements["Reducer"] = _recording_reducer(distributed.Reducer, record)
    for name in GROUP_FIRST_ENTRY_POINTS:
        if hasattr(distributed, name):
            replacements[name] = _group_arg_viewed(getattr(distributed, name), record, called_by_ddp)
    return replacements

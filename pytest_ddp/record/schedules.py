"""The values a pipeline's stages must give alike, recorded where torch.distributed.pipelining
takes them: each schedule's microbatch count.  Stages that disagree on it hang in a send the
other never receives, or raise in their own code; the count is what went wrong
(:func:`pytest_ddp.diagnose.majority.settings_differ`).

Importing torch.distributed.pipelining takes over a second, so the schedules are patched when the
test's code imports them (an import hook), or at once where it already has."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from pytest_ddp.common.event_log import EventLog
from pytest_ddp.common.protocol import Setting
from pytest_ddp.record import describe

MODULE = "torch.distributed.pipelining.schedules"
MICROBATCHES = "their pipeline schedules' n_microbatches"
_log: EventLog | None = None


def install(log: EventLog) -> None:
    """Record the pipeline schedules this process makes into ``log`` (again: switch it)."""
    global _log
    _log = log
    if MODULE in sys.modules:
        _patch(sys.modules[MODULE])
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the schedules' module as Python would, and patches it once it has run."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # the module's own loader, for inspect and linecache
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _patch(module)


def _patch(module: ModuleType) -> None:
    schedule = getattr(module, "_PipelineSchedule", None)  # every schedule's base, in torch 2.4 and later
    if schedule is None or getattr(schedule.__init__, "_recorded", False):
        return
    original = schedule.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        count = getattr(self, "_n_microbatches", None)
        if _log is not None and isinstance(count, int):
            site = json.loads("{" + describe.site(sys._getframe(1)) + "}")["site"]
            stage = getattr(self, "_stage", None) or next(iter(getattr(self, "_stages", None) or []), None)
            group = describe.group_of(getattr(stage, "group", None)).name  # None: the default group
            _log.write(Setting(MICROBATCHES, count, site, group))

    init._recorded = True  # type: ignore[attr-defined]
    schedule.__init__ = init

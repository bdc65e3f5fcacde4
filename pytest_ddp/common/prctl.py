"""Linux ``prctl``: the plugin's processes die with what started them, and are named for ``ps``.
Standard library only: the MPI stand-in uses them too."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int | bytes) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value)


def name(text: str) -> None:
    """This process's name in ``ps`` and ``pgrep`` (``ddp-rank3``; the kernel keeps 15 bytes)."""
    _prctl(PR_SET_NAME, text.encode())


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` when the parent dies; False if ``parent`` already died."""
    _prctl(PR_SET_PDEATHSIG, sig)
    return parent is None or os.getppid() == parent


def become_subreaper() -> None:
    """Orphaned descendants of this process are reparented to it, not to init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)

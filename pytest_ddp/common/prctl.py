"""The kernel's process controls (Linux ``prctl``) that keep the plugin's processes from
outliving what started them, and name them for ``ps`` and ``pgrep``.  Standard library only:
the MPI stand-in uses them too."""

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
    """Have the kernel send ``sig`` to this process when its parent dies, however it dies.
    False if ``parent`` is no longer the parent: it died before we asked."""
    _prctl(PR_SET_PDEATHSIG, sig)
    return parent is None or os.getppid() == parent


def become_subreaper() -> None:
    """Orphaned descendants of this process are reparented to it, not to init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)

"""How a launched pytest process ends on a signal, leaving nothing behind.

While its session runs, SIGTERM (what torchrun, srun and a batch system's cancel
send) stops it as Ctrl-C does: pytest reports what ran, the groups' ranks are
killed, and it exits with status 2, its files removed.  A launcher passes the
signal it gets on to every process it started, and a terminal's Ctrl-C reaches
them as well: the first SIGINT or SIGTERM interrupts, the ones after it are the
same stop said again, and are ignored.

Once the session has ended (:func:`exit_on_signal`), a launcher's signal ends
the process at once with the session's status.  ``os._exit`` runs no exit
handler, so first it removes what those would have: multiprocessing's folder
(``$TMPDIR/pymp-*``, the forkserver's socket; torchrun SIGTERMs every worker
still there once one exits non-zero, and each such run left one per process).
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import signal
from typing import Any

# What launchers send the processes of a run they end (torchrun SIGTERM, gforker SIGQUIT).
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGHUP)
INTERRUPTING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def interrupt_on_signals() -> None:
    """From now on, SIGINT or SIGTERM interrupts the session (KeyboardInterrupt), once."""
    for number in INTERRUPTING_SIGNALS:
        signal.signal(number, _interrupt)


def _interrupt(number: int, frame: Any) -> None:
    for each in INTERRUPTING_SIGNALS:
        signal.signal(each, signal.SIG_IGN)
    raise KeyboardInterrupt


def exit_on_signal(status: int) -> None:
    """From now on, a launcher's signal ends this process at once with ``status`` (its work is done)."""
    for number in ENDING_SIGNALS:
        signal.signal(number, lambda *_: _exit_now(int(status)))


def _exit_now(status: int) -> None:
    # The folder exists already when the forkserver was started; made here, it goes as well.
    shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)
    os._exit(status)

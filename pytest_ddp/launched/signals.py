"""How a launched pytest process ends on a signal, leaving nothing behind.

While its session runs, SIGTERM (torchrun's, srun's, a batch cancel's) stops it as Ctrl-C does;
only the first SIGINT or SIGTERM counts, since a launcher and a terminal may both pass one on.
Once the session has ended, a launcher's signal ends the process at once with the session's
status; ``os._exit`` runs no exit handler, so multiprocessing's folder (``$TMPDIR/pymp-*``) is
removed first (torchrun SIGTERMs every worker still there once one exits non-zero).
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

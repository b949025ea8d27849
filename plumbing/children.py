"""Child processes that do not outlive us: the kernel signals them when we die.

``parent_death_signal(sig)`` is a ``preexec_fn`` for :class:`subprocess.Popen`
that asks Linux (``prctl(PR_SET_PDEATHSIG)``) to send ``sig`` to the child
when its parent dies, however it dies (SIGKILL included), so a killed demo or
bench leaves no broker or service behind burning CPU against a broker that
is gone. Best effort: None off Linux and off the main thread (the signal
follows the thread that forked, and a pool thread may end long before us).
libc is loaded in the parent, so the forked child makes one foreign call and
takes no Python lock.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

__all__ = ["parent_death_signal"]

_PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel send ``sig`` to the child when we die."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        # The parent may have died between fork and prctl: then nobody would
        # ever send the signal.
        if os.getppid() != parent:
            os._exit(1)

    return arm

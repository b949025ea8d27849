"""Waits that end: every await on something outside the process has a limit and a name.

A wait on the broker, another task or another process can last forever
when the other side stalls (a produce stuck behind a broker that does not
answer, a consumer that never leaves its group). The pipeline's tools and
services wait through :func:`bounded`, so a stall ends in a
:class:`WaitTimeout` that names what was awaited and for how long, and a
shutdown goes on without the part that would not stop (:func:`stop_within`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["WaitTimeout", "bounded", "stop_within"]

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A bounded wait gave up; ``what`` says what it was waiting for."""

    def __init__(self, what: str, seconds: float):
        self.what = what
        self.seconds = seconds
        super().__init__(f"gave up after {seconds:g} s waiting for {what}")


async def bounded(aw: Awaitable[T], seconds: float, what: str) -> T:
    """``await aw`` for at most ``seconds``; then :class:`WaitTimeout` naming ``what``.

    On the timeout ``aw`` is cancelled and left to end on its own: unlike
    ``asyncio.wait_for``, which waits for the cancelled awaitable to finish,
    this returns even when ``aw`` does not honour its cancellation (a client
    library's shutdown that swallows it), which is the stall it bounds.
    """
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, seconds))
    except BaseException:  # we were cancelled: so is what we waited for
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        raise WaitTimeout(what, seconds)
    return task.result()


def _consume(task: asyncio.Future) -> None:
    """Retrieve an abandoned task's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


async def stop_within(aw: Awaitable[object], seconds: float, what: str, *, log=None) -> bool:
    """Await a shutdown step for at most ``seconds``; False (and a line saying so) if it hung.

    For ``finally`` blocks: one part that does not stop must not keep the
    rest from stopping, nor hide the error that brought us here.
    """
    try:
        await bounded(aw, seconds, what)
        return True
    except WaitTimeout as e:
        if log is not None:
            log.warning("stop_timed_out", what=what, seconds=seconds, detail=str(e))
        else:
            print(f"warning: {e}; going on without it", file=sys.stderr)
        return False
    except Exception as e:  # noqa: BLE001 - a failing stop must not hide what brought us here
        if log is not None:
            log.warning("stop_failed", what=what, error=repr(e))
        else:
            print(f"warning: {what} failed: {e!r}; going on", file=sys.stderr)
        return False

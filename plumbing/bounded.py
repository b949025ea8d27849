"""Waits that end: every await on something outside the process has a limit and a name.

A wait on the broker, another task or another process can last forever
when the other side stalls (a produce stuck behind a broker that does not
answer, a consumer that never leaves its group). The pipeline's tools and
services wait through :func:`bounded`, so a stall ends in a
:class:`WaitTimeout` that names what was awaited and for how long, and a
shutdown goes on without the part that would not stop (:func:`stop_within`).

Never ``asyncio.wait_for`` in a loop that is stopped by cancelling it: on
Python 3.11 it swallows a cancellation that arrives as the awaited thing
completes (it returns the result instead, CPython gh-86296, fixed in 3.12
by rewriting it on ``asyncio.timeout``), and the loop goes on forever while
its stop waits for it. A replay hung that way after its last result: the
worker's topic keeper, cancelled as its metadata request was answered, kept
checking every few seconds, and the stack's stop waited on it. :func:`within`
is ``wait_for`` built on ``asyncio.timeout``, which keeps the cancellation.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["WaitTimeout", "bounded", "cancel_within", "stop_within", "within"]

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A bounded wait gave up; ``what`` says what it was waiting for."""

    def __init__(self, what: str, seconds: float):
        self.what = what
        self.seconds = seconds
        super().__init__(f"gave up after {seconds:g} s waiting for {what}")


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """``await aw`` for at most ``seconds`` (None: no limit), else ``TimeoutError``.

    ``asyncio.wait_for``'s contract (``aw`` is cancelled on the timeout and
    awaited) without its 3.11 bug: a cancellation of the caller is never lost.
    """
    async with asyncio.timeout(seconds):
        return await aw


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


async def cancel_within(tasks, seconds: float, what: str, *, log=None) -> bool:
    """Cancel ``tasks`` and wait ``seconds`` at most for them to end; False if some did not.

    A task that does not end (it swallowed its cancellation) is named in a
    ``stop_timed_out`` line and left behind: the stop it is part of goes on.
    However the others ended (cancelled, failed, returned) is taken as ended.
    """
    tasks = [t for t in tasks if t is not None]
    for t in tasks:
        t.cancel()
    if not tasks:
        return True
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, seconds))
    for t in done:
        _consume(t)
    if pending:
        names = ", ".join(sorted(t.get_name() for t in pending))
        _timed_out(log, what, seconds,
                   f"{what}: {names} still running {seconds:g} s after its cancellation")
    return not pending


def _timed_out(log, what: str, seconds: float, detail: str) -> None:
    """The ``stop_timed_out`` line (stderr without a logger): a stop went on without a part."""
    if log is not None:
        log.warning("stop_timed_out", what=what, seconds=seconds, detail=detail)
    else:
        print(f"warning: {detail}; going on without it", file=sys.stderr)


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
        _timed_out(log, what, seconds, str(e))
        return False
    except Exception as e:  # noqa: BLE001 - a failing stop must not hide what brought us here
        if log is not None:
            log.warning("stop_failed", what=what, error=repr(e))
        else:
            print(f"warning: {what} failed: {e!r}; going on", file=sys.stderr)
        return False

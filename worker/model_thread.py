"""The model's one thread: calls run one at a time, the next one waiting in place.

A worker hands its model a micro-batch while the one before it still runs,
so the next call is waiting in this thread's queue when the current one
ends and the model goes on at once. Handed over only after the event loop
had seen the last call end (``asyncio.to_thread`` under a lock), every call
paid the loop's latency on top of its own: the thread's wake-up, the loop
finishing whatever it was doing (building and writing results, reading
fetches), the next call's dispatch (``bench/gpu_feed.py``,
``docs/benchmarks.md``).

Order. Calls run in the order they were handed over, with one exception
that keeps the order a worker had when each micro-batch asked for the model
as the one before it ended: a call handed over as the *continuation* of a
running call (``follows``) takes its place in the order when that call
ends. A newer batch's call handed over meanwhile goes first: a quiet
request at the head of a newer batch does not wait for the rest of an
older one, only for the call in progress. An *urgent* call (an express
batch's head, :mod:`scheduler.dispatch`) goes before every call not
started, urgent ones among themselves in the order handed over.

One thread, not a pool: torch's per-thread settings (its intra-op thread
count) are made once, in ``setup``, for every call.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Job", "ModelThread"]


class Job:
    """One call handed to the thread; ``future`` (on the caller's loop) gets its outcome."""

    __slots__ = ("_loop", "call", "ended", "follows", "future", "key")

    def __init__(self, call: Callable[[], Any], follows: Job | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.call = call
        self.follows = follows
        self._loop = loop
        self.future: asyncio.Future = loop.create_future()
        #: Its place in the order (urgent first, then as handed over); None
        #: while the call it follows still runs.
        self.key: tuple[int, int] | None = None
        self.ended = False

    def settle(self, value: Any = None, error: BaseException | None = None, *,
               cancel: bool = False) -> None:
        """Hand the outcome to the caller's loop (nothing if that loop is gone)."""
        def deliver() -> None:
            if self.future.done():
                return
            if cancel:
                self.future.cancel()
            elif error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)
        try:
            self._loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the loop was closed: nobody is waiting
            pass


class ModelThread:
    """``await thread(fn, *args, **kwargs)`` or ``await thread.submit(call, follows=job).future``:
    run in the one thread, in order. ``setup`` runs first in that thread."""

    def __init__(self, setup: Callable[[], None] | None = None, *, name: str = "model") -> None:
        self._setup = setup
        self._cv = threading.Condition()
        self._queue: list[Job] = []
        self._order = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def __call__(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return await self.submit(lambda: fn(*args, **kwargs)).future

    def submit(self, call: Callable[[], Any], *, follows: Job | None = None,
               urgent: bool = False) -> Job:
        """Queue ``call``; as ``follows``' continuation if that call has not ended yet;
        ``urgent``: ahead of every call not started (a continuation is never urgent)."""
        job = Job(call, follows, asyncio.get_running_loop())
        with self._cv:
            if self._stopping:
                raise RuntimeError("the model's thread was closed")
            if follows is None or follows.ended:
                job.key = (0 if urgent and follows is None else 1, next(self._order))
            self._queue.append(job)
            self._cv.notify()
        return job

    def close(self) -> None:
        """Cancel the calls not started; the one running ends on its own (a thread cannot be stopped)."""
        with self._cv:
            self._stopping = True
            dropped, self._queue = self._queue, []
            self._cv.notify()
        for job in dropped:
            job.settle(cancel=True)

    def _next(self) -> Job | None:
        """The ready job first in order (None: stop), waiting for one."""
        with self._cv:
            while True:
                if self._stopping:
                    return None
                ready = [(j.key, j) for j in self._queue if j.key is not None]
                if ready:
                    _, job = min(ready, key=lambda kj: kj[0])
                    self._queue.remove(job)
                    return job
                self._cv.wait()

    def _ended(self, job: Job) -> None:
        """``job`` is done (run or skipped): its continuation takes its place in the order now."""
        with self._cv:
            job.ended = True
            for j in self._queue:
                if j.follows is job and j.key is None:
                    j.key = (1, next(self._order))

    def _run(self) -> None:
        broken: BaseException | None = None
        if self._setup is not None:
            try:
                self._setup()
            except BaseException as e:  # noqa: BLE001 - every call is told, none waits forever
                broken = e
        while (job := self._next()) is not None:
            if broken is not None:
                self._ended(job)
                job.settle(error=RuntimeError(f"the model's thread could not be set up: {broken!r}"))
                continue
            if job.future.cancelled():  # its caller stopped waiting before it started
                self._ended(job)
                continue
            try:
                value = job.call()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, not lost
                self._ended(job)
                job.settle(error=e)
                continue
            self._ended(job)
            job.settle(value)

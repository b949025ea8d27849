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

Joined calls. An urgent call (an express batch's head, a request or two) is
mostly the model's fixed cost per call, and under long load the model pays
it again for every such call (``bench/sustained.py``: express batches cost
the busiest org twice its p99). A call handed over with a
:class:`Joinable` says what it computes; when an urgent one is next and the
call that would run after it computes the same thing (the same model and
options) and both fit one call (``fits``), they run as one model call on
the items of both, each caller getting its own rows. The urgent call's
items wait for the other's then, at most one call's time; the other runs
one call earlier; the fixed cost is paid once. Only an urgent call joins:
the calls of one batch were cut by its planner, and a head run on its own
(:func:`worker.microbatch.plan_with_head`) stays on its own.

One thread, not a pool: torch's per-thread settings (its intra-op thread
count) are made once, in ``setup``, for every call.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Job", "Joinable", "ModelThread"]


@dataclass(frozen=True, slots=True, eq=False)
class Joinable:
    """What a call computes, so that it may share one model call with another.

    The call is ``fn(items, lengths=lengths, **kwargs)``. Two calls with equal
    ``fn`` and ``kwargs`` run as one on the items of both, in order, when
    ``fits`` (told the lengths of each) says so; ``rows(out, start, stop)``
    cuts each caller its rows of the output.
    """

    fn: Callable[..., Any]
    items: Sequence[Any]
    lengths: Sequence[int]
    kwargs: Mapping[str, Any]
    fits: Callable[[Sequence[int], Sequence[int]], bool]
    rows: Callable[[Any, int, int], Any]

    def joins(self, other: Joinable) -> bool:
        """Whether ``other``'s items may ride in this call (after this one's)."""
        return (self.fn == other.fn and self.kwargs == other.kwargs
                and self.fits(self.lengths, other.lengths))


class Job:
    """One call handed to the thread; ``future`` (on the caller's loop) gets its outcome."""

    __slots__ = ("_loop", "began", "call", "ended", "follows", "future", "join", "joined", "key",
                 "seconds")

    def __init__(self, call: Callable[[], Any], follows: Job | None,
                 loop: asyncio.AbstractEventLoop, *, join: Joinable | None = None,
                 began: Callable[[], None] | None = None) -> None:
        self.call = call
        self.follows = follows
        #: What it computes, if it may share a model call (:class:`Joinable`).
        self.join = join
        #: Run in the thread as its call begins.
        self.began = began
        #: Seconds its model call took (the whole call's, if joined), set as it ends.
        self.seconds = 0.0
        #: Set if it ran joined: the whole call's lengths and whether this job's
        #: items came first (the call is reported once, by that one).
        self.joined: tuple[list[int], bool] | None = None
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
               urgent: bool = False, join: Joinable | None = None,
               began: Callable[[], None] | None = None) -> Job:
        """Queue ``call``; as ``follows``' continuation if that call has not ended yet;
        ``urgent``: ahead of every call not started (a continuation is never urgent).
        ``join``: what ``call`` computes, so that it may share a model call
        (:class:`Joinable`); ``began``: run in the thread as its call begins."""
        job = Job(call, follows, asyncio.get_running_loop(), join=join, began=began)
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

    def _next(self) -> list[Job] | None:
        """The ready job first in order, and the one it joins if any (None: stop),
        waiting for one."""
        with self._cv:
            while True:
                if self._stopping:
                    return None
                ready = sorted(((j.key, j) for j in self._queue if j.key is not None),
                               key=lambda kj: kj[0])
                if ready:
                    jobs = [ready[0][1]]
                    if len(ready) > 1 and self._join(ready[0][1], ready[1][1]):
                        jobs.append(ready[1][1])
                    for job in jobs:
                        self._queue.remove(job)
                    return jobs
                self._cv.wait()

    @staticmethod
    def _join(first: Job, then: Job) -> bool:
        """Whether ``then`` rides in ``first``'s model call: ``first`` urgent, both
        joinable alike, neither given up by its caller. A ``fits`` that raises
        says no: the two run apart, and the thread goes on."""
        if not (first.key is not None and first.key[0] == 0
                and first.join is not None and then.join is not None
                and not first.future.cancelled() and not then.future.cancelled()):
            return False
        try:
            return bool(first.join.joins(then.join))
        except Exception:  # noqa: BLE001 - the calls run apart instead; none is lost
            return False

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
        while (jobs := self._next()) is not None:
            if broken is not None:
                for job in jobs:
                    self._ended(job)
                    job.settle(error=RuntimeError(
                        f"the model's thread could not be set up: {broken!r}"))
                continue
            if len(jobs) == 2:
                self._run_joined(*jobs)
                continue
            job = jobs[0]
            if job.future.cancelled():  # its caller stopped waiting before it started
                self._ended(job)
                continue
            _begin(job)
            t0 = time.perf_counter()
            try:
                value = job.call()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, not lost
                self._done(job, time.perf_counter() - t0, error=e)
                continue
            self._done(job, time.perf_counter() - t0, value)

    def _run_joined(self, first: Job, then: Job) -> None:
        """One model call on the items of both (:class:`Joinable`), each its rows."""
        a, b = first.join, then.join
        assert a is not None and b is not None  # _join checked both
        lengths = [*a.lengths, *b.lengths]
        n = len(a.items)
        for job in (first, then):
            _begin(job)
        t0 = time.perf_counter()
        try:
            out = a.fn([*a.items, *b.items], lengths=lengths, **a.kwargs)
            parts = (a.rows(out, 0, n), b.rows(out, n, len(lengths)))
        except BaseException as e:  # noqa: BLE001 - handed to both callers, not lost
            seconds = time.perf_counter() - t0
            for job in (first, then):
                self._done(job, seconds, error=e)
            return
        seconds = time.perf_counter() - t0
        for job, part, lead in ((first, parts[0], True), (then, parts[1], False)):
            job.joined = (lengths, lead)
            self._done(job, seconds, part)

    def _done(self, job: Job, seconds: float, value: Any = None, *,
              error: BaseException | None = None) -> None:
        """``job``'s call took ``seconds``: its continuation placed, its caller told."""
        job.seconds = seconds
        self._ended(job)
        job.settle(value, error)


def _begin(job: Job) -> None:
    """Tell ``job``'s caller its call begins; a caller whose loop is gone is not told."""
    if job.began is None:
        return
    try:
        job.began()
    except RuntimeError:  # the caller's loop was closed: nobody is waiting
        pass

"""Serving one scheduler batch on a model, micro-batch by micro-batch.

No Kafka here: :class:`BatchExecutor` turns a :class:`~schemas.messages.Batch`
into :class:`~schemas.messages.Result` values, yielded as soon as each
micro-batch is done, so the service publishes the first-chosen requests'
results before the rest of the batch has run. The service owns the topics,
the commits and the events; this module owns the order of work and the
containment of failures.

Order. Embedding texts of every request are cut into micro-batches by
:func:`worker.microbatch.plan_microbatches` under a padded-token budget, in
the scheduler's order at the granularity of a window (``order="given"``):
the scheduler put the most urgent requests first, and length-sorting
inside each window keeps padding low. The texts of the orgs ahead of a
bulk org's run in micro-batches of their own when the batch takes several
anyway (:func:`worker.microbatch.plan_with_head`): a quiet org's request
under a burst comes back after a call of its own size, not after a quarter
of the batch. A rerank request is one query against
its documents, so its documents are planned and scored on their own.

Failure stays local. A request whose input does not fit the endpoint (an
embed input on a rerank endpoint) is ``invalid``; a request whose deadline
passed before the worker got to it is ``expired``; if the model raises on a
micro-batch, each request in it is retried alone and only the ones that
still raise are ``failed``. No request can take its batch down.

Options (:mod:`schemas.options`) travel inside each request's input, so
this layer applies them with no help from the service. Requests of one
micro-batch whose options differ in what the model computes (prompt,
truncation side, normalisation, dimensions) get a model call each; their
embedding types and encoding are applied per request to its vectors
(:mod:`worker.request_options`), int8/uint8 with ranges calibrated once per
option set (:mod:`worker.calibration`). What admission checks is checked
again here, since the model is the truth about itself: a ``dimensions``
above the model's size and a ``truncate = "none"`` input longer than the
model reads are ``invalid`` (``dimensions_too_large``, ``input_too_long``).

The model runs in a thread of its own (:class:`worker.model_thread.ModelThread`)
so the event loop keeps sending heartbeats and results while it computes.
Calls run there one at a time, and each micro-batch is handed over as the
call before it begins, to follow it: the model goes on to the next call
the moment the last one ends, while the event loop builds and writes that
one's results. A newer batch's call handed over meanwhile goes first (the
order the calls would have had asking for the model as the one before
ended). An express batch's first call goes ahead of every call waiting,
and carries the texts of the call waiting next where both fit one call
(:class:`worker.model_thread.Joinable`, :meth:`BatchExecutor._fits_one_call`):
the model pays one call's fixed cost for the two; that call is measured and
reported once, its seconds shared by tokens among the requests of both. A
model that declares itself ``instant`` (a fake at zero time) is called on
the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.messages import AdmittedRequest, Batch, EmbedInput, RerankInput, Result, Status
from worker.calibration import CALIBRATION_TEXTS, RangeCache
from worker.call_cost import CallCost
from worker.credit_return import release_step
from worker.interface import DEFAULT_OPTIONS, Embedder, EncodeOptions, EncodeOutput, Reranker
from worker.microbatch import padded_tokens, plan_microbatches, plan_with_head
from worker.model_thread import Job, Joinable, ModelThread
from worker.request_options import (
    calibration_options,
    embedding_fields,
    encode_options,
    refuses_truncation,
    truncate_side,
)

__all__ = ["BatchExecutor", "MicrobatchStats", "Served"]

RunInThread = Callable[..., Awaitable[Any]]
#: Told, as a model call starts, its expected seconds (None: not known).
OnStart = Callable[[float | None], None]


@dataclass
class Served:
    """One request's terminal result and the inference seconds it is charged."""

    request: AdmittedRequest
    result: Result
    seconds: float = 0.0


@dataclass
class MicrobatchStats:
    """Per model call: for the metrics (time, real and padded tokens)."""

    seconds: float
    tokens: int
    padded: int
    #: An express batch's call that carried the next call's texts too (one model
    #: call for two: :class:`worker.model_thread.Joinable`).
    joined: bool = False


@dataclass
class _Pending:
    req: AdmittedRequest
    texts: Sequence[str] = ()
    vectors: list[Any] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    options: EncodeOptions = DEFAULT_OPTIONS
    ranges: Any = None
    left: int = 0
    seconds: float = 0.0
    error: str | None = None
    #: (reason, message) of an ``invalid`` answer found by the worker.
    refusal: tuple[str, str] | None = None
    reported: bool = False
    #: When the first micro-batch with one of its texts started (epoch ms).
    started_ms: int | None = None


class _Once:
    """``fn(arg, expect_s)`` the first time it is called, nothing after (a batch's
    credit returns once, however many calls may start it)."""

    __slots__ = ("_arg", "_fn")

    def __init__(self, fn: Callable[[Any, float | None], None], arg: Any) -> None:
        self._fn: Callable[[Any, float | None], None] | None = fn
        self._arg = arg

    def __call__(self, expect_s: float | None = None) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn(self._arg, expect_s)

    def at(self, after_s: float) -> OnStart:
        """This, called from a call ``after_s`` seconds before the batch's last ends:
        the time told is the call's own plus those."""
        def told(expect_s: float | None = None) -> None:
            self(None if expect_s is None else expect_s + after_s)

        return told


def _ema(average: float | None, sample: float) -> float:
    """A moving average's next value: ``sample`` weighs 0.2 (the first sample is the average)."""
    return sample if average is None else 0.8 * average + 0.2 * sample


async def _inline(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _encode_kwargs(options: EncodeOptions) -> dict[str, Any]:
    # Options only when they differ from the defaults, so an embedder written
    # before options existed still serves the requests that use none.
    return {} if options == DEFAULT_OPTIONS else {"options": options}


def _too_long_message(has: str, limit: int) -> str:
    return f"{has}, more than the {limit} the model reads, and input.truncate is 'none'"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _rows(out: EncodeOutput, start: int, stop: int) -> EncodeOutput:
    """Rows ``start:stop`` of a model call's output (a joined call's part)."""
    return EncodeOutput(out.vectors[start:stop], out.truncated[start:stop])


def _call_padded(capped: list[int]) -> int:
    """Padded tokens of one model call on texts of these (capped) lengths."""
    return padded_tokens([range(len(capped))], capped)


class BatchExecutor:
    """Runs batches of one endpoint on one model (an Embedder or a Reranker)."""

    def __init__(self, model: Embedder | Reranker, kind: str, *, worker: str,
                 max_padded_tokens: int = 4096, max_size: int = 32,
                 window: int | None = None, call_tokens: float | None = None,
                 model_thread: ModelThread | None = None, inline: bool | None = None,
                 on_microbatch: Callable[[MicrobatchStats], None] | None = None,
                 on_release: Callable[[Batch, float | None], None] | None = None,
                 calibration_texts: list[str] | tuple[str, ...] = CALIBRATION_TEXTS):
        if kind not in ("embed", "rerank"):
            raise ValueError(f"kind must be 'embed' or 'rerank', got {kind!r}")
        self.model = model
        self.kind = kind
        self.worker = worker
        self.max_padded_tokens = max_padded_tokens
        self.max_size = max_size
        self.window = window
        #: What a call's fixed cost is worth in padded tokens, where the planner
        #: cuts a batch (:func:`worker.microbatch.plan_microbatches`): fixed, or
        #: (None) learned from the calls made (:class:`worker.call_cost.CallCost`).
        self.fixed_call_tokens = call_tokens
        self.call_cost = CallCost(limit=max_padded_tokens)
        # A model that declares itself instant (a fake at zero time), or an
        # executor told ``inline``, calls it on the event loop: a thread hop
        # would cost more than the call.
        inline = getattr(model, "instant", False) if inline is None else inline
        self._owns_thread = not inline and model_thread is None
        #: The model's thread: its calls run there one at a time, in order,
        #: the next one waiting in place (None: on the loop). While one
        #: batch's call runs (where a GPU or torch releases the GIL), the event
        #: loop prepares the next and writes the last one's results.
        self._thread: ModelThread | None = None if inline else model_thread or ModelThread()
        #: Tokenizing: any thread, beside the model's calls, not behind them.
        self._aside: RunInThread = _inline if inline else asyncio.to_thread
        self._on_microbatch = on_microbatch or (lambda s: None)
        #: Called once per batch, as the model call its credit is due at starts
        #: (its last, or an earlier one where the calls after it take less than
        #: the lead: :func:`worker.credit_return.release_step`), with the seconds
        #: expected from then to the batch's end (None: not known): the worker
        #: returns the batch's credit in that time (:mod:`worker.credit_return`).
        self._on_release = on_release or (lambda b, expect_s: None)
        #: Moving average of a model call's seconds per padded token, from the
        #: calls of at least half ``max_size`` texts or a quarter of the budget
        #: (smaller calls are mostly fixed cost): the expected time of a
        #: batch's last call.
        self.seconds_per_padded_token: float | None = None
        #: Moving average of the seconds of the smaller calls, which that rate
        #: does not fit: a batch's last call is often one (its leftover texts),
        #: and with no estimate its credit went back only as it started, a few
        #: ms before the model ran dry (bench/sustained.py: 12.8 s of a 74 s
        #: run idle waiting for the next batch, docs/load.md).
        self.seconds_per_small_call: float | None = None
        #: int8/uint8 ranges per option set (worker.calibration).
        self.calibration = RangeCache(calibration_texts)

    def close(self) -> None:
        """Stop the model's thread if this executor made it (calls not started are dropped)."""
        if self._owns_thread and self._thread is not None:
            self._thread.close()

    async def serve(self, batch: Batch) -> AsyncIterator[list[Served]]:
        """Yield the results completed by each step, in run order; every request once."""
        now = _now_ms()
        work: list[AdmittedRequest] = []
        early: list[Served] = []
        for req in batch.requests:
            if req.deadline_at_ms is not None and req.deadline_at_ms <= now:
                early.append(self._final(req, batch, "expired", reason="deadline_passed",
                                         message="the deadline passed before the worker "
                                                 "reached the request"))
            elif (self.kind == "embed") != isinstance(req.input, EmbedInput):
                early.append(self._final(req, batch, "invalid", reason="wrong_input_kind",
                                         message=f"a {type(req.input).__name__} cannot be "
                                                 f"served by a {self.kind} endpoint"))
            else:
                work.append(req)
        if early:
            yield early
        if self.kind == "embed":
            # Closed with this generator: a consumer that stops reading
            # cancels the calls already handed to the model.
            async with contextlib.aclosing(self._embed(batch, work)) as steps:
                async for done in steps:
                    yield done
        else:
            for i, req in enumerate(work):
                last = _Once(self._on_release, batch) if i == len(work) - 1 else None
                # An express batch's first call runs next, as an embedding one's does.
                yield [await self._rerank(batch, req, on_start=last,
                                          urgent=batch.express and i == 0)]

    async def _model_call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn`` run as a model call: after the calls handed over before it."""
        return (await self._timed_call(fn, *args, **kwargs))[0]

    async def _timed_call(self, fn: Callable[..., Any], /, *args: Any,
                          started: Sequence[_Pending] = (),
                          on_start: OnStart | None = None, expect_s: float | None = None,
                          on_begin: Callable[[Job | None], None] | None = None,
                          follows: Job | None = None, urgent: bool = False,
                          join: Joinable | None = None,
                          **kwargs: Any) -> tuple[Any, float, tuple[list[int], bool] | None]:
        """A model call, the seconds it had the model (its time in the queue
        excluded) and, if it shared its model call (``join``,
        :class:`worker.model_thread.Joinable`), the whole call's lengths and
        whether it reports that call (None: it ran alone).

        Handed to the model's thread at once (:mod:`worker.model_thread`),
        as the continuation of ``follows`` if given: it runs there after the
        calls ahead of it, back to back with them; ``urgent``: ahead of every
        call not started (an express batch's head). As it begins, on the
        loop: ``on_start`` told ``expect_s``, the call's expected seconds (a
        batch's credit returns then, not while its last call still waits
        behind another batch's); the ``started_ms`` of the requests in
        ``started`` that no call started before; then ``on_begin`` with this
        call (its batch hands over its next micro-batch then, to follow it).
        """
        job: Job | None = None
        waiting = True  # False once the caller stopped waiting: nothing to announce

        def begin(now: int) -> None:
            if not waiting:
                return
            if on_start is not None:
                on_start(expect_s)
            for p in started:
                if p.started_ms is None:
                    p.started_ms = now
            if on_begin is not None:
                on_begin(job)

        if self._thread is None:  # on the loop itself: nothing overlaps
            begin(_now_ms())
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            return out, time.perf_counter() - t0, None
        loop = asyncio.get_running_loop()

        def began() -> None:  # in the model's thread, as the call begins
            loop.call_soon_threadsafe(begin, _now_ms())

        job = self._thread.submit(functools.partial(fn, *args, **kwargs), follows=follows,
                                  urgent=urgent, join=join, began=began)
        try:
            out = await job.future
        except asyncio.CancelledError:
            waiting = False
            raise
        return out, job.seconds, job.joined

    # -- embeddings ------------------------------------------------------------

    async def _embed(self, batch: Batch,
                     reqs: list[AdmittedRequest]) -> AsyncGenerator[list[Served], None]:
        model: Embedder = self.model  # type: ignore[assignment]  # kind "embed": an Embedder
        pending = [_Pending(r) for r in reqs]
        texts: list[str] = []
        owner: list[tuple[int, int]] = []  # text index -> (request, position)
        for i, p in enumerate(pending):
            inp: EmbedInput = p.req.input  # type: ignore[assignment]  # an embed batch's input
            p.texts = inp.texts
            p.vectors = [None] * len(p.texts)
            p.truncated = [False] * len(p.texts)
            p.left = len(p.texts)
            p.options = encode_options(inp)
            if inp.dimensions is not None and inp.dimensions > model.dimension:
                p.refusal = ("dimensions_too_large",
                             (f"input.dimensions = {inp.dimensions} is above the "
                              f"{model.dimension} dimensions of model {model.name!r}"))
            for j, t in enumerate(p.texts):
                owner.append((i, j))
                texts.append(t)
        lengths = await self._lengths(texts, owner, pending)
        self._refuse_too_long(pending, owner, lengths, model.max_seq_length)
        await self._calibrate(pending)
        if done := self._take_done(pending, range(len(pending))):
            yield [self._from_pending(batch, p) for p in done]
        live = [k for k in range(len(texts)) if not self._stopped(pending[owner[k][0]])]
        plan = plan_with_head([lengths[k] for k in live],
                              [pending[owner[k][0]].req.org for k in live],
                              max_padded_tokens=self.max_padded_tokens,
                              max_size=self.max_size,
                              max_seq_length=model.max_seq_length, window=self.window,
                              express=batch.express, call_tokens=self.call_tokens())

        def group(n: int) -> list[int]:
            # Texts of a request that already failed are not worth computing.
            return [live[g] for g in plan[n] if not self._stopped(pending[owner[live[g]][0]])]

        # The batch's credit returns as the call it is due at starts
        # (:func:`worker.credit_return.release_step`), or the first later
        # one if that one has nothing left to compute.
        expects = [self._expect_s([min(lengths[live[g]], model.max_seq_length) for g in group_])
                   for group_ in plan]
        due, _ = release_step(expects, batch.round_trip_ms)
        release = _Once(self._on_release, batch)

        def release_at(n: int) -> OnStart | None:
            if n < due:
                return None
            return release.at(sum(e or 0.0 for e in expects[n + 1:]))

        if self._thread is None:  # nothing overlaps a call made on the loop itself
            for n in range(len(plan)):
                if idx := group(n):
                    touched = await self._encode_group(model, texts, lengths, idx, owner,
                                                       pending, on_start=release_at(n))
                    if done := self._take_done(pending, touched):
                        yield [self._from_pending(batch, p) for p in done]
            return
        # Each micro-batch is handed to the model as the one before it begins
        # (that call's ``on_begin``): it waits in the model's thread and runs
        # the moment that one ends, while that one's results are built and
        # written. Handed over then, it queues behind another batch's call
        # already waiting, in the order the calls were handed over.
        calls: list[asyncio.Task[list[int]] | None] = []
        closed = False

        def ask(n: int, follows: Job | None = None) -> None:
            """Hand over micro-batch ``n``'s call, once (an empty one: the next's)."""
            while not closed and len(calls) == n < len(plan):
                if not (idx := group(n)):
                    calls.append(None)
                    n += 1
                    continue
                calls.append(asyncio.ensure_future(self._encode_group(
                    model, texts, lengths, idx, owner, pending, on_start=release_at(n),
                    on_begin=functools.partial(ask, n + 1), follows=follows,
                    urgent=batch.express and n == 0)))

        try:
            for n in range(len(plan)):
                ask(n)  # if the call before did not reach the model
                if (task := calls[n]) is not None:
                    touched = await task
                    if done := self._take_done(pending, touched):
                        yield [self._from_pending(batch, p) for p in done]
        finally:
            closed = True
            for task in calls:
                if task is not None and not task.done():
                    task.cancel()

    @staticmethod
    def _stopped(p: _Pending) -> bool:
        return p.error is not None or p.refusal is not None

    @staticmethod
    def _refuse_too_long(pending: list[_Pending], owner: Sequence[tuple[int, int]],
                         lengths: list[int], limit: int) -> None:
        """``truncate = "none"`` inputs the model would cut are ``invalid``, as at admission."""
        for k, (i, j) in enumerate(owner):
            p = pending[i]
            if p.refusal is None and p.error is None and lengths[k] > limit \
                    and refuses_truncation(p.req.input):
                p.refusal = ("input_too_long", _too_long_message(
                    f"input.texts[{j}] has {lengths[k]} tokens", limit))

    async def _calibrate(self, pending: list[_Pending]) -> None:
        """Ranges for every request that asks for int8/uint8 (computed once per option set)."""
        model: Embedder = self.model  # type: ignore[assignment]  # kind "embed": an Embedder

        def embed(texts: list[str], options: EncodeOptions) -> np.ndarray:
            return model.encode(texts, **_encode_kwargs(options)).vectors

        for p in pending:
            key = None if self._stopped(p) else calibration_options(p.req.input)  # type: ignore[arg-type]  # embed input
            if key is None:
                continue
            ranges = self.calibration.cached(key)
            if ranges is None:
                try:
                    ranges = await self._model_call(self.calibration.get, key, embed)
                except Exception as e:  # noqa: BLE001 - contained: this request fails alone
                    p.error = f"calibration failed: {type(e).__name__}: {e}"
                    continue
            p.ranges = ranges

    @staticmethod
    def _take_done(pending: list[_Pending], candidates: Iterable[int]) -> list[_Pending]:
        """Requests that just became complete (or failed, or were refused), each reported once."""
        out: list[_Pending] = []
        for i in candidates:
            p = pending[i]
            if not p.reported and (p.error is not None or p.refusal is not None or p.left <= 0):
                p.reported = True
                out.append(p)
        return out

    async def _lengths(self, texts: list[str], owner: Sequence[tuple[int, int]],
                       pending: list[_Pending]) -> list[int]:
        model: Embedder = self.model  # type: ignore[assignment]  # kind "embed": an Embedder
        lengths = [0] * len(texts)
        by_prompt: dict[str | None, list[int]] = {}
        for k, (i, _) in enumerate(owner):
            by_prompt.setdefault(pending[i].options.prompt, []).append(k)
        for prompt, ks in by_prompt.items():
            # Any error of a third-party model is contained to the request that caused it.
            try:
                got = await self._aside(self._token_lengths, model, [texts[k] for k in ks], prompt)
            except Exception:  # noqa: BLE001 - one request broke the tokenizer: find it below
                got = None
            if got is not None:
                for k, n in zip(ks, got, strict=True):
                    lengths[k] = n
                continue
            for i in sorted({owner[k][0] for k in ks}):
                mine = [k for k in ks if owner[k][0] == i]
                try:
                    one = await self._aside(self._token_lengths, model,
                                             [texts[k] for k in mine], prompt)
                except Exception as e:  # noqa: BLE001 - contained: this request fails alone
                    pending[i].error = f"tokenizer failed: {type(e).__name__}: {e}"
                    continue
                for k, n in zip(mine, one, strict=True):
                    lengths[k] = n
        return lengths

    @staticmethod
    def _token_lengths(model: Embedder, texts: list[str], prompt: str | None) -> list[int]:
        if prompt is None:
            return list(model.token_lengths(texts))
        return list(model.token_lengths(texts, prompt=prompt))

    async def _encode_group(self, model: Embedder, texts: Sequence[str], lengths: Sequence[int],
                            idx: list[int], owner: Sequence[tuple[int, int]],
                            pending: list[_Pending], on_start: OnStart | None = None,
                            on_begin: Callable[[Job | None], None] | None = None,
                            follows: Job | None = None, urgent: bool = False) -> list[int]:
        """Encode one micro-batch, a model call per option set; on a model error,
        each request's texts alone. ``on_start`` runs as its first call gets the
        model; the first call follows ``follows``, or goes ahead of every call
        not started if ``urgent`` (:meth:`_timed_call`)."""
        touched = sorted({owner[k][0] for k in idx})
        calls: dict[EncodeOptions, list[int]] = {}
        for k in idx:
            calls.setdefault(pending[owner[k][0]].options, []).append(k)
        for options, ks in calls.items():
            await self._encode_call(model, texts, lengths, ks, options, owner, pending,
                                    on_start, on_begin, follows, urgent)
            follows, urgent = None, False  # the next call is handed over after this one ended
        return touched

    async def _encode_call(self, model: Embedder, texts: Sequence[str], lengths: Sequence[int],
                           idx: list[int], options: EncodeOptions,
                           owner: Sequence[tuple[int, int]], pending: list[_Pending],
                           on_start: OnStart | None = None,
                           on_begin: Callable[[Job | None], None] | None = None,
                           follows: Job | None = None, urgent: bool = False) -> None:
        extra = _encode_kwargs(options)
        items, sizes = [texts[k] for k in idx], [lengths[k] for k in idx]
        try:
            out, seconds, joined = await self._timed_call(
                model.encode, items, lengths=sizes,
                started=[pending[i] for i in sorted({owner[k][0] for k in idx})],
                on_start=on_start, on_begin=on_begin, follows=follows, urgent=urgent,
                expect_s=self._expect_s([min(lengths[k], model.max_seq_length) for k in idx]),
                join=Joinable(model.encode, items, sizes, extra, self._fits_one_call, _rows),
                **extra)
        except Exception:  # noqa: BLE001 - retried request by request below
            out = None
        if out is not None:
            self._account(seconds, idx, lengths, owner, pending, model.max_seq_length,
                          joined=joined)
            for row, k in enumerate(idx):
                self._place(pending, owner[k], out.vectors[row], out.truncated[row])
            return
        for i in sorted({owner[k][0] for k in idx}):
            ks = [k for k in idx if owner[k][0] == i]
            try:
                one, seconds, _ = await self._timed_call(model.encode, [texts[k] for k in ks],
                                                      lengths=[lengths[k] for k in ks],
                                                      started=[pending[i]],
                                                      on_start=on_start, on_begin=on_begin,
                                                      **extra)
            except Exception as e:  # noqa: BLE001 - contained: this request fails alone
                pending[i].error = f"model failed: {type(e).__name__}: {e}"
                pending[i].left = 0
                continue
            self._account(seconds, ks, lengths, owner, pending, model.max_seq_length)
            for row, k in enumerate(ks):
                self._place(pending, owner[k], one.vectors[row], one.truncated[row])

    def _account(self, seconds: float, idx: Sequence[int], lengths: Sequence[int],
                 owner: Sequence[tuple[int, int]], pending: list[_Pending], max_seq: int,
                 joined: tuple[list[int], bool] | None = None) -> None:
        """A call's seconds shared among its requests by their tokens, and the call
        measured; ``joined`` (it shared a model call with another batch's: that
        call's lengths, and whether this one reports it): shared over that whole
        call, and measured once, whole."""
        capped = [min(lengths[k], max_seq) for k in idx]
        whole = capped if joined is None else [min(n, max_seq) for n in joined[0]]
        total = sum(whole) or 1
        for c, k in zip(capped, idx, strict=True):
            pending[owner[k][0]].seconds += seconds * c / total
        if joined is not None and not joined[1]:
            return
        padded = self._measured(seconds, whole, joined=joined is not None)
        if padded > 0 and seconds >= 0 and self._sizeable(len(whole), padded):
            self.seconds_per_padded_token = _ema(self.seconds_per_padded_token, seconds / padded)
        elif padded > 0 and seconds >= 0:
            self.seconds_per_small_call = _ema(self.seconds_per_small_call, seconds)

    def _measured(self, seconds: float, capped: list[int], *, joined: bool = False) -> int:
        """One model call measured, on texts of these (capped) lengths: what a call costs
        is learned from it and it is reported. Its padded tokens."""
        padded = _call_padded(capped)
        self.call_cost.observe(padded, seconds)
        self._on_microbatch(MicrobatchStats(seconds, sum(capped), padded, joined))
        return padded

    def _fits_one_call(self, first: Sequence[int], then: Sequence[int]) -> bool:
        """Whether two calls' texts (their token lengths) go in one model call:
        within one call's budget, and padding no more than a call's fixed cost
        (:meth:`call_tokens`) above what the two would pad apart."""
        limit = self.model.max_seq_length
        a = [min(n, limit) for n in first]
        b = [min(n, limit) for n in then]
        if len(a) + len(b) > self.max_size:
            return False
        both = _call_padded(a + b)
        return (both <= self.max_padded_tokens
                and both <= _call_padded(a) + _call_padded(b) + self.call_tokens())

    def call_tokens(self) -> float:
        """What the planner is told a call's fixed cost is worth (padded tokens)."""
        if self.fixed_call_tokens is not None:
            return self.fixed_call_tokens
        return self.call_cost.call_tokens()

    def _sizeable(self, texts: int, padded: int) -> bool:
        """A call big enough for its time to go with its padded tokens (not its fixed cost)."""
        return texts * 2 >= self.max_size or padded * 4 >= self.max_padded_tokens

    def _expect_s(self, capped: list[int]) -> float | None:
        """Expected seconds of a call on texts of these (capped) lengths; None if not known.

        A sizeable call: the rate per padded token times its padded tokens. A
        smaller one is mostly fixed cost: the smaller calls' average, or that
        rate's figure where it is larger (None while neither is measured).
        """
        padded = _call_padded(capped)
        rate = self.seconds_per_padded_token
        by_rate = None if rate is None else rate * padded
        small = self.seconds_per_small_call
        if small is None or self._sizeable(len(capped), padded):
            return by_rate
        return small if by_rate is None else max(small, by_rate)

    @staticmethod
    def _place(pending: list[_Pending], where: tuple[int, int], vector: np.ndarray,
               truncated: bool) -> None:
        i, j = where
        p = pending[i]
        if p.vectors[j] is None:
            p.left -= 1
        p.vectors[j] = vector
        p.truncated[j] = bool(truncated)

    def _from_pending(self, batch: Batch, p: _Pending) -> Served:
        if p.refusal is not None:
            return self._final(p.req, batch, "invalid", reason=p.refusal[0], message=p.refusal[1])
        if p.error is not None:
            return self._final(p.req, batch, "failed", reason="model_error", message=p.error,
                               seconds=p.seconds, started_ms=p.started_ms)
        vectors = np.asarray(p.vectors, dtype=np.float32)
        try:
            fields = embedding_fields(vectors, p.req.input,  # type: ignore[arg-type]  # embed input
                                      lambda: p.ranges)
        except Exception as e:  # noqa: BLE001 - contained: this request fails alone
            return self._final(p.req, batch, "failed", reason="model_error", seconds=p.seconds,
                               started_ms=p.started_ms,
                               message=f"encoding the result failed: {type(e).__name__}: {e}")
        return self._final(p.req, batch, "ok", seconds=p.seconds, started_ms=p.started_ms,
                           truncated=p.truncated, **fields)

    # -- rerank ----------------------------------------------------------------

    async def _rerank(self, batch: Batch, req: AdmittedRequest,
                      on_start: OnStart | None = None, urgent: bool = False) -> Served:
        """One rerank request, a call per micro-batch; ``urgent``: its first call runs
        ahead of every call not started (:meth:`_timed_call`)."""
        model: Reranker = self.model  # type: ignore[assignment]  # kind "rerank": a Reranker
        inp: RerankInput = req.input  # type: ignore[assignment]  # a rerank batch's input
        side = truncate_side(inp)
        extra = {} if side == "end" else {"truncate": side}
        limit = model.max_seq_length
        t0 = time.perf_counter()
        started_ms = _now_ms()
        try:
            documents = inp.documents
            if inp.max_tokens_per_doc is not None:
                documents = await self._aside(model.cut_documents, documents,
                                               inp.max_tokens_per_doc)
            lengths = await self._aside(model.token_lengths, inp.query, documents)
            if refuses_truncation(inp):
                for i, n in enumerate(lengths):
                    if n > limit:
                        return self._too_long(req, batch, f"input.documents[{i}]", n, limit,
                                              started_ms)
            plan = plan_microbatches(lengths, max_padded_tokens=self.max_padded_tokens,
                                     max_size=self.max_size, max_seq_length=limit,
                                     call_tokens=self.call_tokens())
            scores: list[float] = [0.0] * len(documents)
            truncated = [False] * len(documents)
            step = model.score_groups(inp.query, documents, plan, lengths=lengths, **extra)
            model_s = 0.0  # the seconds it had the model, not its waits for it
            while True:
                item, seconds, _ = await self._timed_call(next, step, None, on_start=on_start,
                                                          urgent=urgent)
                urgent = False
                model_s += seconds
                if item is None:
                    break
                indices, out = item
                self._measured(seconds, [min(lengths[i], limit) for i in indices])
                for row, i in enumerate(indices):
                    scores[i] = float(out.scores[row])
                    truncated[i] = bool(out.truncated[row])
        except Exception as e:  # noqa: BLE001 - contained: this request fails alone
            return self._final(req, batch, "failed", reason="model_error",
                               message=f"model failed: {type(e).__name__}: {e}",
                               seconds=time.perf_counter() - t0, started_ms=started_ms)
        if refuses_truncation(inp) and any(truncated):
            # What the lengths did not show (a cosine reranker's query): cut all the same.
            return self._too_long(req, batch, "input.query or a document", None, limit,
                                  started_ms)
        ranking = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        if inp.top_n is not None:
            ranking = ranking[: inp.top_n]
        more = {"documents": [inp.documents[i] for i in ranking]} if inp.return_documents else {}
        return self._final(req, batch, "ok", seconds=model_s, scores=scores,
                           ranking=ranking, truncated=truncated, method=model.method,
                           started_ms=started_ms, **more)

    def _too_long(self, req: AdmittedRequest, batch: Batch, what: str, n: int | None,
                  limit: int, started_ms: int | None = None) -> Served:
        has = f"{what} has {n} tokens" if n is not None else f"{what} has too many tokens"
        return self._final(req, batch, "invalid", reason="input_too_long",
                           message=_too_long_message(has, limit), started_ms=started_ms)

    # -- results ---------------------------------------------------------------

    def _final(self, req: AdmittedRequest, batch: Batch, status: Status, *, seconds: float = 0.0,
               started_ms: int | None = None, **fields: Any) -> Served:
        result = Result(
            id=req.id, status=status, org=req.org, endpoint=req.endpoint,
            model=self.model.name if status == "ok" else None, tokens=req.tokens,
            batch_id=batch.id, worker=self.worker, created_ms=req.created_ms,
            admitted_ms=req.admitted_ms, dispatched_ms=batch.created_ms,
            completed_ms=_now_ms(), inference_ms=round(seconds * 1000, 3),
            fetched_ms=req.fetched_ms, received_ms=req.received_ms, started_ms=started_ms,
            express=batch.express, **fields,
        )
        return Served(req, result, seconds)

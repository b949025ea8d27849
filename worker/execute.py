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
inside each window keeps padding low. A rerank request is one query against
its documents, so its documents are planned and scored on their own.

Failure stays local. A request whose input does not fit the endpoint (an
embed input on a rerank endpoint) is ``invalid``; a request whose deadline
passed before the worker got to it is ``expired``; if the model raises on a
micro-batch, each request in it is retried alone and only the ones that
still raise are ``failed``. No request can take its batch down.

The model runs in a thread (``run_in_thread``, by default
``asyncio.to_thread``) so the event loop keeps sending heartbeats and
results while it computes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.messages import AdmittedRequest, Batch, EmbedInput, RerankInput, Result
from worker.interface import Embedder, Reranker
from worker.microbatch import padded_tokens, plan_microbatches

__all__ = ["BatchExecutor", "MicrobatchStats", "Served"]

RunInThread = Callable[..., Awaitable[Any]]


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


@dataclass
class _Pending:
    req: AdmittedRequest
    texts: list[str] = field(default_factory=list)
    vectors: list[Any] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    left: int = 0
    seconds: float = 0.0
    error: str | None = None
    reported: bool = False
    #: When the first micro-batch with one of its texts started (epoch ms).
    started_ms: int | None = None


async def _inline(fn, /, *args, **kwargs):
    return fn(*args, **kwargs)


def _now_ms() -> int:
    return int(time.time() * 1000)


class BatchExecutor:
    """Runs batches of one endpoint on one model (an Embedder or a Reranker)."""

    def __init__(self, model: Embedder | Reranker, kind: str, *, worker: str,
                 max_padded_tokens: int = 4096, max_size: int = 32,
                 window: int | None = None,
                 run_in_thread: RunInThread = asyncio.to_thread,
                 on_microbatch: Callable[[MicrobatchStats], None] | None = None,
                 on_last_step: Callable[[Batch], None] | None = None):
        if kind not in ("embed", "rerank"):
            raise ValueError(f"kind must be 'embed' or 'rerank', got {kind!r}")
        self.model = model
        self.kind = kind
        self.worker = worker
        self.max_padded_tokens = max_padded_tokens
        self.max_size = max_size
        self.window = window
        # A model that declares itself instant (a fake at zero time) is called
        # on the event loop: a thread hop would cost more than the call.
        self._thread = _inline if getattr(model, "instant", False) else run_in_thread
        self._on_microbatch = on_microbatch or (lambda s: None)
        #: Called as a batch's last model call starts (the worker returns its credit then).
        self._on_last_step = on_last_step or (lambda b: None)

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
            async for done in self._embed(batch, work):
                yield done
        else:
            for i, req in enumerate(work):
                if i == len(work) - 1:
                    self._on_last_step(batch)
                yield [await self._rerank(batch, req)]

    # -- embeddings ------------------------------------------------------------

    async def _embed(self, batch: Batch, reqs: list[AdmittedRequest]) -> AsyncIterator[list[Served]]:
        model: Embedder = self.model  # type: ignore[assignment]
        pending = [_Pending(r) for r in reqs]
        texts: list[str] = []
        owner: list[tuple[int, int]] = []  # text index -> (request, position)
        for i, p in enumerate(pending):
            p.texts = p.req.input.texts  # type: ignore[union-attr]
            p.vectors = [None] * len(p.texts)
            p.truncated = [False] * len(p.texts)
            p.left = len(p.texts)
            for j, t in enumerate(p.texts):
                owner.append((i, j))
                texts.append(t)
        lengths = await self._lengths(texts, owner, pending)
        if done := self._take_done(pending, range(len(pending))):
            yield [self._from_pending(batch, p) for p in done]
        live = [k for k in range(len(texts)) if pending[owner[k][0]].error is None]
        plan = plan_microbatches([lengths[k] for k in live],
                                 max_padded_tokens=self.max_padded_tokens,
                                 max_size=self.max_size, order="given",
                                 max_seq_length=model.max_seq_length, window=self.window)
        for n, group in enumerate(plan):
            # Texts of a request that already failed are not worth computing.
            idx = [live[g] for g in group if pending[owner[live[g]][0]].error is None]
            if not idx:
                continue
            if n == len(plan) - 1:
                self._on_last_step(batch)
            touched = await self._encode_group(model, texts, lengths, idx, owner, pending)
            if done := self._take_done(pending, touched):
                yield [self._from_pending(batch, p) for p in done]

    @staticmethod
    def _take_done(pending: list[_Pending], candidates) -> list[_Pending]:
        """Requests that just became complete (or failed), each reported once."""
        out = []
        for i in candidates:
            p = pending[i]
            if not p.reported and (p.error is not None or p.left <= 0):
                p.reported = True
                out.append(p)
        return out

    async def _lengths(self, texts: list[str], owner, pending: list[_Pending]) -> list[int]:
        model: Embedder = self.model  # type: ignore[assignment]
        # Any error of a third-party model is contained to the request that caused it.
        try:
            return list(await self._thread(model.token_lengths, texts))
        except Exception:  # noqa: BLE001 - one request broke the tokenizer: find it below
            lengths = [0] * len(texts)
        for i, p in enumerate(pending):
            ks = [k for k, (o, _) in enumerate(owner) if o == i]
            try:
                got = await self._thread(model.token_lengths, [texts[k] for k in ks])
            except Exception as e:  # noqa: BLE001 - contained: this request fails alone
                p.error = f"tokenizer failed: {type(e).__name__}: {e}"
                continue
            for k, n in zip(ks, got):
                lengths[k] = n
        return lengths

    async def _encode_group(self, model: Embedder, texts, lengths, idx: list[int], owner,
                            pending: list[_Pending]) -> list[int]:
        """Encode one micro-batch; on a model error, each request's texts alone."""
        touched = sorted({owner[k][0] for k in idx})
        sub = [texts[k] for k in idx]
        sub_len = [lengths[k] for k in idx]
        started = _now_ms()
        for i in touched:
            if pending[i].started_ms is None:
                pending[i].started_ms = started
        t0 = time.perf_counter()
        try:
            out = await self._thread(model.encode, sub, lengths=sub_len)
        except Exception:  # noqa: BLE001 - retried request by request below
            out = None
        if out is not None:
            seconds = time.perf_counter() - t0
            self._account(seconds, idx, lengths, owner, pending, model.max_seq_length)
            for row, k in enumerate(idx):
                self._place(pending, owner[k], out.vectors[row], out.truncated[row])
            return touched
        for i in touched:
            ks = [k for k in idx if owner[k][0] == i]
            t0 = time.perf_counter()
            try:
                one = await self._thread(model.encode, [texts[k] for k in ks],
                                         lengths=[lengths[k] for k in ks])
            except Exception as e:  # noqa: BLE001 - contained: this request fails alone
                pending[i].error = f"model failed: {type(e).__name__}: {e}"
                pending[i].left = 0
                continue
            self._account(time.perf_counter() - t0, ks, lengths, owner, pending,
                          model.max_seq_length)
            for row, k in enumerate(ks):
                self._place(pending, owner[k], one.vectors[row], one.truncated[row])
        return touched

    def _account(self, seconds: float, idx, lengths, owner, pending, max_seq: int) -> None:
        capped = [min(lengths[k], max_seq) for k in idx]
        total = sum(capped) or 1
        for c, k in zip(capped, idx):
            pending[owner[k][0]].seconds += seconds * c / total
        self._on_microbatch(MicrobatchStats(seconds, sum(capped),
                                            padded_tokens([list(range(len(idx)))], capped)))

    @staticmethod
    def _place(pending, where, vector, truncated: bool) -> None:
        i, j = where
        p = pending[i]
        if p.vectors[j] is None:
            p.left -= 1
        p.vectors[j] = vector
        p.truncated[j] = bool(truncated)

    def _from_pending(self, batch: Batch, p: _Pending) -> Served:
        if p.error is not None:
            return self._final(p.req, batch, "failed", reason="model_error", message=p.error,
                               seconds=p.seconds, started_ms=p.started_ms)
        vectors = np.asarray(p.vectors, dtype=np.float32)
        return self._final(p.req, batch, "ok", seconds=p.seconds, started_ms=p.started_ms,
                           embeddings=vectors.tolist(), truncated=p.truncated)

    # -- rerank ----------------------------------------------------------------

    async def _rerank(self, batch: Batch, req: AdmittedRequest) -> Served:
        model: Reranker = self.model  # type: ignore[assignment]
        inp: RerankInput = req.input  # type: ignore[assignment]
        t0 = time.perf_counter()
        started_ms = _now_ms()
        try:
            lengths = await self._thread(model.token_lengths, inp.query, inp.documents)
            plan = plan_microbatches(lengths, max_padded_tokens=self.max_padded_tokens,
                                     max_size=self.max_size, max_seq_length=model.max_seq_length)
            scores: list[float] = [0.0] * len(inp.documents)
            truncated = [False] * len(inp.documents)
            step = model.score_groups(inp.query, inp.documents, plan, lengths=lengths)
            while True:
                t1 = time.perf_counter()
                item = await self._thread(next, step, None)
                if item is None:
                    break
                indices, out = item
                capped = [min(lengths[i], model.max_seq_length) for i in indices]
                self._on_microbatch(MicrobatchStats(
                    time.perf_counter() - t1, sum(capped),
                    padded_tokens([list(range(len(capped)))], capped)))
                for row, i in enumerate(indices):
                    scores[i] = float(out.scores[row])
                    truncated[i] = bool(out.truncated[row])
        except Exception as e:  # noqa: BLE001 - contained: this request fails alone
            return self._final(req, batch, "failed", reason="model_error",
                               message=f"model failed: {type(e).__name__}: {e}",
                               seconds=time.perf_counter() - t0, started_ms=started_ms)
        ranking = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        if inp.top_n is not None:
            ranking = ranking[: inp.top_n]
        return self._final(req, batch, "ok", seconds=time.perf_counter() - t0, scores=scores,
                           ranking=ranking, truncated=truncated, method=model.method,
                           started_ms=started_ms)

    # -- results ---------------------------------------------------------------

    def _final(self, req: AdmittedRequest, batch: Batch, status: str, *, seconds: float = 0.0,
               started_ms: int | None = None, **fields: Any) -> Served:
        result = Result(
            id=req.id, status=status, org=req.org, endpoint=req.endpoint,
            model=self.model.name if status == "ok" else None, tokens=req.tokens,
            batch_id=batch.id, worker=self.worker, created_ms=req.created_ms,
            admitted_ms=req.admitted_ms, dispatched_ms=batch.created_ms,
            completed_ms=_now_ms(), inference_ms=round(seconds * 1000, 3),
            fetched_ms=req.fetched_ms, received_ms=req.received_ms, started_ms=started_ms,
            **fields,
        )
        return Served(req, result, seconds)

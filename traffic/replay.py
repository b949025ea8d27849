"""Replay: real traffic through the live pipeline, and the fairness report of it.

Two sources, one path::

    serving-fairness replay --config C --trace T.jsonl [--speed X] [--report DIR]
    serving-fairness replay --config C --bootstrap B --from-topic sf.requests \\
        --since 2025-01-01T10:00:00Z [--until ...] [--to-topic ...]

* **A traffic log** (:mod:`traffic.trace`): every line becomes a request.
  Lines with ``tokens`` and no ``texts`` get texts made up to that count with
  the endpoint's own tokenizer (:mod:`traffic.textsynth`), so admission
  counts what the trace says (the margin is printed); rerank lines get a
  query and documents.
* **A time window of a topic** (``--from-topic``, ``--since``, ``--until``,
  ISO-8601 or epoch seconds): the ingress records Kafka still holds.
  Each partition is read from ``offsets_for_times(since)`` up to its first
  record past ``--until``, or up to its high watermark *when the read
  started* (taken from the first fetch: ``end_offsets()`` is wrong on
  Tansu), so a replay into the topic it reads never reads itself. The
  whole window is read before anything is sent.

Sending keeps the recorded pace times ``--speed`` on an absolute schedule
(request *i* is due at ``start + ts_i / speed``: a late send never delays
the ones after it), and the achieved rate and lateness are reported. Every
request goes out with a **fresh id** (``<run>-<n>``; the mapping back to
the original id, and for topic windows to topic/partition/offset, is in
``id_map.jsonl``), ``reply_to`` set to the replay client's own reply topic
(with ``reply_packed``: its results come several to a record, and the
client reads both forms) and ``created_ms`` set to the send time, so a replay can run next to
production traffic and its deadlines keep their meaning. ``--to-topic``
(default: the configuration's ingress topic) sends elsewhere, e.g. into a
pipeline with another prefix for a what-if run.

Results are collected with :class:`producer.client.FairnessClient`. Every
request ends as one :class:`traffic.report.Outcome`: ``ok``, ``rejected``,
``expired``, ``invalid``, ``failed`` (including a send the broker refused),
or ``missing`` when nothing came back within ``--timeout-s`` after the last
send; none is dropped. What comes back is counted by id as well (in
``replay.json``): ``duplicate_results``, the copies of a result the client
dropped (written twice: dispatched twice); ``delivered_twice``, ids the
client handed over more than once (it promises each once: the first is
kept, the rest counted, never silently dropped); ``foreign_results``,
results for ids this replay never sent (all three per result id, whether
it came alone or in a pack). A quiet replay has 0 of each. Outcome ids are the *original* ids, so a replay and
a simulation of one trace join request by request. Times are seconds from
the scheduled start; a request's latency runs from its send to the end of
its batch (the worker's ``completed_ms``, clamped to when the result was
received, so clock skew cannot make it negative). The scheduler-state
topic gives the queue samples. Jain's index is estimated from the results
(see :func:`traffic.replay_outcomes.live_jain`).

This module sends and collects; :mod:`traffic.replay_outcomes` turns what came
back into outcomes, stage times and a live Jain index; :mod:`app.replay_cli`
is the ``serving-fairness replay`` subcommand.

``--report DIR`` writes the same report as ``simulate`` (tables, plots)
plus ``replay.json`` (send statistics), ``id_map.jsonl`` and ``trace.jsonl``
(what was replayed, with token counts: ``simulate --trace DIR/trace.jsonl``
runs the same traffic on the virtual clock). ``--compare-simulate`` does
that at once and writes ``compare.md``: per-org p50/p99 of the replay and
the simulation side by side.

With no ``--bootstrap`` (or with ``--embedded``) the replay starts the
pipeline in-process: an embedded broker when none is given, then
admission, the scheduler and ``--workers`` workers per endpoint used, with
``--model`` (``fake``, ``fake:ms_per_token=0.28``, ``wheel:...``) for the
workers and for admission's token counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from aiokafka.structs import TopicPartition

from plumbing.bounded import WaitTimeout, bounded, cancel_within, stop_within, within
from plumbing.kafka import (
    KafkaSettings,
    make_consumer,
    make_producer,
)
from plumbing.outbox import Outbox, Written
from plumbing.topics import describe_topics, ensure_topics
from producer.client import FairnessClient
from schemas.codec import DecodeError, codec_for, content_type
from schemas.config import Config
from schemas.messages import Request, Result, SchedulerState
from schemas.topics import Topics
from traffic.replay_outcomes import fit_batch_time, outcomes_of, peak_per_s
from traffic.replay_sources import (
    ReplayError,
    ReplayItem,
)
from traffic.report import (
    Outcome,
    QueueSample,
    percentile,
)

__all__ = ["ReplayRun", "ReplaySettings", "replay"]

_request_codec = codec_for(Request)
_state_codec = codec_for(SchedulerState)
#: Requests due at once (a burst) go to the producer this many at a time.
_SEND_STEP = 500
#: Longest wait for one part of the replay's own shutdown.
_STOP_S = 15.0


@dataclass
class ReplaySettings:
    """How one replay runs."""

    #: Recorded pace times this (2 = twice as fast).
    speed: float = 1.0
    #: Where requests go; None: the configuration's ingress topic.
    to_topic: str | None = None
    #: After the last send, how long to wait for the missing results.
    timeout_s: float = 60.0
    #: Print a progress line on stderr.
    progress: bool = True
    #: Read the scheduler-state topic for the queue-depth samples.
    samples: bool = True
    #: Prefix of the fresh ids; None: ``rp`` + 8 random hex digits.
    run_id: str | None = None
    #: First send this long after the start, so the schedule begins on time.
    lead_s: float = 0.2
    #: At most this many requests sent and not yet answered; a send due past
    #: it waits for a result (a bulk job's client: the rest of its burst
    #: waits here, not in an ingress partition other orgs share). None: no bound.
    max_in_flight: int | None = None


@dataclass
class ReplayRun:
    """A finished replay: one outcome per item, queue samples, send statistics."""

    outcomes: list[Outcome]
    samples: list[QueueSample]
    #: fresh id -> (original id, origin)
    id_map: dict[str, tuple[str, str | None]]
    stats: dict[str, Any]
    #: The fresh id each item was sent under, in item order.
    wire_ids: list[str]
    #: Per item: its result and when it was received (epoch s), or None.
    results: list[tuple[Result, float] | None] = None  # type: ignore[assignment]


# -- sending and collecting ------------------------------------------------------------


async def _room(sent: int, limit: int, progress: _Progress, answered: asyncio.Event,
                timeout_s: float) -> bool:
    """Wait until fewer than ``limit`` of the ``sent`` requests are unanswered, woken by
    ``answered``; False if no result came for ``timeout_s`` seconds (each result starts
    the wait afresh: a slow pipeline that still answers is waited for, a stopped one is
    not)."""
    while sent - progress.results >= limit:
        answered.clear()
        try:
            await within(answered.wait(), timeout_s)
        except TimeoutError:
            return False
    return True


class _Progress:
    """One status line on stderr: rewritten in place on a terminal, every 5 s otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.sent = 0
        self.results = 0
        self.ok = 0
        self.started = time.monotonic()
        self._last = 0.0

    def line(self) -> str:
        t = time.monotonic() - self.started
        pct = 100.0 * self.results / self.total if self.total else 100.0
        return (f"replay: sent {self.sent}/{self.total}, results {self.results} "
                f"({pct:.0f} %, ok {self.ok}, other {self.results - self.ok}), {t:.1f} s")

    def show(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < (0.25 if self.tty else 5.0):
            return
        self._last = now
        end = "" if self.tty and not force else "\n"
        sys.stderr.write(("\r" if self.tty else "") + self.line() + end)
        sys.stderr.flush()


async def _read_samples(kafka: KafkaSettings, topic: str, wall0: float,
                        out: list[QueueSample]) -> None:
    """Follow the scheduler-state topic from the start of the replay."""
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        found = await consumer.offsets_for_times({tp: int(wall0 * 1000) - 1000})
        hit = found.get(tp)
        if hit is not None:
            consumer.seek(tp, hit.offset)
        else:
            # Nothing since the start yet. Tansu's end offset may lag the true
            # end by one batch: the few older snapshots are dropped below.
            consumer.seek(tp, (await consumer.end_offsets([tp]))[tp])
        while True:
            got = await consumer.getmany(timeout_ms=500)
            for records in got.values():
                for rec in records:
                    try:
                        state = _state_codec.decode_record(rec.value, rec.headers)
                    except DecodeError:
                        continue
                    t = state.sent_ms / 1000.0 - wall0
                    if t < -1.0:
                        continue
                    for ep, lane in state.lanes.items():
                        out.append(QueueSample(t_s=round(t, 6), endpoint=ep,
                                               held_tokens_by_tier=lane.held_tokens_by_tier))
    finally:
        await consumer.stop()


async def replay(kafka: KafkaSettings, config: Config, items: Sequence[ReplayItem],
                 settings: ReplaySettings | None = None) -> ReplayRun:
    """Send ``items`` at their pace, collect one outcome for each (see the module docstring)."""
    s = settings or ReplaySettings()
    if not s.speed > 0:
        raise ReplayError("--speed must be > 0")
    if s.max_in_flight is not None and s.max_in_flight < 1:
        raise ReplayError(f"--max-in-flight must be 1 or more, not {s.max_in_flight}")
    topics = Topics.of(config)
    to_topic = s.to_topic or topics.ingress
    existing = await describe_topics(kafka, to_topic)
    if to_topic not in existing:
        await ensure_topics(kafka, {to_topic: config.service.ingress_partitions})
    run_id = s.run_id or f"rp{uuid.uuid4().hex[:8]}"
    wire_ids = [f"{run_id}-{i}" for i in range(len(items))]
    index = {w: i for i, w in enumerate(wire_ids)}
    got: list[tuple[Result, float] | None] = [None] * len(items)
    sent_at: list[float | None] = [None] * len(items)
    send_error: dict[int, str] = {}
    progress = _Progress(len(items), s.progress)
    all_in = asyncio.Event()
    answered = asyncio.Event()  # a result came: room in the in-flight bound
    samples: list[QueueSample] = []
    foreign: Counter[str] = Counter()
    twice: Counter[str] = Counter()

    client = FairnessClient(kafka, config, client_id=f"replay-{run_id}",
                            remember_ids=max(100_000, 2 * len(items)))
    await client.start()
    producer = make_producer(kafka)
    await producer.start()
    side_tasks: list[asyncio.Task] = []

    async def collect() -> None:
        async for res in client.results():
            i = index.get(res.id)
            if i is None:
                foreign[res.id] += 1
                continue
            if got[i] is not None:
                twice[res.id] += 1  # the first result stands; the copy is counted
                continue
            got[i] = (res, time.time())
            answered.set()
            progress.results += 1
            progress.ok += res.status == "ok"
            if progress.results + len(send_error) >= len(items):
                all_in.set()

    async def tick() -> None:
        while True:
            progress.show()
            await asyncio.sleep(0.25)

    lags: list[float] = []
    try:
        side_tasks.append(asyncio.create_task(collect(), name="replay-collect"))
        side_tasks.append(asyncio.create_task(tick(), name="replay-progress"))
        mono0 = time.monotonic() + s.lead_s
        wall0 = time.time() + s.lead_s
        if s.samples and topics.scheduler_state in await describe_topics(
                kafka, topics.scheduler_state):
            side_tasks.append(asyncio.create_task(
                _read_samples(kafka, topics.scheduler_state, wall0, samples),
                name="replay-samples"))
        if not items:
            all_in.set()
        outbox = Outbox(producer)
        written: list[tuple[list[int], Written]] = []
        queued: list[int] = []
        headers = {fmt: [("content-type", content_type(fmt).encode())]
                   for fmt in ("json", "msgpack")}
        for i, item in enumerate(items):
            if s.max_in_flight is not None and i - progress.results >= s.max_in_flight:
                if queued:  # what is in hand goes out before the wait
                    written.append((queued, await outbox.submit()))
                    queued = []
                if not await _room(i, s.max_in_flight, progress, answered, s.timeout_s):
                    # Nothing came back in time: the rest is not sent, and says why.
                    why = (f"not sent: no result within {s.timeout_s:g} s with "
                           f"{s.max_in_flight} requests in flight (max_in_flight)")
                    send_error.update((k, why) for k in range(i, len(items)))
                    break
            due = mono0 + item.ts / s.speed
            delay = due - time.monotonic()
            if delay > 0.0005:
                if queued:  # what is due goes out before the pause
                    written.append((queued, await outbox.submit()))
                    queued = []
                await asyncio.sleep(delay)
            now_mono = time.monotonic()
            now_wall = wall0 + (now_mono - mono0)
            lags.append(now_mono - due)
            req = msgspec.structs.replace(item.request, id=wire_ids[i],
                                          reply_to=client.reply_topic,
                                          reply_packed=client.asks_packed(client.reply_topic),
                                          created_ms=int(now_wall * 1000))
            sent_at[i] = now_wall
            outbox.add(to_topic, _request_codec.encode(req, item.wire_format),
                       key=req.org.encode(), headers=headers[item.wire_format])
            queued.append(i)
            if len(queued) >= _SEND_STEP:
                written.append((queued, await outbox.submit()))
                queued = []
            progress.sent = i + 1
        if queued:
            written.append((queued, await outbox.submit()))
        last_send = time.monotonic()
        for indices, w in written:
            try:
                errors = await bounded(w.outcomes(), last_send + s.timeout_s - time.monotonic(),
                                       f"the broker to acknowledge {len(indices)} requests")
            except WaitTimeout as e:
                errors = [e] * len(indices)
            for i, error in zip(indices, errors, strict=True):
                if error is not None:
                    send_error[i] = repr(error)
        if progress.results + len(send_error) >= len(items):
            all_in.set()
        with contextlib.suppress(TimeoutError):
            await within(all_in.wait(), max(0.0, last_send + s.timeout_s - time.monotonic()))
        progress.show(force=True)
    finally:
        await cancel_within(side_tasks, _STOP_S, "the replay's side tasks to end")
        await stop_within(producer.stop(), _STOP_S, "the replay's producer to stop")
        await stop_within(client.stop(), _STOP_S, "the replay's result client to stop")

    outcomes = outcomes_of(config, items, got, sent_at, send_error, wall0)
    model_fit = fit_batch_time([g[0] for g in got if g is not None])
    span = items[-1].ts / s.speed if items else 0.0
    first = min((t for t in sent_at if t is not None), default=wall0)
    last = max((t for t in sent_at if t is not None), default=wall0)
    lags.sort()
    stats = {
        "run_id": run_id, "to_topic": to_topic, "reply_topic": client.reply_topic,
        "requests": len(items), "speed": s.speed,
        "intended_span_s": round(span, 6), "achieved_span_s": round(last - first, 6),
        "intended_rate_rps": round(len(items) / span, 1) if span > 0 else None,
        "achieved_rate_rps": round(len(items) / (last - first), 1) if last > first else None,
        # The busiest second: a burst's rate, which the overall rate hides.
        "intended_peak_rps": peak_per_s([it.ts / s.speed for it in items]),
        "achieved_peak_rps": peak_per_s(sorted(t for t in sent_at if t is not None)),
        "send_lag_ms": {k: round(1000 * (percentile(lags, q) or 0.0), 3)
                        for k, q in (("p50", 50), ("p99", 99), ("max", 100))},
        "send_failed": len(send_error),
        # Of those, never sent: the in-flight bound's wait for a result ran out.
        "not_sent": sum(1 for i in send_error if sent_at[i] is None),
        "max_in_flight": s.max_in_flight,
        "missing": sum(1 for o in outcomes if o.status == "missing"),
        "foreign_results": sum(foreign.values()), "duplicate_results": client.duplicates,
        "delivered_twice": len(twice),
        "by_id_examples": {"foreign": sorted(foreign)[:3], "delivered_twice": sorted(twice)[:3]},
        "model_fit": model_fit,
    }
    id_map = {w: (it.request.id, it.origin) for w, it in zip(wire_ids, items, strict=True)}
    return ReplayRun(outcomes, sorted(samples, key=lambda q: q.t_s), id_map, stats, wire_ids,
                     got)

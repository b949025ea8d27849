"""Replay: real traffic through the live pipeline, and the fairness report of it.

Two sources, one path::

    serving-fairness replay --config C --trace T.jsonl [--speed X] [--report DIR]
    serving-fairness replay --config C --bootstrap B --from-topic sf.requests \\
        --since 2025-01-01T10:00:00Z [--until ...] [--to-topic ...]

* **A traffic log** (:mod:`scheduler.trace`): every line becomes a request.
  Lines with ``tokens`` and no ``texts`` get texts made up to that count with
  the endpoint's own tokenizer (:mod:`producer.textsynth`), so admission
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
and ``created_ms`` set to the send time, so a replay can run next to
production traffic and its deadlines keep their meaning. ``--to-topic``
(default: the configuration's ingress topic) sends elsewhere, e.g. into a
pipeline with another prefix for a what-if run.

Results are collected with :class:`producer.client.FairnessClient`. Every
request ends as one :class:`scheduler.report.Outcome`: ``ok``, ``rejected``,
``expired``, ``invalid``, ``failed`` (including a send the broker refused),
or ``missing`` when nothing came back within ``--timeout-s`` after the last
send; none is dropped. Outcome ids are the *original* ids, so a replay and
a simulation of one trace join request by request. Times are seconds from
the scheduled start; a request's latency runs from its send to the end of
its batch (the worker's ``completed_ms``, clamped to when the result was
received, so clock skew cannot make it negative). The scheduler-state
topic gives the queue samples. Jain's index is estimated from the results
(see :func:`live_jain`).

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

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from plumbing.kafka import (
    KafkaSettings,
    add_kafka_arguments,
    kafka_endpoint,
    make_consumer,
    make_producer,
    settings_from_args,
)
from plumbing.topics import describe_topics, ensure_topics
from producer.client import FairnessClient
from producer.replay_sources import (
    ReplayError,
    ReplayItem,
    items_from_trace,
    parse_time_ms,
    read_window,
    to_trace,
)
from producer.textsynth import TextSynth
from scheduler.report import (
    Outcome,
    QueueSample,
    compare,
    format_table,
    percentile,
    summarize,
    write_report,
)
from scheduler.trace import TraceError, read_trace, write_trace
from schemas.codec import DecodeError, codec_for, content_type
from schemas.config import Config, ConfigError, load_config
from schemas.messages import Request, Result, SchedulerState
from schemas.topics import Topics
from worker.fake import is_fake_spec

__all__ = [
    "ReplayRun",
    "ReplaySettings",
    "add_arguments",
    "live_jain",
    "replay",
    "replay_command",
    "run",
    "stage_table",
]

_request_codec = codec_for(Request)
_state_codec = codec_for(SchedulerState)


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


# -- sending and collecting ------------------------------------------------------------


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
    samples: list[QueueSample] = []
    foreign = 0

    client = FairnessClient(kafka, config, client_id=f"replay-{run_id}",
                            remember_ids=max(100_000, 2 * len(items)))
    await client.start()
    producer = make_producer(kafka)
    await producer.start()
    side_tasks: list[asyncio.Task] = []

    async def collect() -> None:
        nonlocal foreign
        async for res in client.results():
            i = index.get(res.id)
            if i is None:
                foreign += 1
                continue
            if got[i] is None:
                got[i] = (res, time.time())
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
        acks: list[tuple[int, asyncio.Future]] = []
        for i, item in enumerate(items):
            due = mono0 + item.ts / s.speed
            delay = due - time.monotonic()
            if delay > 0.0005:
                await asyncio.sleep(delay)
            now_mono = time.monotonic()
            now_wall = wall0 + (now_mono - mono0)
            lags.append(now_mono - due)
            req = msgspec.structs.replace(item.request, id=wire_ids[i],
                                          reply_to=client.reply_topic,
                                          created_ms=int(now_wall * 1000))
            sent_at[i] = now_wall
            try:
                fut = await producer.send(
                    to_topic, _request_codec.encode(req, item.wire_format),
                    key=req.org.encode(),
                    headers=[("content-type", content_type(item.wire_format).encode())])
                acks.append((i, fut))
            except KafkaError as e:
                send_error[i] = repr(e)
            progress.sent = i + 1
        last_send = time.monotonic()
        for i, fut in acks:
            try:
                await fut
            except KafkaError as e:
                send_error[i] = repr(e)
        if progress.results + len(send_error) >= len(items):
            all_in.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(),
                                   max(0.0, last_send + s.timeout_s - time.monotonic()))
        progress.show(force=True)
    finally:
        for t in side_tasks:
            t.cancel()
        for t in side_tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await producer.stop()
        await client.stop()

    outcomes = _outcomes(config, items, got, sent_at, send_error, wall0)
    model_fit = _fit_batch_time([g[0] for g in got if g is not None])
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
        "intended_peak_rps": _peak_per_s([it.ts / s.speed for it in items]),
        "achieved_peak_rps": _peak_per_s(sorted(t for t in sent_at if t is not None)),
        "send_lag_ms": {k: round(1000 * (percentile(lags, q) or 0.0), 3)
                        for k, q in (("p50", 50), ("p99", 99), ("max", 100))},
        "send_failed": len(send_error),
        "missing": sum(1 for o in outcomes if o.status == "missing"),
        "foreign_results": foreign, "duplicate_results": client.duplicates,
        "model_fit": model_fit,
    }
    id_map = {w: (it.request.id, it.origin) for w, it in zip(wire_ids, items, strict=True)}
    return ReplayRun(outcomes, sorted(samples, key=lambda q: q.t_s), id_map, stats, wire_ids)


_STAGES = (("admission", "admitted_s", "arrival_s"), ("scheduler", "dispatched_s", "admitted_s"),
           ("batch", "completed_s", "dispatched_s"))


def stage_table(runs: dict[str, Sequence[Outcome]], *, max_orgs: int = 12) -> str:
    """p50 ms of each stage of an ok request's life, per org, for each labelled run.

    Stages: *admission* (sent -> admitted: the ingress topic and admission),
    *scheduler* (admitted -> put in a batch: held, waiting for its turn and a
    free slot), *batch* (batch -> done: the batch topic, the worker's queue
    and the model). The simulator admits instantly, so its admission is 0.
    """
    per: dict[str, dict[str, dict[str, list[float]]]] = {}
    counts: dict[str, int] = {}
    for label, outcomes in runs.items():
        for o in outcomes:
            counts[o.org] = counts.get(o.org, 0) + (label == next(iter(runs)))
            if o.status != "ok":
                continue
            row = per.setdefault(o.org, {}).setdefault(label, {n: [] for n, _, _ in _STAGES})
            for name, end, start in _STAGES:
                a, b = getattr(o, end), getattr(o, start)
                if a is not None and b is not None:
                    row[name].append(a - b)
    labels = list(runs)
    header = ["org"] + [f"{n} {lab}" for n, _, _ in _STAGES for lab in labels]
    lines = ["| " + " | ".join(header) + " |", "|:--|" + "--:|" * (len(header) - 1)]
    for org in sorted(per, key=lambda o: (-counts.get(o, 0), o))[:max_orgs]:
        cells = [org]
        for name, _, _ in _STAGES:
            for lab in labels:
                xs = sorted(per[org].get(lab, {}).get(name, []))
                v = percentile(xs, 50)
                cells.append("-" if v is None else f"{v * 1000:,.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fit_batch_time(results: Iterable[Result]) -> dict[str, float] | None:
    """The workers' batch time as ``overhead_ms + ms_per_token x tokens``, fitted to the run.

    Each ok result carries its share of its micro-batches' model time
    (``inference_ms``); summed per batch they give the batch's model time.
    Least squares over the batches; through the origin if the intercept
    comes out negative. None without two batches of different sizes.
    """
    per_batch: dict[str, list[float]] = {}
    for r in results:
        if r.status == "ok" and r.batch_id and r.inference_ms is not None and r.tokens:
            b = per_batch.setdefault(r.batch_id, [0.0, 0.0])
            b[0] += r.tokens
            b[1] += r.inference_ms
    pts = list(per_batch.values())
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    intercept = my - slope * mx
    if intercept < 0 or slope <= 0:
        slope, intercept = sum(y for _, y in pts) / sum(x for x, _ in pts), 0.0
    return {"batches": n, "overhead_ms": round(intercept, 4), "ms_per_token": round(slope, 6)}


def _peak_per_s(times: Sequence[float]) -> int:
    """Most of the (sorted) ``times`` within any one second."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _outcomes(config: Config, items: Sequence[ReplayItem],
              got: Sequence[tuple[Result, float] | None], sent_at: Sequence[float | None],
              send_error: dict[int, str], wall0: float) -> list[Outcome]:
    """One :class:`Outcome` per item, in item order, times from ``wall0``."""

    def rel(ms: int | None) -> float | None:
        return None if ms is None else round(ms / 1000.0 - wall0, 6)

    batch_tokens: dict[str, int] = {}
    for g in got:
        if g is not None and g[0].status == "ok" and g[0].batch_id:
            batch_tokens[g[0].batch_id] = batch_tokens.get(g[0].batch_id, 0) + (g[0].tokens or 0)
    out = []
    for i, item in enumerate(items):
        req = item.request
        org = config.orgs.get(req.org)
        ep = config.endpoints.get(req.endpoint)
        sent = sent_at[i] if sent_at[i] is not None else wall0
        base = {"id": req.id, "org": req.org, "tier": org.tier if org else "",
                "endpoint": req.endpoint, "arrival_s": round(sent - wall0, 6)}
        if i in send_error:
            out.append(Outcome(**base, status="failed", reason="replay_send_failed",
                               tokens=item.tokens, completed_s=base["arrival_s"]))
            continue
        if got[i] is None:
            out.append(Outcome(**base, status="missing", reason="no_result_within_timeout",
                               tokens=item.tokens))
            continue
        res, received = got[i]
        done_ms = res.completed_ms if res.completed_ms is not None else int(received * 1000)
        # Another host's clock may be off: never before the send, never after receipt.
        done_ms = min(max(done_ms, int(sent * 1000)), int(received * 1000))
        out.append(Outcome(
            **base, status=res.status, reason=res.reason, tokens=res.tokens or item.tokens,
            admitted_s=rel(res.admitted_ms), dispatched_s=rel(res.dispatched_ms),
            completed_s=rel(done_ms), batch_id=res.batch_id,
            batch_tokens=batch_tokens.get(res.batch_id) if res.batch_id else None,
            batch_budget=ep.max_batch_tokens if ep and res.batch_id else None))
    return out


def live_jain(outcomes: Sequence[Outcome], config: Config, *, hop_s: float = 0.1,
              min_batches: int = 3) -> tuple[float | None, list[dict]]:
    """Jain's index over backlogged orgs, estimated from a live run's outcomes.

    The simulator's definition (:mod:`scheduler.simulate`) needs the
    scheduler's queues; a replay only has each request's admission and
    dispatch times. So an org counts as backlogged across a batch when one
    of its requests was admitted at least ``hop_s`` before the batch was
    dispatched and left (in a later batch, or expired) after it. ``hop_s``
    stands for the trip from admission to the scheduler (tens of ms): a
    request still on its way cannot be chosen, and counting it would blame
    the scheduler for batches it assembled before the request existed for
    it; under load the hop is longer, so a set seen across fewer than
    ``min_batches`` batches is not counted. Cost is tokens. Returns the
    index of the set with the most served tokens and the ten largest sets,
    as the simulator reports them.
    """
    from scheduler.simulate import JainGroup

    events: list[tuple[float, int, str, Any]] = []
    batches: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.admitted_s is None:
            continue
        if o.status == "ok" and o.batch_id and o.dispatched_s is not None:
            events.append((min(o.admitted_s + hop_s, o.dispatched_s), 0, o.id, o))
            batches.setdefault(o.batch_id, []).append(o)
        elif o.status == "expired" and o.completed_s is not None:
            events.append((min(o.admitted_s + hop_s, o.completed_s), 0, o.id, o))
            events.append((o.completed_s, 1, o.id, o))
    for bid, members in batches.items():
        events.append((min(m.dispatched_s for m in members), 2, bid, members))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    held: dict[tuple[str, str], dict[str, int]] = {}
    groups: dict[tuple[str, str, frozenset[str]], JainGroup] = {}

    def change(o: Outcome, d: int) -> None:
        counts = held.setdefault((o.endpoint, o.tier), {})
        counts[o.org] = counts.get(o.org, 0) + d
        if counts[o.org] <= 0:
            del counts[o.org]

    for _, kind, _, what in events:
        if kind == 0:
            change(what, +1)
        elif kind == 1:
            change(what, -1)
        else:
            served: dict[tuple[str, str], float] = {}
            for m in what:
                change(m, -1)
                served[(m.tier, m.org)] = served.get((m.tier, m.org), 0.0) + m.tokens
            endpoint = what[0].endpoint
            for (ep, tier), counts in held.items():
                if ep != endpoint or len(counts) < 2:
                    continue
                key = (ep, tier, frozenset(counts))
                g = groups.get(key)
                if g is None:
                    orgs = tuple(sorted(counts))
                    weights = {o: config.orgs[o].weight if o in config.orgs else 1.0
                               for o in orgs}
                    g = groups[key] = JainGroup(ep, tier, orgs, 0, dict.fromkeys(orgs, 0.0),
                                                weights)
                g.batches += 1
                for org in g.orgs:
                    g.served[org] += served.get((tier, org), 0.0)
    ranked = [g for g in sorted(groups.values(), key=lambda g: -sum(g.served.values()))
              if g.batches >= min_batches]
    return (round(ranked[0].index, 6) if ranked else None), [g.to_json() for g in ranked[:10]]


# -- the `replay` subcommand -------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness replay``."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    src = parser.add_argument_group("source (one of)")
    src.add_argument("--trace", help="traffic log (JSON Lines, see `serving-fairness trace`)")
    src.add_argument("--from-topic", metavar="TOPIC",
                     help="re-send the requests this topic holds in [--since, --until]")
    src.add_argument("--since", help="window start: ISO-8601 (no zone = UTC) or epoch seconds")
    src.add_argument("--until", help="window end (inclusive; default: what the topic holds now)")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="pace multiplier: 2 sends twice as fast as recorded (default 1)")
    parser.add_argument("--to-topic", default=None,
                        help="send here instead of the configuration's ingress topic")
    parser.add_argument("--report", metavar="DIR", help="write the report (tables, plots) here")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="after the last send, wait this long for results; the rest are "
                             "reported missing (default 60)")
    parser.add_argument("--embedded", action="store_true",
                        help="run admission, scheduler and workers in this process (the "
                             "default when no --bootstrap is given)")
    parser.add_argument("--model", default=None,
                        help="in-process pipeline: model spec of the workers and admission's "
                             "token counts (fake, fake:ms_per_token=0.28, wheel:...); default: "
                             "each endpoint's model")
    parser.add_argument("--workers", type=int, default=1,
                        help="in-process pipeline: workers per endpoint (default 1)")
    parser.add_argument("--policy", choices=["drr", "fifo"], default="drr",
                        help="in-process pipeline: scheduling policy (default drr)")
    parser.add_argument("--token-counter", default=None, metavar="SPEC",
                        help="count and make up texts with this model spec (default: --model, "
                             "else each endpoint's model, as admission does)")
    parser.add_argument("--compare-simulate", action="store_true",
                        help="also simulate the same traffic and write compare.md")
    parser.add_argument("--sim-overhead-ms", type=float, default=None,
                        help="simulation: fixed time per batch (default: the fake model's "
                             "ms_per_batch, else fitted to the replay's batches)")
    parser.add_argument("--sim-ms-per-token", type=float, default=None,
                        help="simulation: time per token (default: the fake model's "
                             "ms_per_token, else fitted to the replay's batches)")
    parser.add_argument("--sim-no-admission", action="store_true",
                        help="simulation without the admission checks (rate limits, overload, "
                             "throttle); the live pipeline always has them")
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    parser.add_argument("--log-level", default="WARNING",
                        help="log level of the in-process services (default WARNING)")
    add_kafka_arguments(parser)


def _fail(message: str) -> int:
    print(f"serving-fairness replay: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run ``serving-fairness replay``: 0 when every request came back, 1 if some did not."""
    from plumbing.logs import configure_logging

    configure_logging(args.log_level)
    return asyncio.run(replay_command(args))


async def replay_command(args: argparse.Namespace) -> int:
    """The subcommand on a running event loop (for tests); exit codes as :func:`run`."""
    if bool(args.trace) == bool(args.from_topic):
        return _fail("give --trace FILE or --from-topic TOPIC (with --since)")
    if args.from_topic and not args.since:
        return _fail("--from-topic needs --since")
    if args.speed <= 0 or args.workers < 1:
        return _fail("--speed must be > 0 and --workers >= 1")
    try:
        config = load_config(args.config)
        since = parse_time_ms(args.since) if args.since else None
        until = parse_time_ms(args.until) if args.until else None
    except (ConfigError, ValueError) as e:
        return _fail(str(e))
    kafka = settings_from_args(args)
    if args.from_topic and kafka.bootstrap is None:
        return _fail("--from-topic reads a cluster: give --bootstrap (an embedded broker "
                     "starts empty)")
    args.in_process = args.embedded or kafka.bootstrap is None
    try:
        return await _main(args, config, kafka, since, until)
    except (ReplayError, TraceError, OSError, TimeoutError) as e:
        return _fail(str(e) or repr(e))


def _counter_spec(args: argparse.Namespace, config: Config, endpoint: str) -> str:
    """The spec admission counts ``endpoint``'s tokens with (see :class:`plumbing.stack.Stack`)."""
    if args.token_counter:
        return args.token_counter
    if args.in_process and args.model and is_fake_spec(args.model):
        return "fake"
    ep = config.endpoints.get(endpoint) or next(iter(config.endpoints.values()))
    return ep.model


async def _load_items(args: argparse.Namespace, config: Config, kafka: KafkaSettings,
                      since: int | None, until: int | None
                      ) -> tuple[list[ReplayItem], str, dict[str, Any] | None]:
    """The items to send, a name for their source, and the token margin (traces)."""
    from worker.tokenizer import load_token_counter

    synths: dict[str, TextSynth] = {}
    counters: dict[str, Any] = {}

    def synth_for(endpoint: str) -> TextSynth:
        if endpoint not in synths:
            spec = _counter_spec(args, config, endpoint)
            if spec not in counters:
                counters[spec] = load_token_counter(spec)
            ep = config.endpoints.get(endpoint)
            synths[endpoint] = TextSynth(counters[spec], max_texts=ep.max_texts if ep else 64)
        return synths[endpoint]

    t0 = time.perf_counter()
    if args.from_topic:
        window = await read_window(kafka, args.from_topic, since, until,
                                   count=lambda r: synth_for(r.endpoint).count(r.input))
        source = f"{args.from_topic} [{args.since}, {args.until or 'now'}]"
        ranges = {p: list(r) for p, r in sorted(window.ranges.items())}
        print(f"{len(window.items)} requests from {source} (offsets per partition {ranges}), "
              f"{len(window.skipped)} records skipped", file=sys.stderr)
        for line in window.skipped[:10]:
            print(f"  skipped {line}", file=sys.stderr)
        return window.items, source, None
    records = read_trace(args.trace)
    items = await asyncio.to_thread(items_from_trace, records, config, synth_for)
    diffs = [synth_for(it.request.endpoint).count(it.request.input) - it.tokens for it in items]
    margin = {"exact": sum(1 for d in diffs if d == 0),
              "max_abs_diff": max((abs(d) for d in diffs), default=0),
              "mean_abs_rel_diff": round(sum(abs(d) / it.tokens for d, it in
                                             zip(diffs, items, strict=True))
                                         / max(1, len(items)), 6)}
    source = Path(args.trace).name
    print(f"{len(items)} requests from {source} over {items[-1].ts if items else 0:.3f} s; "
          f"inputs ready in {time.perf_counter() - t0:.1f} s; admission's token count equals "
          f"the trace's for {margin['exact']}, largest difference {margin['max_abs_diff']}",
          file=sys.stderr)
    return items, source, margin


async def _main(args: argparse.Namespace, config: Config, kafka: KafkaSettings,
                since: int | None, until: int | None) -> int:
    from plumbing.stack import Stack

    async with kafka_endpoint(kafka) as bootstrap:
        if kafka.bootstrap is None:
            # Our own broker: short sessions make group joins take ~1 s, not 3.
            kafka = msgspec.structs.replace(kafka, session_timeout_ms=2000,
                                            heartbeat_interval_ms=500)
        kafka = msgspec.structs.replace(kafka, bootstrap=bootstrap)
        items, source, margin = await _load_items(args, config, kafka, since, until)
        settings = ReplaySettings(speed=args.speed, to_topic=args.to_topic,
                                  timeout_s=args.timeout_s, progress=not args.no_progress)
        if not args.in_process:
            result = await replay(kafka, config, items, settings)
        else:
            endpoints = sorted({it.request.endpoint for it in items} & set(config.endpoints))
            print(f"starting the pipeline in-process ({args.workers} worker(s) x "
                  f"{config.service.worker_slots} slot(s) per endpoint, model "
                  f"{args.model or 'of each endpoint'}, policy {args.policy})...",
                  file=sys.stderr)
            async with Stack(config, kafka, policy=args.policy, model=args.model,
                             workers=args.workers, endpoints=endpoints or None,
                             token_counter=args.token_counter):
                result = await replay(kafka, config, items, settings)
    return _finish(args, config, items, result, source, margin)


def _sim_service(args: argparse.Namespace, fit: dict[str, float] | None
                 ) -> tuple[float, float, str]:
    """The simulator's batch time: flags, else the fake model's, else fitted to the replay."""
    from worker.fake import parse_fake_spec

    overhead, per_token, how = 5.0, 0.28, "the simulator's default"
    if args.model and is_fake_spec(args.model):
        opts = parse_fake_spec(args.model)
        overhead = float(opts.get("ms_per_batch", 0.0))
        per_token = float(opts.get("ms_per_token", 0.0))
        how = "the fake model's"
    elif fit is not None:
        overhead, per_token = fit["overhead_ms"], fit["ms_per_token"]
        how = f"fitted to the replay's {fit['batches']} batches"
    if args.sim_overhead_ms is not None or args.sim_ms_per_token is not None:
        how = "given"
    if args.sim_overhead_ms is not None:
        overhead = args.sim_overhead_ms
    if args.sim_ms_per_token is not None:
        per_token = args.sim_ms_per_token
    if overhead <= 0 and per_token <= 0:
        overhead = 0.001  # a batch takes some time: the simulator divides by it
    return overhead, per_token, how


def _finish(args: argparse.Namespace, config: Config, items: Sequence[ReplayItem],
            result: ReplayRun, source: str, margin: dict | None) -> int:
    st = result.stats
    jain_index, groups = live_jain(result.outcomes, config)
    meta = {"label": "replay", "source": source, "config": Path(args.config).name,
            "speed": args.speed, "model": args.model or "each endpoint's",
            "pipeline": "in-process" if args.in_process else "external",
            "intended_rate_rps": st["intended_rate_rps"], "achieved_rate_rps":
            st["achieved_rate_rps"], "send_lag_ms": st["send_lag_ms"]}
    if margin is not None:
        meta["token_margin"] = margin
    extra: dict[str, Any] = {"meta": meta, "jain_index": jain_index, "jain": groups,
                             "replay": st}
    if jain_index is None:
        extra["jain_note"] = ("no two orgs of one tier were seen backlogged together across "
                              "3 batches or more")
    summary = summarize(result.outcomes, **extra)
    intended = f"{st['intended_rate_rps']:,.1f}" if st["intended_rate_rps"] else "all at once"
    achieved = f"{st['achieved_rate_rps']:,.1f}" if st["achieved_rate_rps"] else "-"
    print(f"\n## replay: {st['requests']} requests from {source}, speed {args.speed:g}\n")
    print(f"send rate intended {intended} requests/s, achieved {achieved} requests/s "
          f"(span {st['intended_span_s']:.3f} s intended, {st['achieved_span_s']:.3f} s "
          f"achieved; busiest second {st['intended_peak_rps']} intended, "
          f"{st['achieved_peak_rps']} achieved); lateness p50 {st['send_lag_ms']['p50']:.1f} "
          f"ms, p99 {st['send_lag_ms']['p99']:.1f} ms, max {st['send_lag_ms']['max']:.1f} ms\n")
    print(format_table(summary))
    print(f"\np50 ms per stage (admission: sent -> admitted; scheduler: -> in a batch; "
          f"batch: -> done)\n\n{stage_table({'replay': result.outcomes})}")
    compare_text = None
    sim_summary = None
    if args.compare_simulate:
        from scheduler.simulate import PipelineAdmission, ServiceModel, SimSettings, simulate

        overhead, per_token, how = _sim_service(args, st.get("model_fit"))
        admission = None if args.sim_no_admission else PipelineAdmission(config)
        sim = simulate(config, to_trace(items, args.speed),
                       SimSettings(policy=args.policy, workers=args.workers,
                                   slots=config.service.worker_slots,
                                   service=ServiceModel(overhead, per_token),
                                   admission=admission))
        sim.meta.update(label="simulate", source=source, service_model=how)
        sim_summary = sim.summary()
        compare_text = compare(summary, sim_summary, labels=("replay", "simulate"))
        compare_text = (
            f"Simulation: {overhead:g} ms + {per_token:g} ms/token per batch ({how}), "
            f"{args.workers} worker(s) x {config.service.worker_slots} slot(s) per endpoint, "
            f"policy {args.policy}, admission {'off' if admission is None else 'on'}.\n\n"
            + compare_text + "\n\np50 ms per stage (admission: sent -> admitted; scheduler: "
            "admitted -> in a batch; batch: -> done; the simulator admits instantly)\n\n"
            + stage_table({"replay": result.outcomes, "simulate": sim.outcomes}))
        print(f"\n## replay vs simulate\n\n{compare_text}")
    if args.report:
        out = Path(args.report)
        title = f"Replay: {source}, speed {args.speed:g}"
        write_report(out, result.outcomes, result.samples, title=title, summary=summary)
        with (out / "id_map.jsonl").open("w") as f:
            for wire, (orig, origin) in result.id_map.items():
                f.write(json.dumps({"id": wire, "original_id": orig, "origin": origin}) + "\n")
        (out / "replay.json").write_text(json.dumps(st, indent=2) + "\n")
        write_trace(out / "trace.jsonl", to_trace(items, args.speed))
        if compare_text is not None:
            write_report(out / "simulate", sim.outcomes, sim.samples,
                         title=f"Simulated: {source}, speed {args.speed:g}", summary=sim_summary)
            (out / "compare.md").write_text(
                f"# Replay vs simulation: {source}\n\n{compare_text}\n")
        print(f"\nreport written to {out}", file=sys.stderr)
    missing = st["missing"] + st["send_failed"]
    if missing:
        print(f"{st['missing']} requests missing, {st['send_failed']} not sent", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="serving-fairness replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(_p)
    sys.exit(run(_p.parse_args()))

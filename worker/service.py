"""The worker service: one endpoint's model on the endpoint's batch topic.

A worker is a member of the consumer group ``<prefix>worker.<endpoint>`` on
``batches.<endpoint>``. Kafka decides which partitions it owns; the worker
tells the scheduler (``hello`` on every assignment, a ``heartbeat`` every
``service.heartbeat_ms``, ``batch_done`` after each batch, ``bye`` on
shutdown), and the scheduler writes a batch to one of its partitions only
when it has a free slot (see ``docs/protocol.md``). The worker itself never
takes more than ``slots`` batches at a time: one computing, the rest ready
so the model never idles between batches. The model makes one call at a
time, in the order the calls ask for it (the scheduler's order, batch by
batch); between its calls the event loop prepares the next batch and writes
the last one's results, so neither costs the model time.

For each batch (:mod:`worker.execute` does the model part): results are
published micro-batch by micro-batch to each request's ``reply_to``, keyed
by request id, in the request's ``reply_format`` (several to a record for
the senders that asked, :mod:`worker.replies`); once every result is
acknowledged, ``batch_done`` reports per-request timings (fed to the
scheduler's adaptive cost) and the batch's offset is committed. A request
with bad input fails alone. A record that is not a batch at all goes to the
dead-letter topic, its offset is committed, and the worker moves on.

The model runs in a thread, so heartbeats keep flowing during a long batch
and the scheduler does not mistake a busy worker for a dead one.

Stop (SIGTERM/SIGINT): stop taking batches, finish those in hand, send
``bye``, commit, leave the group, log the totals (``worker_stopped``).

Logs: one line per outcome, with ``batch_id`` (and ``request_id``, ``org``
for a request) bound through contextvars: ``batch_served`` per batch,
``request_served`` (debug), ``request_failed``, ``request_invalid`` and
``request_expired`` per request once its result is acknowledged. Lines past
``log_lines_per_s`` in a second go to debug; ``worker_totals`` sums them
up every ``totals_log_interval_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import os
import socket
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import msgspec
import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from prometheus_client import CollectorRegistry

from plumbing.bounded import within
from plumbing.deadletter import send_dead_letter
from plumbing.histogram import observe_all
from plumbing.kafka import (
    KafkaSettings,
    add_kafka_arguments,
    close_clients,
    consumer_lag,
    in_group,
    make_consumer,
    make_producer,
)
from plumbing.kafka import settings_from_args as kafka_settings_from_args
from plumbing.labels import cached_labels
from plumbing.logs import LogSampler, configure_logging, debug_enabled
from plumbing.offsets import OffsetTracker
from plumbing.outbox import Outbox, Written
from plumbing.rebalance import Rebalance
from plumbing.service import Service, serve
from plumbing.service_settings import WorkerSettings
from plumbing.settings import SettingsError
from plumbing.settings import add_arguments as add_settings_arguments
from plumbing.settings import from_args as settings_from_args
from plumbing.topickeeper import TopicKeeper
from plumbing.topics import ensure_topics
from schemas.codec import DecodeError, codec_for, content_type
from schemas.config import Config, ConfigError, load_config
from schemas.messages import Batch, BatchTiming, WorkerEvent
from schemas.topics import Topics
from worker.answered import AnsweredIds
from worker.credit_return import release_delay_s
from worker.execute import BatchExecutor, MicrobatchStats, Served
from worker.metrics import WorkerMetrics
from worker.model_thread import ModelThread
from worker.replies import Reply, replies

__all__ = ["WorkerService", "WorkerSettings", "WorkerStats", "add_arguments", "in_thread",
           "load_model", "run"]

log = structlog.get_logger("worker")

_batch_codec = codec_for(Batch)
_event_codec = codec_for(WorkerEvent)
_MSGPACK_HEADERS = [("content-type", content_type("msgpack").encode())]



def warm_up(model, kind: str) -> None:
    """Run the model on a few batch shapes (1..32 texts of 8..128 words)."""
    for n, words in ((1, 8), (8, 16), (32, 16), (4, 128)):
        texts = [" ".join(["warm"] * words)] * n
        if kind == "embed":
            model.encode(texts)
        else:
            model.score("warm", texts)


@dataclass
class WorkerStats:
    """What this worker saw, for tests and the stop log."""

    batches: int = 0
    requests: int = 0
    dead_letters: int = 0
    #: Most batches in hand at once that counted against the slots (a batch
    #: whose last micro-batch started has returned its credit and no longer
    #: counts; so a worker may hold ``slots`` + the ones finishing).
    max_in_hand: int = 0
    #: Most batches sent to this worker and counting against its slots at
    #: once: those in hand plus those waiting on its partitions. Flow
    #: control keeps it <= slots.
    max_backlog: int = 0
    #: Results acknowledged by the broker, by status.
    results: Counter = field(default_factory=Counter)

    def totals(self) -> dict:
        return {"batches": self.batches, "requests": self.requests,
                "dead_letters": self.dead_letters, "results": dict(self.results)}


def in_thread(threads: int | None) -> ModelThread:
    """The model's thread (:mod:`worker.model_thread`), with torch's intra-op threads set in it.

    torch keeps that count per thread: ``torch.set_num_threads`` in the event
    loop's thread does not reach another thread that had already run torch
    (a pool thread that loaded the model kept torch's default, one thread
    per core, and later ran batches with it: a worker given one thread used
    two cores here, sixteen on a 16-core machine). Every model call, the
    load and the warm-up included, runs in this one thread.
    """
    return ModelThread(functools.partial(_torch_threads, threads) if threads else None)


def _torch_threads(n: int) -> None:
    with contextlib.suppress(ImportError):
        import torch

        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


def load_model(config: Config, endpoint: str, spec: str | None = None, device: str | None = None):
    """The endpoint's model: an embedder, or a reranker by ``rerank_method``."""
    from worker.models import load_embedder, load_reranker

    ep = config.endpoints[endpoint]
    spec = spec or ep.model
    if ep.kind == "embed":
        return load_embedder(spec, device=device)
    return load_reranker(spec, kind=ep.rerank_method, device=device)


class WorkerService(Service):
    """A worker: ``async with WorkerService(config, kafka, settings) as w: await w.run()``."""

    name = "worker"

    def __init__(self, config: Config, kafka: KafkaSettings, settings: WorkerSettings, *,
                 registry: CollectorRegistry | None = None, model=None):
        self.check(config, settings)
        super().__init__(config, kafka, settings, registry=registry,
                         stop_grace_s=settings.drain_s + 5)
        self.endpoint = settings.endpoint
        self.kind = config.endpoints[self.endpoint].kind
        self.slots = settings.slots or config.service.worker_slots
        self.worker_id = settings.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        self.topics = Topics.of(config)
        self.batch_topic = self.topics.batches(self.endpoint)
        self.metrics = WorkerMetrics(self.registry)
        results, latency = (cached_labels(self.metrics.results),
                            cached_labels(self.metrics.latency))
        self._results_counter = lambda status: results(settings.endpoint, status)
        self._latency = lambda tier: latency(settings.endpoint, tier)
        self.stats = WorkerStats()
        self.model = model
        self.executor: BatchExecutor | None = None
        self._model_thread: ModelThread | None = None
        self.offsets = OffsetTracker()
        self._in_hand: dict[str, asyncio.Task] = {}  # batch id -> its task
        self._in_hand_tp: dict[str, TopicPartition] = {}
        #: Batches in hand whose last micro-batch started: their credit is returned.
        self._released: set[str] = set()
        #: batch id -> when it was taken off its partition (monotonic s, and epoch ms).
        self._taken_s: dict[str, float] = {}
        self._taken_ms: dict[str, int] = {}
        #: Newest scheduler epoch seen per batch partition (fencing, see _fenced).
        self._epochs: dict[TopicPartition, int] = {}
        #: Request ids answered recently: a batch that brings one back skips it.
        self.answered = AnsweredIds(settings.answered_window_s, settings.answered_max_ids)
        self._freed = asyncio.Event()
        self._partitions: list[int] = []
        self._producer = None
        #: Worker events on a connection of their own: aiokafka keeps one produce
        #: request in flight per connection, and the credit a worker returns must
        #: not wait behind its results (it did: three round trips per batch).
        self._events_producer = None
        self._outbox: Outbox | None = None
        self._consumer = None
        self._keeper: TopicKeeper | None = None
        self._sampler = LogSampler(settings.log_lines_per_s)
        self._tiers = frozenset(config.tier_names)
        #: abort(): die as a crashed process would (no bye, no commit).
        self._aborting = False

    @staticmethod
    def check(config: Config, settings: WorkerSettings) -> None:
        """ConfigError when ``settings.endpoint`` is not an endpoint of ``config``."""
        if settings.endpoint not in config.endpoints:
            known = ", ".join(config.endpoints)
            raise ConfigError([f"--endpoint {settings.endpoint!r} is not configured ({known})"])

    # -- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        """Load the model, connect, join the endpoint's group."""
        s = self.settings
        self._model_thread = run_in_thread = in_thread(s.threads)
        if s.threads:
            _torch_threads(s.threads)
        if self.model is None:
            t0 = time.perf_counter()
            self.model = await run_in_thread(load_model, self.config, self.endpoint,
                                             s.model, s.device)
            log.info("model_loaded", endpoint=self.endpoint, model=self.model.name,
                     seconds=round(time.perf_counter() - t0, 2))
        if s.warm_up:
            t0 = time.perf_counter()
            await run_in_thread(warm_up, self.model, self.kind)
            log.info("model_warmed_up", endpoint=self.endpoint,
                     seconds=round(time.perf_counter() - t0, 2))
        self.executor = BatchExecutor(
            self.model, self.kind, worker=self.worker_id,
            max_padded_tokens=s.microbatch_tokens, max_size=s.microbatch_size,
            call_tokens=s.microbatch_call_tokens,
            on_microbatch=self._microbatch_done, model_thread=run_in_thread,
            on_release=self._release)
        created = await ensure_topics(self.kafka, self.topics.all(self.config))
        self._producer = make_producer(self.kafka, linger_ms=0)
        await self._producer.start()
        self._events_producer = make_producer(self.kafka, linger_ms=0,
                                              client_id=f"{self.kafka.client_id}-events")
        await self._events_producer.start()
        # Results are read whole by their reader: partitions in turn, no hash per request id.
        self._outbox = Outbox(self._producer, hash_keys=False)
        self._consumer = make_consumer(self.kafka, group_id=f"{self.topics.prefix}worker."
                                       f"{self.endpoint}", max_poll_records=self.slots)
        self._consumer.subscribe([self.batch_topic], listener=Rebalance(
            on_revoked=self._on_revoked, on_assigned=self._on_assigned))
        await self._consumer.start()
        self.watch_broker(self._producer.client, self.batch_topic, self.metrics.broker_reachable)
        # Recreates the topics if the broker lost them; the group rejoins by itself.
        keeper = TopicKeeper(self.kafka, self._producer.client,
                             lambda: self.topics.all(self.config), service="worker",
                             follow=lambda: [self._consumer])
        keeper.known(created)
        self._keeper = self.keep(keeper)
        log.info("worker_started", worker=self.worker_id, endpoint=self.endpoint,
                 slots=self.slots, model=self.model.name)

    async def main(self) -> None:
        """Take batches until a stop is requested; then finish the ones in hand."""
        fetch = asyncio.create_task(self._fetch_loop(), name="worker-fetch")
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait([fetch, stop], return_when=asyncio.FIRST_COMPLETED)
            if fetch.done() and not fetch.cancelled() and fetch.exception() is not None:
                raise fetch.exception()
        finally:
            stop.cancel()
            await self._cancel([fetch])  # take nothing more
            if self._in_hand:
                await asyncio.wait(list(self._in_hand.values()), timeout=self.settings.drain_s)

    def tasks(self) -> list:
        # Heartbeats go on while the batches in hand finish (main), so the
        # scheduler does not take a draining worker for a dead one.
        return [self._heartbeat_loop()]

    async def close(self) -> None:
        """Say bye, commit what is done, leave the group, disconnect."""
        if not self._aborting:
            with contextlib.suppress(KafkaError):
                await self._announce("bye", partitions=[], slots=0)
            with contextlib.suppress(KafkaError):
                await self._commit()
        await close_clients(self._consumer, self._producer, self._events_producer)
        self._consumer = self._producer = self._events_producer = None
        if self._model_thread is not None:
            self._model_thread.close()

    async def abort(self) -> None:
        """Die as a crashed process would: no bye, no commit (for failure tests)."""
        self._aborting = True
        await self._cancel(list(self._in_hand.values()))
        self._in_hand.clear()
        await self.stop()

    def totals_fields(self) -> dict:
        return {"worker": self.worker_id, "endpoint": self.endpoint, **self.stats.totals(),
                "log_lines_suppressed": self._sampler.suppressed}

    def ready(self) -> tuple[bool, str]:
        if self.model is None:
            return False, "model not loaded"
        if not self._partitions:
            return False, "no batch partition assigned"
        return True, f"ok: partitions {self._partitions}, {len(self._in_hand)} batches in hand"

    # -- group membership and events --------------------------------------------

    async def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        self._partitions = sorted(tp.partition for tp in assigned if tp.topic == self.batch_topic)
        log.info("partitions_assigned", worker=self.worker_id, partitions=self._partitions)
        try:
            await self._announce("hello")
        except KafkaError as e:
            log.warning("event_send_failed", kind="hello", error=repr(e))

    async def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        gone = set(revoked)
        waiting = [t for b, t in self._in_hand.items() if self._in_hand_tp.get(b) in gone]
        if waiting:
            await asyncio.wait(waiting, timeout=self.settings.revoke_wait_s)
        # Bounded: after a broker restart a commit is retried while the topic
        # is missing, and the rebalance would wait with it.
        with contextlib.suppress(KafkaError, TimeoutError):
            await within(self._commit(only=gone), self.settings.revoke_wait_s)
        for tp in gone:
            self.offsets.forget(tp)
            self._epochs.pop(tp, None)
        self._partitions = [p for p in self._partitions
                            if TopicPartition(self.batch_topic, p) not in gone]

    async def _announce(self, kind: str, *, partitions: list[int] | None = None,
                        slots: int | None = None, **fields) -> None:
        slots = self.slots if slots is None else slots
        ev = WorkerEvent(
            worker=self.worker_id, endpoint=self.endpoint, kind=kind,
            partitions=self._partitions if partitions is None else partitions,
            slots=slots, free_slots=max(0, slots - self._holding()),
            sent_ms=int(time.time() * 1000), in_flight=list(self._in_hand),
            released=[b for b in self._in_hand if b in self._released], **fields)
        md = await self._events_producer.send_and_wait(self.topics.worker_events,
                                                _event_codec.encode(ev),
                                                key=self.worker_id.encode(),
                                                headers=_MSGPACK_HEADERS)
        if self._keeper is not None:
            self._keeper.wrote(md.topic_partition, md.offset)

    async def _heartbeat_loop(self) -> None:
        every = self.config.service.heartbeat_ms / 1000
        while True:
            await asyncio.sleep(every)
            try:
                await self._announce("heartbeat")
            except KafkaError as e:
                log.warning("event_send_failed", kind="heartbeat", error=repr(e))
            await self._update_lag()

    async def _update_lag(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        tps = [TopicPartition(self.batch_topic, p) for p in self._partitions]
        lag = await consumer_lag(consumer, tps)
        self.metrics.lag.labels(self.endpoint).set(sum(lag.values()))

    # -- batches ---------------------------------------------------------------

    def _holding(self) -> int:
        """Batches in hand that still count against ``slots`` (credit not returned)."""
        return len(self._in_hand) - len(self._released)

    def _release(self, batch: Batch, expect_s: float | None = None) -> None:
        """``batch`` starts the call its credit is due at, ``expect_s`` before its end:
        return its credit a round trip before that end (:mod:`worker.credit_return`)."""
        delay = release_delay_s(expect_s, batch.round_trip_ms)
        if delay > 0:
            self.spawn(self._release_after(batch, delay), "released_event_send")
            return
        self._release_now(batch)

    async def _release_after(self, batch: Batch, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self._release_now(batch)

    def _release_now(self, batch: Batch) -> None:
        # A batch finished meanwhile has already said so with its batch_done.
        if batch.id not in self._in_hand or batch.id in self._released:
            return
        self._released.add(batch.id)
        self._freed.set()
        self.spawn(self._announce("heartbeat"), "released_event_send")

    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        while True:
            free = self.slots - self._holding()
            if free <= 0:
                self._freed.clear()
                await self._freed.wait()
                continue
            got = await consumer.getmany(timeout_ms=1000, max_records=free)
            for tp, records in got.items():
                for rec in records:
                    await self._take(tp, rec)

    async def _take(self, tp: TopicPartition, rec) -> None:
        self.offsets.hold(tp, rec.offset)
        try:
            batch = _batch_codec.decode_record(rec.value, rec.headers,
                                               max_bytes=self.kafka.max_request_size)
        except DecodeError as e:
            await self._poisoned(tp, rec, e)
            return
        if batch.id in self._in_hand:
            # Read again (a rebalance gave the partition back) while still
            # being served: the copy in hand answers it and holds the offset.
            self.offsets.release(tp, rec.offset)
            return
        newest = self._epochs.get(tp, 0)
        if batch.fence:
            await self._fence(tp, rec, batch, newest)
            return
        if batch.epoch < newest:
            await self._fenced(tp, rec, batch, newest)
            return
        self._epochs[tp] = batch.epoch
        batch = self._unanswered(batch)
        if not batch.requests:
            await self._all_answered(tp, rec, batch)
            return
        self._taken_s[batch.id] = time.monotonic()
        self._taken_ms[batch.id] = int(time.time() * 1000)
        self._in_hand[batch.id] = asyncio.create_task(self._serve(tp, rec.offset, batch),
                                                      name=f"batch-{batch.id}")
        self._in_hand_tp[batch.id] = tp
        self._measure_backlog()

    def _unanswered(self, batch: Batch) -> Batch:
        """``batch`` without the requests this worker answered within the window."""
        now = time.monotonic()
        fresh = [r for r in batch.requests if not self.answered.seen(r.id, now)]
        if len(fresh) == len(batch.requests):
            return batch
        n = len(batch.requests) - len(fresh)
        self.metrics.duplicates.labels(self.endpoint).inc(n)
        log.warning("requests_already_answered", batch_id=batch.id, epoch=batch.epoch,
                    requests=n, left=len(fresh))
        return msgspec.structs.replace(batch, requests=fresh)

    async def _all_answered(self, tp: TopicPartition, rec, batch: Batch) -> None:
        """Every request of ``batch`` was answered already: done at once, nothing run."""
        self.offsets.release(tp, rec.offset)
        with contextlib.suppress(KafkaError):
            await self._commit(only={tp})
            await self._announce("batch_done", batch_id=batch.id, batch_requests=0)

    async def _fence(self, tp: TopicPartition, rec, batch: Batch, newest: int) -> None:
        """A new leader's fence: from here on this partition, an older epoch is refused.

        Announced at once (a heartbeat): the new leader waits for an event of
        each worker sent after its takeover before it sends to it, and this
        one comes after every batch of the old leader's before the fence.
        """
        if batch.epoch > newest:
            self._epochs[tp] = batch.epoch
            log.info("fence_read", epoch=batch.epoch, previous_epoch=newest,
                     partition=rec.partition, offset=rec.offset)
            self.spawn(self._announce("heartbeat"), "fence_event_send")
        self.offsets.release(tp, rec.offset)
        with contextlib.suppress(KafkaError):
            await self._commit(only={tp})

    async def _fenced(self, tp: TopicPartition, rec, batch: Batch, newest: int) -> None:
        """Skip a deposed scheduler's batch written after its successor's on this partition.

        A new leader writes a fence to every batch partition before its
        first batch (:mod:`scheduler.takeover`), and replays every request
        of its predecessor's not in a batch before the fence: an older
        epoch's batch behind a newer one comes from a deposed leader (one
        that was paused, and sent what its producer still held when it woke
        up), and serving it would serve its requests twice.
        """
        self.metrics.failures.labels(self.endpoint, "stale_epoch").inc()
        log.warning("batch_fenced", batch_id=batch.id, epoch=batch.epoch, newest_epoch=newest,
                    partition=rec.partition, offset=rec.offset, requests=len(batch.requests))
        self.offsets.release(tp, rec.offset)
        with contextlib.suppress(KafkaError):
            await self._commit(only={tp})

    async def _poisoned(self, tp: TopicPartition, rec, e: DecodeError) -> None:
        self.stats.dead_letters += 1
        self.metrics.failures.labels(self.endpoint, "bad_batch").inc()
        log.warning("batch_invalid", topic=rec.topic, partition=rec.partition, offset=rec.offset,
                    reason=e.reason, error=str(e)[:300])
        try:
            await send_dead_letter(self._producer, self.topics.dead_letters, rec, e.reason, str(e))
        except KafkaError as err:
            log.error("dead_letter_failed", error=repr(err))
            return  # stays held: not committed past, a restart retries it
        self.offsets.release(tp, rec.offset)
        with contextlib.suppress(KafkaError):
            await self._commit(only={tp})

    def _measure_backlog(self) -> None:
        n = self._holding()
        self.stats.max_in_hand = max(self.stats.max_in_hand, n)
        self.metrics.in_hand.labels(self.endpoint).set(len(self._in_hand))
        waiting = 0
        for p in self._partitions:
            tp = TopicPartition(self.batch_topic, p)
            high, pos = self._consumer.highwater(tp), self.offsets.position(tp)
            if high is not None and pos is not None:
                waiting += max(0, high - pos)
        self.stats.max_backlog = max(self.stats.max_backlog, n + waiting)

    async def _serve(self, tp: TopicPartition, offset: int, batch: Batch) -> None:
        # Its own task, so the ids bound here reach every line of this batch
        # (and the callbacks of its sends), and no other batch's.
        with structlog.contextvars.bound_contextvars(batch_id=batch.id, worker=self.worker_id,
                                                     endpoint=self.endpoint):
            await self._serve_bound(tp, offset, batch)

    async def _serve_bound(self, tp: TopicPartition, offset: int, batch: Batch) -> None:
        t0 = time.perf_counter()
        written: list[tuple[list[Reply], Written]] = []
        served: list[Served] = []
        ok: list[Served] = []
        results_ok = False
        service_s = 0.0
        try:
            # The executor takes the model call by call, so batches in hand
            # overlap: this one's results are written while the next one's
            # call runs.
            taken = self._taken_ms.get(batch.id)
            async for done in self.executor.serve(batch):
                # One write per micro-batch: its results leave together.
                for s in done:
                    s.result.taken_ms = taken
                records = self._publish(done)
                written.append((records, await self._outbox.submit()))
                served.extend(done)
            # Its service time: the seconds it had the model (not its waits
            # for another batch's calls), what flow control's rate is made of.
            service_s = sum(s.seconds for s in served)
            results_ok = await self._await_sends(written)
            ok = [s for s in served if s.result.status == "ok"]
            taken = self._taken_s.get(batch.id)
            held_ms = (time.monotonic() - taken) * 1000 if taken is not None else 0.0
            # Out of hand before announcing: a heartbeat sent meanwhile must
            # not list it again after its batch_done.
            self._forget(batch.id)
            with contextlib.suppress(KafkaError):
                await self._announce_done(batch, ok, service_s,
                                          service_ms=service_s * 1000, held_ms=held_ms)
        except Exception as e:  # noqa: BLE001 - a batch must never take the worker down
            # Left uncommitted: the next owner of the partition serves it again.
            self.metrics.failures.labels(self.endpoint, "batch_error").inc()
            log.error("batch_failed", requests=len(batch.requests), error=repr(e))
        finally:
            self._forget(batch.id)
            self._in_hand_tp.pop(batch.id, None)
            self.metrics.in_hand.labels(self.endpoint).set(len(self._in_hand))
            self._freed.set()
        if results_ok:
            self.offsets.release(tp, offset)
            with contextlib.suppress(KafkaError):
                await self._commit(only={tp})
        self.stats.batches += 1
        self.stats.requests += len(served)
        self.metrics.batches.labels(self.endpoint).inc()
        self.metrics.batch_seconds.labels(self.endpoint).observe(time.perf_counter() - t0)
        self._sampler.log(log, "info", "batch_served", time.time() * 1000,
                          requests=len(served), ok=len(ok), tokens=batch.tokens,
                          orgs=sorted({s.request.org for s in served})[:10],
                          model_ms=round(sum(s.seconds for s in served) * 1000, 2),
                          seconds=round(time.perf_counter() - t0, 4), committed=results_ok)

    def _forget(self, batch_id: str) -> None:
        self._in_hand.pop(batch_id, None)
        self._released.discard(batch_id)
        self._taken_s.pop(batch_id, None)
        self._taken_ms.pop(batch_id, None)

    def _results_written(self, written: list[Served], now: float) -> None:
        """Results acknowledged: count them, time them, log each outcome (once, here).

        Per write, not per result: one counter step per status, the debug
        check once.
        """
        self.answered.add((s.request.id for s in written), time.monotonic())
        by_status = collections.Counter(s.result.status for s in written)
        for status, n in by_status.items():
            self._results_counter(status).inc(n)
            self.stats.results[status] += n
        debug = debug_enabled()
        latencies: dict[str, list[float]] = {}
        for s in written:
            req, status = s.request, s.result.status
            if status == "ok":
                tier = req.tier if req.tier in self._tiers else "unknown"
                lat = latencies.get(tier)
                if lat is None:
                    lat = latencies[tier] = []
                lat.append(max(0.0, now - req.admitted_ms / 1000))
                if debug:
                    log.debug("request_served", request_id=req.id, org=req.org, tier=req.tier,
                              tokens=req.tokens, inference_ms=s.result.inference_ms)
                continue
            level = "info" if status == "expired" else "warning"
            self._sampler.log(log, level, f"request_{status}", now * 1000, request_id=req.id,
                              org=req.org, tier=req.tier, reason=s.result.reason,
                              message=(s.result.message or "")[:300])
        for tier, lat in latencies.items():
            observe_all(self._latency(tier), lat)

    def _publish(self, done: list[Served]) -> list[Reply]:
        """Queue the records of one micro-batch's results (:mod:`worker.replies`): one
        per result, or packs for the senders that asked."""
        records = replies(done, self.config.service.max_message_bytes)
        for r in records:
            self._outbox.add(r.topic, r.value, key=r.key, headers=r.headers)
        return records

    async def _await_sends(self, written: list[tuple[list[Reply], Written]]) -> bool:
        """Wait for every result of the batch; count and log each acknowledged one.

        A record's outcome is each of its results' outcome: a pack
        acknowledged counts every result in it, a pack refused fails each.
        """
        failed: list[BaseException] = []
        for records, w in written:
            outcomes = await w.outcomes()
            written_ok: list[Served] = []
            for r, error in zip(records, outcomes, strict=True):
                if error is None:
                    written_ok.extend(r.members)
                else:
                    failed.extend([error] * len(r.members))
            self._results_written(written_ok, time.time())
        if failed:
            # The offset stays uncommitted: a restart (or the next owner) serves it again.
            self.metrics.failures.labels(self.endpoint, "result_send").inc(len(failed))
            log.error("results_unsent", failed=len(failed), error=repr(failed[0]))
        return not failed

    async def _announce_done(self, batch: Batch, ok: list[Served], model_s: float, *,
                             service_ms: float, held_ms: float) -> None:
        timings = [BatchTiming(org=s.request.org, tokens=s.request.tokens, seconds=s.seconds)
                   for s in ok if s.seconds > 0]
        await self._announce("batch_done", batch_id=batch.id, batch_requests=len(batch.requests),
                             batch_tokens=sum(s.request.tokens for s in ok),
                             inference_ms=round(model_s * 1000, 3),
                             service_ms=round(service_ms, 3), held_ms=round(held_ms, 3),
                             timings=timings)

    def _microbatch_done(self, s: MicrobatchStats) -> None:
        m = self.metrics
        m.inference.labels(self.endpoint).observe(s.seconds)
        if s.seconds > 0:
            m.tokens_per_s.labels(self.endpoint).set(s.tokens / s.seconds)
        if s.tokens > 0:
            m.padding.labels(self.endpoint).observe(s.padded / s.tokens)
        if s.joined:
            m.joined_calls.labels(self.endpoint).inc()
        if self.executor is not None:
            m.call_tokens.labels(self.endpoint).set(self.executor.call_tokens())

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        consumer = self._consumer
        if consumer is None or not in_group(consumer):
            return
        assigned = consumer.assignment()
        offsets = {tp: off for tp, off in self.offsets.to_commit().items()
                   if tp in assigned and (only is None or tp in only)}
        if offsets:
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
            self.offsets.committed(offsets)


# -- command line --------------------------------------------------------------


#: Environment variables of the worker settings: SF_WORKER_<FIELD>.
ENV_PREFIX = "SF_WORKER_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness worker``: the settings' own, then Kafka's."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    add_settings_arguments(parser.add_argument_group(
        "worker", "flags override the SF_WORKER_* environment"), WorkerSettings,
        env_prefix=ENV_PREFIX)
    add_kafka_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run one worker until SIGTERM/SIGINT (a SIGHUP is logged: a worker does not reload)."""
    configure_logging()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        config = load_config(args.config)
        settings = settings_from_args(WorkerSettings, args, env_prefix=ENV_PREFIX)
        WorkerService.check(config, settings)
    except (ConfigError, SettingsError) as e:
        log.error("config_refused", path=args.config, error=str(e))
        return 2
    return asyncio.run(serve(lambda k: WorkerService(config, k, settings),
                             kafka_settings_from_args(args)))

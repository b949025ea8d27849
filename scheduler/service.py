"""The scheduler service: the pure core (:mod:`scheduler.core`) on Kafka.

It reads every ``requests.<tier>`` topic (group ``<prefix>scheduler``,
manual commits) and holds the admitted requests in the core; it reads the
workers' events (no group: every scheduler instance needs all of them) and
keeps the slot registry (:mod:`scheduler.flow`); and whenever a worker has a
free slot and a lane holds work, it asks the core for the next batch and
writes it to a partition that worker owns. The fairness decision is made
the moment a GPU can take the batch, never earlier (see ``docs/protocol.md``).

Tasks, all on one event loop, sharing state without locks (no await between
reading and changing it):

* one **intake** task per consumer decodes records, updates the core
  (tier topics, :mod:`scheduler.intake`) or the slot registry (worker
  events) at once, and sets a wake-up event;
* the **dispatch** loop waits on that event or on the next timer (the
  earliest deadline of a held request, a worker timeout, the state
  snapshot), then expires, dispatches and publishes. It reacts to a worker
  event within the fetch latency plus microseconds;
* the **commit** loop commits tier offsets up to the oldest held request;
  a batch or an ``expired`` result counts as done only once the broker
  acknowledged it.

Bad records, backpressure and offsets are the intake's (see there).

Active and standby (:mod:`scheduler.leader`): every instance reads the
worker events and the leader partition; the leader beats there, and a
standby that hears nothing from it for ``leader_silence_ms`` claims the
next epoch. The winner takes over (:mod:`scheduler.takeover`: the
predecessor's tier positions, fences on every batch partition, the ids the
predecessor already wrote in batches, which it does not dispatch again),
reads the tier topics and dispatches, stamping its epoch on batches and
snapshots. On losing leadership it stops dispatching at once and hands
back every held request (the new leader replays them from the committed
offsets). A new leader uses a worker only once it heard from it after the
takeover (:meth:`scheduler.flow.FlowControl.takeover`; a worker announces
itself when it reads the fence), so the old leader's batches still waiting
on a worker's partition are not over-sent.

Stop (SIGTERM/SIGINT): stop fetching, let acknowledged work commit, commit
nothing still held (a restart replays it), log totals. SIGHUP, or a change
of the file's modification time (``config_poll_ms``), reloads the
configuration file; an invalid one is refused and the old one stays.

Logs: ``batch_emitted`` (``batch_id`` bound) and ``request_expired``
(``request_id``, ``org`` bound), at most ``log_lines_per_s`` a second at
info, the rest at debug; ``scheduler_totals`` every
``totals_log_interval_s`` and ``scheduler_stopped`` sum them up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry
from structlog.contextvars import bound_contextvars

from plumbing.bounded import cancel_within, within
from plumbing.histogram import observe_all
from plumbing.kafka import (
    KafkaSettings,
    add_kafka_arguments,
    close_clients,
    consumer_lag,
    make_admin,
    make_consumer,
    make_producer,
)
from plumbing.kafka import settings_from_args as kafka_settings_from_args
from plumbing.logs import LogSampler, configure_logging
from plumbing.service import Service, serve
from plumbing.service_settings import SchedulerSettings
from plumbing.settings import SettingsError
from plumbing.settings import add_arguments as add_settings_arguments
from plumbing.settings import from_args as settings_from_args
from plumbing.state_follower import StateFollower
from plumbing.topickeeper import TopicKeeper
from plumbing.topics import ensure_topics
from scheduler.core import Scheduler
from scheduler.dispatch import Dispatcher, Outgoing
from scheduler.entry import Entry
from scheduler.expiry import expire
from scheduler.fairness_metrics import LiveFairness
from scheduler.flow import FlowControl, LostWorker
from scheduler.handover import CostHandover
from scheduler.intake import TierIntake, send_result
from scheduler.leader import LeaderElection
from scheduler.metrics import SchedulerMetrics
from scheduler.publish import snapshot
from scheduler.snapshot import Backlog, ServiceRate, half_batch
from scheduler.takeover import (
    batch_reader,
    copy_positions,
    dispatched_before,
    group_of,
    partitions_of,
    tier_positions,
    write_fences,
)
from schemas.codec import DecodeError, codec_for, content_type
from schemas.config import Config, ConfigError, load_config
from schemas.messages import AdmittedRequest, Batch, Result, SchedulerState, WorkerEvent
from schemas.topics import Topics

__all__ = ["SchedulerService", "SchedulerSettings", "add_arguments", "run"]

log = structlog.get_logger("scheduler")

_batch_codec = codec_for(Batch)
_event_codec = codec_for(WorkerEvent)
_state_codec = codec_for(SchedulerState)
_MSGPACK_HEADERS = [("content-type", content_type("msgpack").encode())]
#: A takeover that knows no floor of its predecessor's reads the batch topics this far back.
_FALLBACK_LOOKBACK_MS = 60_000
#: Wall clocks of the schedulers are assumed to agree within this much (docs/reliability.md):
#: a takeover reads the batch topics from this far before the predecessor's floor.
_CLOCK_MARGIN_MS = 2_000
#: Longest a takeover reads the batch topics for what was dispatched.
_TAKEOVER_READ_S = 10.0


def _full_batches(config: Config) -> dict[str, int]:
    """A full batch's tokens per endpoint, for flow control's estimates."""
    return {name: ep.max_batch_tokens for name, ep in config.endpoints.items()}


class SchedulerService(Service):
    """The fair scheduler on Kafka: ``async with SchedulerService(...) as s: await s.run()``."""

    name = "scheduler"

    def __init__(self, config: Config, kafka: KafkaSettings, *,
                 settings: SchedulerSettings | None = None,
                 registry: CollectorRegistry | None = None):
        s = settings or SchedulerSettings()
        super().__init__(config, kafka, s, registry=registry, config_path=s.config_path,
                         config_poll_ms=s.config_poll_ms, stop_grace_s=5.0)
        self.topics = Topics.of(config)
        self.metrics = SchedulerMetrics(self.registry, config)
        self.fairness = LiveFairness(self.registry, config)
        self.handover = CostHandover()
        self._state_follower: StateFollower | None = None
        self.core = Scheduler(config, self.settings.policy)
        self.flow = FlowControl(config.service.worker_timeout_ms,
                                mode=config.service.flow_control,
                                max_outstanding_ms=config.service.max_outstanding_ms,
                                full_batch_tokens=_full_batches(config))
        self.backlog = Backlog()
        self.rates = ServiceRate()
        self.instance = uuid.uuid4().hex[:8]
        self._wake = asyncio.Event()
        self._pending: set[asyncio.Future] = set()
        self._producer = None
        #: Batches on a connection of their own: aiokafka keeps one produce
        #: request in flight per connection, and a batch must not wait behind
        #: snapshots and results.
        self._batch_producer = None
        self._event_consumer = None
        self._admin = None
        self._batch_reader = None
        self._sampler = LogSampler(self.settings.log_lines_per_s)
        self._rounds: dict[str, int] = {}
        self._next_state_s = 0.0
        self._handed_back = 0
        #: Dispatch only while True: set by the election, cleared on any doubt.
        self.leading = False
        self.epoch = 0
        self.election: LeaderElection | None = None
        self._keeper: TopicKeeper | None = None
        self._intake_task: asyncio.Task | None = None
        self._failure: BaseException | None = None
        self.dispatcher = Dispatcher(self.core, self.flow, self.backlog, instance=self.instance,
                                     watch=self.fairness, express=self.settings.express_batches,
                                     express_fill=self.settings.express_fill,
                                     express_horizon=self.settings.express_horizon)
        self.totals = {"received": 0, "dispatched": 0, "batches": 0, "express_batches": 0,
                       "expired": 0, "invalid": 0, "duplicates": 0,
                       "taken_over_dispatched": 0}
        self.intake = TierIntake(config, self.topics, self.core, self.backlog, self.metrics,
                                 self.totals, self._wake,
                                 max_poll_records=self.settings.max_poll_records)

    # -- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        """Create the topics, connect, join the leader group and read recent worker events."""
        cfg = self.config
        created = await ensure_topics(self.kafka, self.topics.all(cfg))
        self._producer = make_producer(self.kafka, linger_ms=self.settings.linger_ms)
        await self._producer.start()
        self._batch_producer = make_producer(self.kafka, linger_ms=self.settings.linger_ms,
                                             client_id=f"{self.kafka.client_id}-batches")
        await self._batch_producer.start()
        self.election = LeaderElection(
            self.kafka, self.topics.scheduler_leader, self.instance, self._producer,
            on_elected=self._on_elected, on_deposed=self._on_deposed,
            silence_ms=self.settings.leader_silence_ms, registry=self.registry)
        self.election.floor = self._floor
        self._event_consumer = make_consumer(self.kafka, group_id=None)
        await self._event_consumer.start()
        # Ready before any takeover: one costs no connection.
        self._admin = make_admin(self.kafka)
        await self._admin.start()
        self._batch_reader = batch_reader(self.kafka)
        await self._batch_reader.start()
        self._keeper = TopicKeeper(self.kafka, self._producer.client,
                                   lambda: self.topics.all(self.config), service="scheduler",
                                   on_lost=self._broker_lost, follow=self._followed)
        self._keeper.known(created)
        self._state_follower = await StateFollower(self.kafka, self.topics.scheduler_state,
                                                   self.handover.offer).start()
        await self._seek_recent_events()
        await self.election.start()
        self.keep(self._keeper)
        self.watch_broker(self._producer.client, self.topics.worker_events,
                          self.metrics.broker_reachable)
        self.log.info("scheduler_started", policy=self.settings.policy, instance=self.instance,
                      tiers=cfg.tier_names, endpoints=list(cfg.endpoints),
                      metrics_port=self._telemetry.port if self._telemetry else None)

    def tasks(self) -> list:
        return [self.election.run(), self._event_loop(), self._dispatch_loop(),
                self.intake.commit_loop(self.settings.commit_interval_ms / 1000),
                self._events_lag_loop()]

    async def run(self) -> None:
        """Serve until :meth:`request_stop`; an intake that died takes the service down."""
        await super().run()
        if self._failure is not None:
            raise self._failure

    async def close(self) -> None:
        """Let acknowledged work commit, hand back what is held, leave, disconnect.

        Held requests were not committed: they are handed back, and the next
        leader (or this one restarted) replays them.
        """
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=5)
        self.leading = False
        self._handed_back = await self._stop_intake()
        if self.election is not None:
            await self.election.stop()  # after the intake: the next leader replays from its commit
        if self._state_follower is not None:
            await self._state_follower.stop()
        await close_clients(self._event_consumer, self._batch_reader, self._batch_producer,
                            self._producer)
        self._event_consumer = self._producer = self._batch_producer = self._batch_reader = None
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await within(self._admin.close(), 5)
            self._admin = None

    def ready(self) -> tuple[bool, str]:
        if not self.leading:
            state = self.election.state if self.election is not None else "starting"
            return False, (f"standby ({state}): waiting for leadership; "
                           f"{len(self.flow.workers)} workers known")
        if not self.intake.assigned:
            return False, f"leader (epoch {self.epoch}): no tier partition assigned yet"
        return True, (f"ok: leader epoch {self.epoch} instance {self.instance}, "
                      f"{len(self.intake.assigned)} tier partitions, {self.core.held} held")

    # -- leadership ------------------------------------------------------------

    def may_dispatch(self) -> bool:
        """Leading, and within the lease of a beat read back as valid."""
        return self.leading and self.election is not None and self.election.lease_valid()

    def _may_commit(self) -> bool:
        """Tier positions are committed only by a leader (or one taking over) in its lease:
        a deposed one that wakes up writes nothing (and only its own group if it did)."""
        e = self.election
        return (e is not None and e.state in ("leading", "taking_over")
                and e.log.leads(self.instance, e.epoch) and e.lease_valid())

    def _floor(self) -> int | None:
        """What this leader's beats say: see scheduler.intake (None before a takeover)."""
        return self.intake.commit_floor_ms

    async def _on_elected(self, epoch: int) -> None:
        """Newly leader: positions, fences, what was dispatched; then read tiers, dispatch.

        The order is :mod:`scheduler.takeover`'s: the predecessor's positions
        are read before the fences are written.
        """
        t0 = time.monotonic()
        el = self.election
        self.epoch = self.dispatcher.epoch = epoch
        pred = el.log.predecessor(epoch)
        now_ms = int(time.time() * 1000)
        floor = (pred.floor_ms if pred is not None and pred.floor_ms is not None
                 else now_ms - _FALLBACK_LOOKBACK_MS)
        since_ms = max(0, floor - _CLOCK_MARGIN_MS)
        self.intake.commit_floor_ms = since_ms  # what our beats say until our first commit
        tier_tps = await partitions_of(self._producer, self.intake.tier_topics(self.config))
        positions = await tier_positions(self._admin, self.topics.prefix, el.log.chain(epoch),
                                         tier_tps)
        t_positions = time.monotonic()
        await self.intake.start(self.kafka, self._producer,
                                group=group_of(self.topics.prefix, epoch), partitions=tier_tps,
                                positions=positions, skip=set(), floor_ms=since_ms,
                                may_commit=self._may_commit)
        await copy_positions(self.intake.consumer, positions)
        batch_topics = {self.topics.batches(ep): ep for ep in self.config.endpoints}
        batch_tps = await partitions_of(self._batch_producer, batch_topics)
        fences = await write_fences(self._batch_producer, batch_tps, epoch=epoch,
                                    instance=self.instance, endpoint_of=batch_topics)
        el.fenced_ms = int(time.time() * 1000)
        t_fences = time.monotonic()
        # A batch older than the predecessor's own fence on its partition was
        # refused by the workers; where that fence may lie before the window
        # read, count every batch of an older epoch as refused (a duplicate at
        # worst, never a request taken for served that was not).
        stale_below = (pred.epoch if pred is not None and (
            pred.fenced_ms is None or pred.fenced_ms < since_ms + _CLOCK_MARGIN_MS) else 0)
        seen = await dispatched_before(self._batch_reader, fences, since_ms=since_ms,
                                       stale_below=stale_below, timeout_s=_TAKEOVER_READ_S)
        self.intake.skip = seen.ids
        self.flow.takeover(time.time() * 1000)
        if (took := self.handover.take_over(self.core, epoch)) is not None:
            log.info("costs_taken_over", from_epoch=took.from_epoch, lanes=list(took.lanes),
                     snapshot_ms=took.snapshot_ms, replayed_reports=took.replayed)
        self._intake_task = asyncio.create_task(self.intake.run(), name="scheduler-tiers")
        self._intake_task.add_done_callback(self._intake_done)
        self.leading = True
        self._wake.set()
        log.warning("takeover_done", epoch=epoch, after=pred.epoch if pred else None,
                    seconds=round(time.monotonic() - t0, 3), positions=len(positions),
                    positions_s=round(t_positions - t0, 3), fences_s=round(t_fences - t0, 3),
                    fences=len(fences), since_ms=since_ms, batches_read=seen.batches,
                    stale_batches=seen.stale_batches, dispatched=len(seen.ids),
                    complete=seen.complete)

    async def _on_deposed(self) -> None:
        """Someone else leads: stop reading tiers, hand back everything held."""
        self.leading = False
        self.epoch = 0
        self.fairness.reset()
        handed = await self._stop_intake()
        log.warning("scheduler_standing_by", instance=self.instance, handed_back=handed)

    async def _stop_intake(self) -> int:
        task, self._intake_task = self._intake_task, None
        await cancel_within([task], 5.0, "the tier intake to end", log=log)
        await self.intake.stop()
        return self.intake.hand_back_all()

    def _intake_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()
            self._stopping.set()

    # -- configuration ---------------------------------------------------------

    async def apply(self, config: Config) -> None:
        """Apply a new configuration without dropping a held request."""
        if config.service.topic_prefix != self.config.service.topic_prefix:
            raise ConfigError(["service.topic_prefix cannot change while running"])
        await ensure_topics(self.kafka, self.topics.all(config))
        self.core.reconfigure(config)
        self.flow.worker_timeout_ms = config.service.worker_timeout_ms
        self.flow.mode = config.service.flow_control
        self.flow.max_outstanding_ms = config.service.max_outstanding_ms
        self.flow.full_batch_tokens = _full_batches(config)
        self.config = config
        self.metrics.configure(config)
        self.fairness.configure(config)
        self.intake.reconfigure(config)
        if self.intake.consumer is not None:
            await self.intake.add_partitions(await partitions_of(
                self._producer, self.intake.tier_topics(config)))
        self._wake.set()
        self.log.info("config_reloaded", tiers=config.tier_names,
                      endpoints=list(config.endpoints))

    async def reload_file(self, path: str) -> bool:
        """Load ``path`` and apply it; an invalid file is refused with every problem logged."""
        self.config_path = Path(path)
        return await self.reload()

    # -- intake: worker events -------------------------------------------------

    async def _seek_recent_events(self) -> None:
        """Start at events younger than the worker timeout: older ones are ignored anyway.

        Every partition the topic has: one, unless a client auto-created it
        after a broker restart (then the broker's default).
        """
        consumer = self._event_consumer
        topic = self.topics.worker_events
        counts = await self._keeper.metadata([topic]) if self._keeper is not None else None
        tps = [TopicPartition(topic, p) for p in range((counts or {}).get(topic, 1))]
        consumer.assign(tps)
        since_ms = int(time.time() * 1000) - self.config.service.worker_timeout_ms
        for tp in tps:
            try:
                found = await consumer.offsets_for_times({tp: since_ms})
                at = found.get(tp)
                if at is not None:
                    consumer.seek(tp, at.offset)
                else:
                    # Nothing that recent. Tansu's end offset can be a little
                    # behind the true end: the few old events read are ignored.
                    end = (await consumer.end_offsets([tp])).get(tp)
                    if end is not None:
                        consumer.seek(tp, end)
            except KafkaError as e:
                log.warning("worker_events_seek_failed", error=repr(e))

    def _followed(self) -> list:
        """Consumers whose positions the topic keeper checks."""
        return [self._event_consumer, self.intake.consumer,
                self.election.consumer if self.election is not None else None]

    async def _broker_lost(self) -> None:
        """The broker lost its topics (see :mod:`plumbing.topickeeper`): follow the new ones.

        What the leader holds stays held and is served; the tier positions
        start over on the new (empty) partitions. The leader partition is
        read from its new start (the topic keeper moves the reader back).
        Batches never seen in a worker's hands are gone with the batch topics.
        """
        await self._seek_recent_events()
        await self.intake.broker_lost()
        if self.election is not None:
            self.election.broker_lost()
        forgotten = self.flow.forget_unconfirmed()
        log.info("scheduler_resumed_after_broker_loss", forgotten_batches=len(forgotten),
                 held=self.core.held, leading=self.leading)

    async def _event_loop(self) -> None:
        consumer = self._event_consumer
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            now_ms = time.time() * 1000
            for records in batches.values():
                for rec in records:
                    try:
                        ev = _event_codec.decode_record(rec.value, rec.headers)
                    except DecodeError as e:
                        self.metrics.failures.labels("bad_worker_event").inc()
                        log.warning("worker_event_invalid", offset=rec.offset, error=str(e)[:300])
                        continue
                    self._observe(await self._existing_partitions(ev), now_ms)
            if batches:
                self._wake.set()

    async def _events_lag_loop(self) -> None:
        # Apart from the event loop: a position not known yet may take a
        # moment, and worker events must never wait for a metric.
        while True:
            consumer = self._event_consumer
            if consumer is not None:
                lag = await consumer_lag(consumer, consumer.assignment())
                self.metrics.events_lag.set(sum(lag.values()))
            await asyncio.sleep(1.0)

    async def _existing_partitions(self, ev: WorkerEvent) -> WorkerEvent:
        """``ev`` without the partitions its batch topic does not have.

        The producer asserts that a partition it is given exists (an
        AssertionError, not a KafkaError): one batch sent to a partition a
        worker merely claimed (99, -1) stopped dispatch and the scheduler with
        it. An unknown partition also asks for fresh metadata, so one added to
        the topic since is taken from the worker's next event.
        """
        if not ev.partitions or ev.endpoint not in self.core.endpoints:
            return ev  # no lane, no claim: nothing is ever sent for it
        try:
            known = await self._batch_producer.partitions_for(self.topics.batches(ev.endpoint))
        except KafkaError:
            known = set()
        kept = [p for p in ev.partitions if p in known]
        if len(kept) == len(ev.partitions):
            return ev
        self.metrics.failures.labels("unknown_partition").inc()
        log.warning("worker_partitions_unknown", worker=ev.worker, endpoint=ev.endpoint,
                    unknown=[p for p in ev.partitions if p not in known][:10])
        refresh = self._batch_producer.client.force_metadata_update()
        refresh.add_done_callback(lambda f: f.cancelled() or f.exception())
        return msgspec.structs.replace(ev, partitions=kept)

    def _observe(self, ev: WorkerEvent, now_ms: float) -> None:
        obs = self.flow.observe(ev, now_ms)
        if ev.kind == "batch_done":
            if ev.timings and ev.endpoint in self.core.endpoints:
                self.core.feedback(ev.endpoint, [(t.org, t.tokens, t.seconds) for t in ev.timings])
                self.handover.seen(ev)
            self.fairness.batch_done(ev.endpoint, ev.inference_ms / 1000,
                                     requests=ev.batch_requests, tokens=ev.batch_tokens)
            ep = self.config.endpoints.get(ev.endpoint)
            measured = self.rates.known(ev.worker)
            min_tokens, min_requests = half_batch(ep) if ep else (0, 0)
            self.rates.observe(ev.worker, ev.batch_tokens, ev.inference_ms / 1000,
                               done_ms=ev.sent_ms, busy_after=bool(ev.in_flight),
                               min_tokens=min_tokens, requests=ev.batch_requests,
                               min_requests=min_requests, express=obs.express)
            if not measured and self.rates.known(ev.worker):
                # The first rate of a worker: until admission has it, its throttle is
                # off and its pacing assumes a rate (pace_cold_batches). Publish it
                # now, not at the next tick (up to state_interval_ms later).
                self._next_state_s = 0.0
                self._wake.set()
        if not obs.accepted:
            return
        if obs.joined:
            log.info("worker_joined", worker=ev.worker, endpoint=ev.endpoint, slots=ev.slots,
                     partitions=ev.partitions)
        if obs.lost is not None:
            self._lost(obs.lost)

    def _lost(self, lost: LostWorker) -> None:
        if lost.reason == "unconfirmed":
            log.warning("batches_forgotten", worker=lost.worker, endpoint=lost.endpoint,
                        batch_ids=lost.forgotten)
            return
        self.rates.forget(lost.worker)
        self.metrics.workers_lost.labels(lost.endpoint, lost.reason).inc()
        log.info("worker_lost", worker=lost.worker, endpoint=lost.endpoint, reason=lost.reason,
                 forgotten_batches=lost.forgotten)

    # -- dispatch --------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        state_every_s = self.config.service.state_interval_ms / 1000
        while True:
            self._wake.clear()
            now = time.time()
            for lost in self.flow.expire(now * 1000):
                self._lost(lost)
            if self.may_dispatch():
                self._expired(self.core.expire(now))
                await self._dispatch(now)
                if self.intake.paused:
                    self.intake.check_pressure()
                if now >= self._next_state_s:
                    self._next_state_s = now + state_every_s
                    self._publish_state(now)
            await self._sleep_until_due(now)

    async def _sleep_until_due(self, now: float) -> None:
        if self._wake.is_set():
            # Woken while it dispatched (the intake held more, a worker reported): round
            # again at once, with no wait to work out (most turns under load).
            return
        due = [self._next_state_s]
        if (d := self.core.next_deadline()) is not None:
            due.append(d)
        if (w := self.flow.next_expiry_ms()) is not None:
            due.append(w / 1000)
        timeout = max(0.0, min(due) - time.time()) + 0.0005
        with contextlib.suppress(TimeoutError):
            await within(self._wake.wait(), timeout)

    async def _dispatch(self, now: float) -> None:
        # One batch at a time: a send awaits, and leadership can go meanwhile
        # (the dispatcher asks may_dispatch before every batch).
        for out in self.dispatcher.batches(now, may=self.may_dispatch, on_expired=self._expired):
            await self._send_batch(out)

    async def _send_batch(self, out: Outgoing) -> None:
        endpoint, partition, batch, entries = out.endpoint, out.partition, out.batch, out.entries
        try:
            fut = await self._batch_producer.send(self.topics.batches(endpoint),
                                            _batch_codec.encode(batch), key=batch.id.encode(),
                                            partition=partition, headers=_MSGPACK_HEADERS)
        except KafkaError as e:
            self._batch_failed(endpoint, batch, entries, e)
            return
        self._track(fut, lambda f: self._batch_acked(out, f))

    def _batch_acked(self, out: Outgoing, fut: asyncio.Future) -> None:
        endpoint, partition, batch, entries = out.endpoint, out.partition, out.batch, out.entries
        if fut.cancelled() or fut.exception() is not None:
            self._batch_failed(endpoint, batch, entries, fut.exception())
            return
        now = time.time()
        ep = self.config.endpoints.get(endpoint)
        m = self.metrics
        m.batches.labels(endpoint).inc()
        if batch.express:
            self.totals["express_batches"] += 1
        m.batch_requests.labels(endpoint).observe(len(entries))
        if ep is not None:
            m.batch_fill.labels(endpoint).observe(batch.tokens / ep.max_batch_tokens)
        m.dispatched_charges(endpoint, out.charges)
        self.intake.release_all([e.id for e in entries])
        waits: dict[str, list[float]] = {}
        for e in entries:
            w = waits.get(e.tier)
            if w is None:
                w = waits[e.tier] = []
            w.append(max(0.0, now - e.payload.admitted_ms / 1000))
        for tier, w in waits.items():
            observe_all(m.queue_wait_histogram(tier), w)
        self.totals["batches"] += 1
        self.totals["dispatched"] += len(entries)
        with bound_contextvars(batch_id=batch.id):
            self._sampler.log(log, "info", "batch_emitted", now * 1000, endpoint=endpoint,
                              worker=batch.worker, partition=partition, requests=len(entries),
                              tokens=batch.tokens, orgs=sorted({e.org for e in entries})[:10])

    def _batch_failed(self, endpoint: str, batch: Batch, entries: list[Entry], error) -> None:
        """The write failed: the requests go back into the core, the slot is freed."""
        self.flow.done(batch.id)
        self.metrics.failures.labels("batch_send").inc()
        for e in entries:
            # Only what this leadership still owns: otherwise the offset stayed
            # uncommitted and the current leader replays it.
            if self.leading and self.intake.owns(e.id) and self.core.push(endpoint, e):
                self.backlog.add(endpoint, e.tier, e.org, e.tokens)
        log.error("batch_send_failed", batch_id=batch.id, endpoint=endpoint,
                  requests=len(entries), error=repr(error))
        self._wake.set()

    def _expired(self, entries: Iterable[Entry]) -> None:
        now_ms = int(time.time() * 1000)
        for x in expire(entries, self.backlog, now_ms):
            req = x.request
            self.totals["expired"] += 1
            self.metrics.expired.labels(req.endpoint, x.tier).inc()
            self._sampler.log(log, "info", "request_expired", now_ms, request_id=req.id,
                              org=req.org, endpoint=req.endpoint, tier=x.tier,
                              late_ms=x.late_ms)
            self._spawn(self._send_expired(req, x.result))

    async def _send_expired(self, req: AdmittedRequest, result: Result) -> None:
        try:
            await send_result(self._producer, req.reply_to, result, req.reply_format)
        except KafkaError as e:
            # Not released: the offset stays uncommitted and a restart retries.
            self.metrics.failures.labels("result_send").inc()
            log.error("result_send_failed", request_id=req.id, error=repr(e))
            return
        self.metrics.results.labels("expired").inc()
        self.intake.release(req.id)

    # -- state, commits --------------------------------------------------------

    def _publish_state(self, now: float) -> None:
        state, gauges = snapshot(now, core=self.core, flow=self.flow, backlog=self.backlog,
                                 rates=self.rates, dispatcher=self.dispatcher, epoch=self.epoch,
                                 top_orgs=self.settings.state_top_orgs,
                                 costs=self.handover.export(self.core),
                                 admitted_through_ms=self.intake.admitted_through_ms,
                                 hops_ms=self.intake.hops.published_ms(now))
        m = self.metrics
        for g in gauges:
            ep = g.endpoint
            for tier, n in g.held_by_tier.items():
                m.held_requests.labels(ep, tier).set(n)
                m.held_tokens.labels(ep, tier).set(g.held_tokens_by_tier.get(tier, 0))
                m.held_cost.labels(ep, tier).set(g.held_cost_by_tier.get(tier, 0.0))
            m.free_slots.labels(ep).set(g.free_slots)
            m.workers.labels(ep).set(g.workers)
            m.flow_round_trip.labels(ep).set(g.round_trip_s)
            m.flow_batch.labels(ep).set(g.full_batch_s)
            m.flow_outstanding.labels(ep).set(g.outstanding)
            prev = self._rounds.get(ep, 0)
            if g.rounds > prev:
                m.drr_rounds.labels(ep).inc(g.rounds - prev)
            self._rounds[ep] = g.rounds
        self.fairness.publish(now, self.backlog)
        self._spawn(self._send_state(state))

    async def _send_state(self, state: SchedulerState) -> None:
        try:
            # send_and_wait: a failed delivery must be seen here, not left in a
            # future nobody reads (after a broker restart it would be logged as such).
            md = await self._producer.send_and_wait(self.topics.scheduler_state,
                                                    _state_codec.encode(state),
                                                    headers=_MSGPACK_HEADERS)
            if self._keeper is not None:
                self._keeper.wrote(md.topic_partition, md.offset)
        except KafkaError as e:
            log.warning("state_send_failed", error=repr(e))

    def totals_fields(self) -> dict[str, Any]:
        return {"held": self.core.held, "handed_back": self._handed_back, **self.totals,
                "log_lines_suppressed": self._sampler.suppressed}

    # -- helpers ---------------------------------------------------------------

    def _spawn(self, coro) -> None:
        self._track(asyncio.ensure_future(coro), None)

    def _track(self, fut: asyncio.Future, callback) -> None:
        self._pending.add(fut)

        def finished(f: asyncio.Future) -> None:
            self._pending.discard(f)
            if callback is not None:
                callback(f)
            elif not f.cancelled() and f.exception() is not None:
                log.error("background_send_failed", error=repr(f.exception()))
        fut.add_done_callback(finished)


# -- command line --------------------------------------------------------------


#: Environment variables of the scheduler settings: SF_SCHEDULER_<FIELD>.
ENV_PREFIX = "SF_SCHEDULER_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness scheduler``: the settings' own, then Kafka's."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    add_settings_arguments(parser.add_argument_group(
        "scheduler", "flags override the SF_SCHEDULER_* environment"), SchedulerSettings,
        env_prefix=ENV_PREFIX, skip=("config_path",))
    add_kafka_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the scheduler until SIGTERM/SIGINT; SIGHUP reloads ``--config``."""
    configure_logging()
    try:
        config = load_config(args.config)
        settings = settings_from_args(SchedulerSettings, args, env_prefix=ENV_PREFIX,
                                      config_path=args.config)
    except (ConfigError, SettingsError) as e:
        log.error("config_refused", path=args.config, error=str(e))
        return 2
    kafka = kafka_settings_from_args(args)
    return asyncio.run(serve(lambda k: SchedulerService(config, k, settings=settings), kafka))

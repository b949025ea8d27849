"""The admission service: ingress records in, admitted requests or answers out.

One loop, at-least-once:

1. fetch up to ``max_poll_records`` from the ingress topic (consumer group
   ``<prefix>admission``; requests are keyed by org, so each instance owns
   the rate-limit state of the orgs on its partitions);
2. decide each record (:func:`producer.admission.decide`): admitted ->
   ``requests.<tier>`` keyed by org (msgpack); refused -> a ``Result`` keyed
   by request id to the reply topic, in the request's encoding; undecodable
   -> the dead-letter topic (plus an ``invalid`` result when an id is
   readable);
3. wait until the broker acknowledged every send of the fetch, then commit
   the fetched offsets. A crash in between replays the fetch: duplicates are
   possible (the scheduler drops a request id it already holds, the client
   delivers a result once); losses are not. Fetches are pipelined: the next
   one is decided while the last one's sends are acknowledged, and commits
   follow fetch order (``fetches_in_flight`` bounds what waits to be settled).

Within a fetch, records are decided one partition at a time in turn, and
their writes start as they are decided, so a quiet org's record fetched
together with a burst's hundreds is on its way first.

A bad record never stops the loop; a send that keeps failing on our own
topics is retried until it succeeds or the service stops (then nothing of
the fetch is committed and it is replayed by the next owner). A result for
a reply topic that cannot be written goes to the dead letters instead.

Beside the loop, a reader follows ``scheduler-state`` with no consumer
group: it starts at the first snapshot younger than the staleness limit
(``offsets_for_times``; Tansu gets ``seek_to_end`` and ``latest`` wrong) and
keeps the latest snapshot for the throttle (:mod:`producer.throttle`).

Configuration reloads on SIGHUP and when the file's modification time
changes: a new file that does not validate is refused with its problems
logged, and the running configuration stays. ``topic_prefix`` cannot change
without a restart. Rate-limit state survives for windows that still exist.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaError, KafkaTimeoutError
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from plumbing.deadletter import dead_letter
from plumbing.kafka import (
    Consumer,
    KafkaSettings,
    Producer,
    add_kafka_arguments,
    close_clients,
    group_generation,
    in_group,
    make_consumer,
    make_producer,
)
from plumbing.kafka import settings_from_args as kafka_settings_from_args
from plumbing.logs import configure_logging, debug_enabled, get_logger
from plumbing.offsets import OffsetTracker
from plumbing.outbox import Outbox
from plumbing.rebalance import Rebalance
from plumbing.service import Service, serve
from plumbing.service_settings import AdmissionSettings
from plumbing.settings import SettingsError
from plumbing.settings import add_arguments as add_settings_arguments
from plumbing.settings import from_args as settings_from_args
from plumbing.state_follower import StateFollower
from plumbing.topickeeper import TopicKeeper
from plumbing.topics import ensure_topics
from producer.admission import Admission, Admitted, DeadLetterReason, Outcome, Refused
from producer.backlog import BACKLOG_HEADER, KEEP, RECORD_ITEMS, Backlog, item_bytes
from producer.backlog import decode as decode_backlog
from producer.backlog import encode as encode_backlog
from producer.metrics import AdmissionMetrics, LogSampler
from producer.pacing import Pacer, cold_rates
from producer.ratelimit import RateLimiter
from producer.readahead import ReadAhead
from producer.shaping import Shaper
from producer.throttle import ThrottleState
from schemas.codec import DecodeError, Format, codec_for, content_type
from schemas.config import Config, ConfigError, load_config
from schemas.messages import AdmittedRequest, DeadLetter, Result, SchedulerState
from schemas.packs import PACK_HEADER, encode_packed, split
from schemas.topics import Topics
from tokens.counting import TokenCounter, load_token_counter

__all__ = ["AdmissionService", "AdmissionSettings", "add_arguments", "run"]

log = get_logger("admission")

_admitted_codec = codec_for(AdmittedRequest)
_result_codec = codec_for(Result)
_dead_codec = codec_for(DeadLetter)
_state_codec = codec_for(SchedulerState)
_MSGPACK_HEADERS = [("content-type", b"application/msgpack")]
_PACK_HEADERS = [*_MSGPACK_HEADERS, PACK_HEADER]
_BACKLOG_HEADERS = [*_MSGPACK_HEADERS, BACKLOG_HEADER]



def _now_ms() -> int:
    return int(time.time() * 1000)


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, KafkaTimeoutError | OSError) or bool(getattr(exc, "retriable", False))


#: Decisions between two yields to the event loop while a step is decided.
#: aiokafka's fetcher sends the next fetch only from this loop, a few turns
#: after the last one was drained; with 64, a burst's records in hand kept it
#: waiting 36-40 ms (p50) before each fetch under a burst on a shared core,
#: and a quiet org's record waited in the broker meanwhile (commit f1ddd8c).
_YIELD_EVERY = 16


class _Send(msgspec.Struct):
    """One record to write, and what to do if it cannot be written."""

    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    #: "admitted", "result", "dead_letter" or "backlog".
    kind: str
    record: Any = None
    #: An admitted request: if it can never be written, its sender gets a
    #: ``failed`` result instead (built only then).
    admitted: AdmittedRequest | None = None
    #: A result's status, counted in ``sf_admission_results_total`` once acknowledged.
    status: str | None = None
    #: The ingress partition of ``record``.
    tp: Any = None
    #: The record's last send: once it is written, the record's offset is released.
    last: bool = False
    #: A pack of admitted requests: the sends it stands for, one per ingress record
    #: (released, or failed one by one, with it).
    members: list[_Send] | None = None
    #: The partition to write to (backlog records: their ingress partition's number).
    partition: int | None = None


def _packed(sends: list[_Send], max_bytes: int) -> list[_Send]:
    """One org's admitted sends of a step as pack records of at most ``max_bytes``
    (:func:`schemas.packs.split`; a request alone stays a plain record: one is not worth
    a pack)."""
    out: list[_Send] = []
    for cut in split([len(s.value) for s in sends], max_bytes):
        group = sends[cut.start:cut.stop]
        if len(group) == 1:
            out.append(group[0])
            continue
        first = group[0]
        out.append(_Send(first.topic, encode_packed([g.value for g in group]), first.key,
                         _PACK_HEADERS, "admitted", members=group))
    return out


class _Step(msgspec.Struct):
    """One step's decisions, between the producer and the commit."""

    generation: tuple[int, str] | None
    offsets: OffsetTracker
    sends: list[_Send] = msgspec.field(default_factory=list)
    written: Any = None

    def add(self, outbox: Outbox, send: _Send) -> None:
        """Keep ``send`` with this step (to settle it) and hand it to ``outbox``."""
        self.sends.append(send)
        outbox.add(send.topic, send.value, key=send.key, partition=send.partition,
                   headers=send.headers)


class AdmissionService(Service):
    """The admission service (:class:`plumbing.service.Service`: ``async with``, ``run``).

    ``config`` and the rate limiter are replaced only by :meth:`reload`;
    everything else is fixed at construction. ``token_counters`` (endpoint ->
    counter) skips loading tokenizers, for tests; ``now_ms`` is the clock.
    """

    name = "admission"
    settings: AdmissionSettings

    def __init__(
        self,
        config: Config,
        kafka: KafkaSettings,
        *,
        registry: CollectorRegistry | None = None,
        settings: AdmissionSettings | None = None,
        config_path: str | Path | None = None,
        token_counters: Mapping[str, TokenCounter] | None = None,
        now_ms: Callable[[], int] = _now_ms,
    ):
        s = settings or AdmissionSettings()
        super().__init__(config, kafka, s, registry=registry, config_path=config_path,
                         config_poll_ms=s.config_poll_ms, stop_grace_s=s.stop_settle_s)
        self.topics = Topics.of(config)
        self.metrics = AdmissionMetrics(self.registry)
        self.limiter = RateLimiter(config)
        self.throttle = ThrottleState(
            stale_after_ms=self._stale_after_ms(config),
            overload_retry_ms=max(1_000, 4 * config.service.state_interval_ms),
        )
        self.now_ms = now_ms
        self.totals: Counter[str] = Counter()
        self._sampler = LogSampler(s.log_lines_per_s)
        self._counters: dict[str, TokenCounter] = dict(token_counters or {})
        #: Decides with these three, updated in place on a reload.
        self._admission = Admission(self.limiter, self.throttle, self._counters)
        self._counter_specs: dict[str, TokenCounter] = {}
        self._producer: Producer | None = None
        self._outbox: Outbox | None = None
        self._consumer: Consumer | None = None
        self._state: StateFollower | None = None
        #: Fetched records not yet decided, and every held offset (this generation).
        self._ahead = ReadAhead()
        #: One org's records decided no faster than this (None: as fast as fetched).
        self._shaper = (Shaper(s.shape_org_per_s, s.shape_org_burst)
                        if s.shape_org_per_s > 0 else None)
        self._prune_at_s = 0.0
        #: The pacer's assumed rates before a lane's is measured (redone by a reload).
        self._cold_rates = cold_rates(config, s.pace_backlog_s, s.pace_cold_batches)
        self._offsets = OffsetTracker()
        #: Which ingress records go to the backlog topic instead of the read-ahead.
        self._backlog = Backlog(s.backlog_after_records, s.backlog_from_records)
        #: Backlog partition -> its records in the read-ahead; and those paused for it.
        self._back_held: Counter[TopicPartition] = Counter()
        self._back_paused: set[TopicPartition] = set()
        self._generation: tuple[int, str] | None = None
        self._next_commit_s = 0.0
        self.metrics.state_age.set_function(self._state_age_s)
        self.metrics.read_ahead.set_function(lambda: len(self._ahead))

    # -- lifecycle -------------------------------------------------------

    async def open(self) -> None:
        """Create the topics, load token counters, connect, join the ingress group."""
        created = await ensure_topics(self.kafka, self.topics.all(self.config))
        self._counters.update(await self._load_counters(self.config))
        producer = self._producer = make_producer(self.kafka)
        await producer.start()
        self._outbox = Outbox(producer)
        consumer = self._consumer = make_consumer(
            self.kafka, group_id=f"{self.topics.prefix}admission",
            max_poll_records=self.settings.read_ahead_records,
            max_partition_fetch_bytes=self.settings.max_partition_fetch_bytes,
            # Ingress and backlog partitions of one number to one member: a bursting
            # org's backlog is read back by the instance that decides its new records.
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        consumer.subscribe([self.topics.ingress, self.topics.backlog],
                           listener=Rebalance(on_revoked=self._on_revoked))
        await consumer.start()
        state = self._state = await StateFollower(
            self.kafka, self.topics.scheduler_state, self._observe_state,
            since_s=self.throttle.stale_after_ms / 1000,
            on_undecodable=self._state_undecodable).start()
        self.watch_broker(producer.client, self.topics.ingress,
                          self.metrics.broker_reachable)
        # A broker that lost its topics (a Tansu restart): recreate them, and
        # follow the new scheduler-state topic from its start.
        keeper = TopicKeeper(self.kafka, producer.client,
                             lambda: self.topics.all(self.config), service="admission",
                             on_lost=state.seek_recent,
                             follow=lambda: [state.consumer, self._consumer])
        keeper.known(created)
        self.keep(keeper)
        self.log.info("admission_started", ingress=self.topics.ingress,
                      group=f"{self.topics.prefix}admission", metrics_url=self.metrics_url)

    async def close(self) -> None:
        """Leave the ingress group and disconnect (the steps in hand were settled)."""
        if self._state is not None:
            await self._state.stop()
        await close_clients(self._consumer, self._producer)

    def ready(self) -> tuple[bool, str]:
        """Ready once some ingress partition is assigned."""
        if self._consumer is None or not self._consumer.assignment():
            return False, "no ingress partition assigned yet"
        return True, "ok"

    async def main(self) -> None:
        """Decide until a stop is requested; the steps in hand are settled before it returns.

        Each turn fetches what the broker has (without waiting while there is
        work in hand, up to ``read_ahead_records`` held), then decides one
        step: up to ``max_step_records`` records taken one org at a time in
        turn (:class:`producer.readahead.ReadAhead`), and hands its writes to
        the producer in one go (:class:`plumbing.outbox.Outbox`). While the
        broker acknowledges a step, the next is decided; :meth:`_settle_loop`
        settles steps in order and commits each partition up to its oldest
        record not yet written. At most ``steps_in_flight`` steps wait. With
        ``shape_org_per_s`` set, an org past its allowance is passed over in
        the turn until its next record is due (:mod:`producer.shaping`).
        """
        queue: asyncio.Queue[_Step | None] = asyncio.Queue(
            maxsize=max(1, self.settings.steps_in_flight))
        settler = asyncio.create_task(self._settle_loop(queue), name="admission-settle")
        s = self.settings
        consumer = self._consumer
        assert consumer is not None, "open() ran"
        try:
            while not self.stopping and not settler.done():
                if len(self._ahead) < s.read_ahead_records:
                    # Nothing held: wait for records; all of it shaped: for them or
                    # until the first allowance is due, whichever comes first.
                    now = time.monotonic()
                    due = self._ahead.due_in(self._shaping(now), now)
                    wait_ms = s.poll_timeout_ms if due is None else min(
                        s.poll_timeout_ms, math.ceil(due * 1000))
                    try:
                        batches = await consumer.getmany(
                            timeout_ms=wait_ms,
                            max_records=s.read_ahead_records - len(self._ahead))
                    except KafkaError as e:
                        self.log.warning("ingress_fetch_failed", error=repr(e))
                        await asyncio.sleep(0.5)
                        continue
                    if (aside := await self._hold(batches)) is not None:
                        await queue.put(aside)
                if not self._ahead.held:
                    continue
                # Chosen after the fetch, not before it: a snapshot read while the
                # fetch waited (the first one after a takeover or a fresh start)
                # paces the records that fetch returned, and the read-ahead is
                # measured with them in it.
                now = time.monotonic()
                taken = self._ahead.take(s.max_step_records, s.max_step_bytes,
                                         shaper=self._shaping(now), now=now)
                if not taken:
                    continue  # every org held is waiting for its allowance
                if self._back_held:
                    self._read_back_taken(taken)
                step = await self._step(taken)
                await queue.put(step)
        finally:
            if not settler.done():
                await queue.put(None)
            await settler

    async def _hold(self, batches: Mapping[TopicPartition, list]) -> _Step | None:
        """Hold what a fetch returned: ingress records in the read-ahead, or a bursting
        org's in the backlog (:mod:`producer.backlog`); backlog records' requests in the
        read-ahead, each behind its org's. Returns the step that writes the backlog and
        dead-letters an unreadable backlog record, if any (settled as any step)."""
        fetched_ms = self.now_ms()
        backlog_topic = self.topics.backlog
        hold, ahead, backlog = self._offsets.hold, self._ahead, self._backlog
        aside: list[_Send] = []
        for tp, records in batches.items():
            if tp.topic == backlog_topic:
                aside.extend(self._read_back(tp, records, fetched_ms))
                continue
            if backlog.after <= 0:
                for rec in records:
                    hold(tp, rec.offset)
                ahead.add(tp, records, fetched_ms)
                continue
            out: list[tuple[TopicPartition, Any]] = []
            for rec in records:
                hold(tp, rec.offset)
                if backlog.route(tp.partition, rec.key, ahead.count(tp, rec.key),
                                 len(ahead)) == KEEP:
                    ahead.add(tp, (rec,), fetched_ms)
                    continue
                out.append((tp, rec))
            if out:
                aside.extend(self._backlog_sends(tp.partition, out))
        self._pause_backlog()
        if not aside:
            return None
        step = self._new_step()
        outbox = self._outbox
        assert outbox is not None, "open() ran"
        for send in aside:
            step.add(outbox, send)
        step.written = await outbox.submit()
        return step

    def _backlog_sends(self, partition: int, records: list[tuple[TopicPartition, Any]]
                       ) -> list[_Send]:
        """``records`` (each with the ingress partition it was read from) as backlog
        records of ``partition``, each within service.max_message_bytes and
        ``RECORD_ITEMS``; each record's offset released once its copy is written."""
        topic = self.topics.backlog
        sends = []
        for cut in split([item_bytes(r) for _, r in records],
                         self.config.service.max_message_bytes, RECORD_ITEMS):
            group = records[cut.start:cut.stop]
            sends.append(_Send(topic, encode_backlog([r for _, r in group]), None,
                               _BACKLOG_HEADERS, "backlog", partition=partition, members=[
                                   _Send(topic, b"", None, [], "backlog", r, tp=tp, last=True)
                                   for tp, r in group]))
        return sends

    def _read_back(self, tp: TopicPartition, records: list, fetched_ms: int) -> list[_Send]:
        """Backlog records of ``tp``: their requests into the read-ahead, behind their org's
        records there (each request holds the record's offset); an unreadable record to the
        dead letters, whole."""
        home = TopicPartition(self.topics.ingress, tp.partition)
        hold = self._offsets.hold
        bad: list[_Send] = []
        for rec in records:
            try:
                items = decode_backlog(tp.topic, tp.partition, rec.offset, rec.value, rec.headers)
            except ValueError as e:
                hold(tp, rec.offset)
                self.metrics.dead_letters.labels("undecodable_backlog").inc()
                log.warning("backlog_record_dead_lettered", partition=tp.partition,
                            offset=rec.offset, error=str(e)[:500])
                send = self._dead_letter_send(rec, "undecodable_backlog", str(e))
                send.tp, send.last = tp, True
                bad.append(send)
                continue
            for item in items:
                hold(tp, rec.offset)
                self._backlog.read_back(tp.partition, item.key)
            self._ahead.add(tp, items, fetched_ms, group=home)
            self._back_held[tp] += len(items)
            self.metrics.backlog_read.inc(len(items))
        return bad

    def _read_back_taken(self, taken: list) -> None:
        """Requests of backlog records taken for a step: room to read more back."""
        topic = self.topics.backlog
        held = self._back_held
        for tp, _rec, _at in taken:
            if tp.topic == topic:
                held[tp] -= 1
        self._pause_backlog()

    def _pause_backlog(self) -> None:
        """Read a backlog partition only while fewer than ``backlog_after_records`` records
        wait in the read-ahead for it: the more of those read back from it (any org's),
        and those its orgs with records there have read ahead, read back or from ingress
        (a burst's first records stay read ahead when the rest go to the backlog: it is
        not read back before they are decided)."""
        consumer = self._consumer
        assert consumer is not None, "open() ran"
        bound = max(1, self._backlog.after)
        held, paused = self._back_held, self._back_paused
        ingress, backlog = self.topics.ingress, self.topics.backlog
        waiting: Counter[TopicPartition] = Counter()
        for partition, key in self._backlog.spilled():
            waiting[TopicPartition(backlog, partition)] += self._ahead.count(
                TopicPartition(ingress, partition), key)
        for tp in set(held) | set(waiting):
            n = max(held[tp], waiting[tp])
            if n >= bound:
                if tp not in paused:
                    consumer.pause(tp)
                    paused.add(tp)
                continue
            if tp in paused:
                consumer.resume(tp)
                paused.discard(tp)
            if held[tp] <= 0:
                del held[tp]

    def _shaping(self, now: float) -> Shaper | Pacer | None:
        """The pacer and the shaper, as they apply: not from half a full read-ahead on,
        where a burst larger than it holds is decided at full speed again rather than
        stop the fetches every other org's records wait for; the shaper's refilled
        buckets are let go as it goes. A new pacer each time: it asks each org's
        backlog once (:mod:`producer.pacing`)."""
        if 2 * len(self._ahead) >= self.settings.read_ahead_records:
            return None
        shaper = self._shaper
        if shaper is not None and now >= self._prune_at_s:
            shaper.prune(now)
            self._prune_at_s = now + 1.0
        limit = self.settings.pace_backlog_s
        if not limit > 0 or not self.throttle.is_fresh(now_ms := self.now_ms()):
            return shaper
        return Pacer(functools.partial(self.throttle.org_backlog_s, now_ms=now_ms,
                                       cold_tokens_per_s=self._cold_rates), limit, shaper)

    # -- the loop --------------------------------------------------------

    def _on_revoked(self, _partitions=None) -> None:
        """A rebalance: what is read ahead is the next owner's (aiokafka revokes everything).

        Records decided and being written still settle, but their offsets
        belong to the old generation: they are not committed (the next owner
        replays them; the scheduler drops an id it already holds).
        """
        dropped = self._ahead.drop()
        self._offsets = OffsetTracker()
        self._backlog.clear()
        self._back_held.clear()
        self._back_paused.clear()  # aiokafka forgets pauses with the assignment
        self._generation = None
        if dropped:
            log.info("read_ahead_dropped", records=dropped,
                     detail="partitions revoked: the next owner reads them again")

    def _new_step(self) -> _Step:
        if self._generation is None:
            self._generation = group_generation(self._consumer)
        return _Step(generation=self._generation, offsets=self._offsets)

    async def _step(self, taken: list) -> _Step:
        """Decide ``taken`` and hand its writes to the producer; :meth:`_settle` finishes it."""
        step = self._new_step()
        outbox = self._outbox
        assert outbox is not None, "open() ran"
        packing = self.settings.pack_tier_records
        #: (tier topic, org) -> that org's admitted sends of this step, in order.
        packs: dict[tuple[str, str], list[_Send]] = {}
        for n, (tp, rec, fetched_ms) in enumerate(taken, 1):
            for send in self._decide(rec, fetched_ms):
                send.tp = tp
                if packing and send.admitted is not None:
                    packs.setdefault((send.topic, send.admitted.org), []).append(send)
                    continue
                step.add(outbox, send)
            if n % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a step is milliseconds of work: the loop's other tasks
        for sends in packs.values():
            # Within service.max_message_bytes, which the scheduler reads records up to.
            for send in _packed(sends, self.config.service.max_message_bytes):
                step.add(outbox, send)
        step.written = await outbox.submit()
        return step

    async def _settle_loop(self, queue: asyncio.Queue[_Step | None]) -> None:
        """Settle steps in the order they were decided; stop committing after a failure."""
        replay_rest = False
        while (step := await queue.get()) is not None:
            if replay_rest or not await self._settle(step):
                # Stopping with sends unacknowledged: this step, and every
                # later one, is left to be replayed by the next owner.
                replay_rest = True
                continue
            if queue.empty() or time.monotonic() >= self._next_commit_s:
                await self._commit(step)

    async def _settle(self, step: _Step) -> bool:
        """Wait for a step's writes (retrying failures); release its records' offsets."""
        outcomes = await step.written.outcomes()
        counted = self.metrics.result_counter
        for s, error in zip(step.sends, outcomes, strict=True):
            if error is not None:
                if not await self._retry(s, error):
                    return False
            elif s.status is not None:
                counted(s.status).inc()
            elif s.kind == "backlog":
                self.metrics.backlog_written.inc(len(s.members or ()))
        for s in step.sends:
            for m in s.members or (s,):
                if m.last:
                    step.offsets.release(m.tp, m.record.offset)
        return True

    async def _commit(self, step: _Step) -> None:
        """Commit every partition up to its oldest record not yet written (this generation)."""
        self._next_commit_s = time.monotonic() + self.settings.commit_interval_ms / 1000
        if step.offsets is not self._offsets:
            return  # a rebalance came in between: the next owner replays
        consumer = self._consumer
        assert consumer is not None, "open() ran"
        try:
            # Not a member of the generation it was fetched in any more
            # (rebalanced, expelled, or the broker lost the group): the next
            # owner replays; a commit now would be stale.
            if not in_group(consumer, step.generation):
                return
            offsets = {tp: o for tp, o in self._offsets.to_commit().items()
                       if tp in consumer.assignment()}
            if offsets:
                await consumer.commit(offsets)
                self._offsets.committed(offsets)
        except KafkaError as e:
            # A rebalance took the partitions: the new owner replays them.
            log.warning("ingress_commit_failed", error=repr(e))
            return
        lag = self.metrics.lag_gauge
        backlog_lag = 0
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            at = self._offsets.committable(tp)
            if highwater is None or at is None:
                continue
            if tp.topic == self.topics.backlog:
                backlog_lag += max(0, highwater - at)
            else:
                lag(str(tp.partition)).set(max(0, highwater - at))
        self.metrics.backlog_lag.set(backlog_lag)

    def _decide(self, rec, fetched_ms: int | None = None) -> list[_Send]:
        started = time.perf_counter()
        outcome = self._admission.decide(rec.value, rec.headers, rec.timestamp, self.config,
                                         self.now_ms())
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        if isinstance(outcome, Admitted):
            outcome.request.fetched_ms = fetched_ms
        sends = self._account(outcome, rec)
        sends[-1].last = True
        return sends

    def _account(self, outcome: Outcome, rec) -> list[_Send]:
        m = self.metrics
        match outcome:
            case Admitted(request=req, topic=topic):
                m.admitted_counter(req.endpoint, req.tier).inc()
                self.totals["admitted"] += 1
                if debug_enabled():
                    log.debug("request_admitted", request_id=req.id, org=req.org,
                              endpoint=req.endpoint, tier=req.tier, tokens=req.tokens,
                              topic=topic)
                return [_Send(topic, _admitted_codec.encode(req), req.org.encode(),
                              _MSGPACK_HEADERS, "admitted", rec, admitted=req)]
            case Refused(result=result, reply_to=reply_to, reply_format=fmt):
                endpoint, tier = self._labels(result.org, result.endpoint)
                m.rejected_counter(endpoint, tier, result.reason or "").inc()
                self.totals[f"{result.status}:{result.reason}"] += 1
                if self._sampler.allow(self.now_ms()):
                    log.info("request_rejected", request_id=result.id, org=result.org,
                             endpoint=result.endpoint, status=result.status,
                             reason=result.reason, retry_after_ms=result.retry_after_ms,
                             message=result.message)
                return [self._result_send(result, reply_to, fmt, rec)]
            case DeadLetterReason(reason=reason, error=error, result=result,
                                  reply_to=reply_to, reply_format=fmt):
                m.dead_letters.labels(reason).inc()
                self.totals[f"dead_letter:{reason}"] += 1
                ids = {"request_id": result.id, "org": result.org} if result else {}
                if self._sampler.allow(self.now_ms()):
                    log.warning("request_dead_lettered", **ids, reason=reason,
                                error=error[:500], partition=rec.partition, offset=rec.offset)
                sends = [self._dead_letter_send(rec, reason, error)]
                if result is not None and reply_to is not None:
                    sends.append(self._result_send(result, reply_to, fmt, rec))
                return sends
        raise AssertionError(f"unknown outcome {outcome!r}")  # pragma: no cover

    def _labels(self, org: str, endpoint: str) -> tuple[str, str]:
        """Bounded label values: names outside the registry become "unknown"."""
        ep = endpoint if endpoint in self.config.endpoints else "unknown"
        o = self.config.orgs.get(org)
        return ep, o.tier if o is not None else "unknown"

    def _result_send(self, result: Result, reply_to: str, fmt: Format, rec) -> _Send:
        return _Send(reply_to, _result_codec.encode(result, fmt), result.id.encode(),
                     [("content-type", content_type(fmt).encode())], "result", rec,
                     status=result.status)

    def _dead_letter_send(self, rec, reason: str, error: str) -> _Send:
        letter = dead_letter(rec, reason, error)
        return _Send(self.topics.dead_letters, _dead_codec.encode(letter), None,
                     _MSGPACK_HEADERS, "dead_letter", rec)

    def _fallback(self, s: _Send) -> _Send | None:
        """What the sender gets when ``s`` can never be written: an admitted request's ``failed``."""
        req = s.admitted
        if req is None:
            return None
        failed = Result(id=req.id, status="failed", org=req.org, endpoint=req.endpoint,
                        reason="admission_send_failed",
                        message=f"the admitted request could not be written to {s.topic}")
        return self._result_send(failed, req.reply_to, req.reply_format, s.record)

    async def _retry(self, s: _Send, error: BaseException) -> bool:
        """Retry one failed send; False only when stopping before it got through."""
        producer = self._producer
        assert producer is not None, "open() ran"
        attempts = 1
        delay_s = 0.1
        while True:
            self.metrics.send_failures.labels(s.kind).inc()
            give_up = not _retriable(error) or (
                s.kind == "result" and attempts >= self.settings.reply_send_attempts
            )
            if give_up:
                return await self._undeliverable(s, error)
            if self._stopping.is_set():
                log.error("send_abandoned_on_stop", topic=s.topic, kind=s.kind, error=repr(error))
                return False
            log.warning("send_retrying", topic=s.topic, kind=s.kind, attempt=attempts,
                        error=repr(error))
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 5.0)
            attempts += 1
            try:
                await producer.send_and_wait(s.topic, s.value, key=s.key,
                                             partition=s.partition, headers=s.headers)
                if s.status is not None:
                    self.metrics.result_counter(s.status).inc()
                return True
            except Exception as e:  # noqa: BLE001 - classified at the top of the loop
                error = e

    async def _undeliverable(self, s: _Send, error: BaseException) -> bool:
        """A send that can never succeed: keep the record as a dead letter, never block."""
        producer = self._producer
        assert producer is not None, "open() ran"
        log.error("send_failed", topic=s.topic, kind=s.kind, error=repr(error))
        if s.members is not None:
            # Each request of the pack as if it had been sent alone: its record to
            # the dead letters, a failed result to its sender.
            for m in s.members:
                if not await self._undeliverable(m, error):
                    return False
            return True
        if s.kind == "dead_letter" or s.record is None:
            return True  # nowhere left to keep it; logged above
        letter = _dead_codec.encode(dead_letter(s.record, f"{s.kind}_undeliverable",
                                                f"writing to {s.topic} failed: {error!r}"))
        self.metrics.dead_letters.labels(f"{s.kind}_undeliverable").inc()
        then = [_Send(self.topics.dead_letters, letter, None, _MSGPACK_HEADERS, "dead_letter")]
        if (fallback := self._fallback(s)) is not None:
            then.append(fallback)
        for t in then:
            try:
                await producer.send_and_wait(t.topic, t.value, key=t.key, headers=t.headers)
            except Exception as e:  # noqa: BLE001 - retried (or given up) like any send
                if not await self._retry(t, e):
                    return False
            else:
                if t.status is not None:
                    self.metrics.result_counter(t.status).inc()
        return True

    # -- scheduler state -------------------------------------------------

    def _observe_state(self, state: SchedulerState) -> None:
        self.throttle.observe(state, self.now_ms())

    def _state_undecodable(self, rec, e: DecodeError) -> None:
        self.metrics.state_errors.inc()
        if self._sampler.allow(self.now_ms()):
            log.warning("scheduler_state_undecodable", offset=rec.offset, error=str(e))

    def _state_age_s(self) -> float:
        age = self.throttle.age_ms(self.now_ms())
        return float("nan") if age is None else age / 1000.0

    def _stale_after_ms(self, config: Config) -> float:
        given = self.settings.state_stale_after_ms
        return given if given is not None else max(5_000.0, 20.0 * config.service.state_interval_ms)

    # -- configuration reload ------------------------------------------------

    async def apply(self, config: Config) -> None:
        """Install ``config``: its token counters and topics first, then the limits."""
        if config.service.topic_prefix != self.config.service.topic_prefix:
            raise ConfigError([(
                f"service.topic_prefix cannot change from "
                f"{self.config.service.topic_prefix!r} to "
                f"{config.service.topic_prefix!r} without a restart")])
        counters = await self._load_counters(config)
        await ensure_topics(self.kafka, self.topics.all(config))
        self._counters.update(counters)
        self.config = config
        self.limiter.update(config)
        self.throttle.stale_after_ms = self._stale_after_ms(config)
        self._cold_rates = cold_rates(config, self.settings.pace_backlog_s,
                                      self.settings.pace_cold_batches)
        self.log.info("config_reloaded", orgs=len(config.orgs), endpoints=sorted(config.endpoints),
                      tiers=config.tier_names)

    async def _load_counters(self, config: Config) -> dict[str, TokenCounter]:
        """A token counter per endpoint; a spec shared by endpoints is loaded once."""
        counters: dict[str, TokenCounter] = {}
        for name, ep in config.endpoints.items():
            if name in self._counters and config.endpoints.get(name) == self.config.endpoints.get(
                name
            ):
                counters[name] = self._counters[name]
                continue
            spec = self.settings.token_counter or ep.model
            if spec not in self._counter_specs:
                try:
                    self._counter_specs[spec] = await asyncio.to_thread(load_token_counter, spec)
                except Exception as e:
                    raise ConfigError(
                        [f"endpoints.{name}.model: cannot load a token counter for {spec!r}: {e}"]
                    ) from e
            counters[name] = self._counter_specs[spec]
        return counters

    # -- totals ------------------------------------------------------------

    def totals_fields(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "log_lines_suppressed": self._sampler.suppressed}


# -- the `admission` subcommand ----------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness admission``: the settings' own, then Kafka's."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    parser.add_argument("--log-level", default=None, help="DEBUG logs every admitted request")
    add_settings_arguments(parser.add_argument_group(
        "admission", "flags override the SF_ADMISSION_* environment"), AdmissionSettings,
        env_prefix=ENV_PREFIX)
    add_kafka_arguments(parser)


#: Environment variables of the admission settings: SF_ADMISSION_<FIELD>.
ENV_PREFIX = "SF_ADMISSION_"


def run(args: argparse.Namespace) -> int:
    """Run the admission service until SIGTERM or SIGINT; SIGHUP reloads the configuration."""
    configure_logging(args.log_level)
    try:
        config = load_config(args.config)
        settings = settings_from_args(AdmissionSettings, args, env_prefix=ENV_PREFIX)
    except (ConfigError, SettingsError) as e:
        print(f"serving-fairness admission: {e}", file=sys.stderr)
        return 2
    kafka = kafka_settings_from_args(args)
    return asyncio.run(serve(lambda k: AdmissionService(config, k, settings=settings,
                                                        config_path=args.config), kafka))

"""The scheduler's intake: admitted requests from the tier topics into the core.

The leader reads every partition of every ``requests.<tier>`` topic with a
consumer it assigns them to itself (no group membership, so no join and
no session to wait for on a takeover). Its positions are committed to the
group of its leadership, ``<prefix>scheduler.<epoch>``, that nobody
subscribes to (:mod:`scheduler.takeover` says why that fences a deposed
leader's commits). Each record is decoded and pushed into the core at
once; its offset is *held* (:mod:`plumbing.offsets`) until the service
reports the request done (its batch or its ``expired`` result acknowledged
by the broker), and offsets are committed only up to the oldest held one.
A crash therefore replays every request not yet done; a replayed id already
held is ignored by the core, and one a predecessor already wrote in a batch
(``skip``, read by the takeover) is passed over.

The **floor** (:attr:`TierIntake.commit_floor_ms`, carried by the leader's
beats): a wall-clock time before which no batch holding a request at or
after a committed position was written. It is the oldest ``received_ms``
among the requests held at the last commit (later records of a partition
are read after it), or the takeover's own floor for records replayed
before the intake first caught up with the tier topics.

Bad records never stop the loop: an undecodable one, or one for an endpoint
this configuration does not know, goes to the dead-letter topic, and its
sender gets an ``invalid`` result when an id and an allowed reply topic can
still be read from it.

Memory is bounded: at ``service.max_held_requests`` held the consumer
pauses its partitions (admission meanwhile rejects with ``overloaded``), and
resumes below 90 % of it, so it does not flap at the limit. The overshoot is
at most one fetch (``max_poll_records``).

:meth:`TierIntake.hand_back_all` takes every held request out of the core
when the scheduler stops leading (the next leader replays them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterable

import msgspec
import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from structlog.contextvars import bound_contextvars

from plumbing.bounded import within
from plumbing.deadletter import send_dead_letter
from plumbing.kafka import Consumer, KafkaSettings, consumer_lag, make_consumer, stop_consumer
from plumbing.offsets import OffsetTracker
from scheduler.core import Scheduler
from scheduler.entry import NO_DEADLINE, Entry
from scheduler.metrics import SchedulerMetrics
from scheduler.snapshot import Backlog, HopTime
from schemas.codec import DecodeError, Format, codec_for, content_type, format_from_headers
from schemas.config import Config
from schemas.messages import AdmittedRequest, Result
from schemas.packs import is_pack, unpack_requests
from schemas.topics import Topics

__all__ = ["TierIntake", "send_result"]

log = structlog.get_logger("scheduler")

_request_codec = codec_for(AdmittedRequest)
_result_codec = codec_for(Result)
#: A legal Kafka topic name (``schemas.messages.TopicName``).
_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._\-]{1,249}")
#: The headers of one pack item dead-lettered alone: its bytes are in the pack's encoding.
_ITEM_HEADERS = {"json": [("content-type", b"application/json")],
                 "msgpack": [("content-type", b"application/msgpack")]}
#: Resume intake below this fraction of max_held_requests.
_RESUME_AT = 0.9
#: Longest wait for the commit of a revoked partition (or at stop).
_COMMIT_ON_REVOKE_S = 3.0
#: Requests held (or records read) between two yields to the event loop within
#: a slice: the consumers' fetchers take their next step only when the loop
#: lets them. Counted in requests: a pack of 20 counts 20.
_YIELD_EVERY = 32


class _ReplyAddress(msgspec.Struct):
    """What can still be read from a broken request: enough to answer it."""

    id: str
    reply_to: str
    org: str = ""
    endpoint: str = ""
    reply_format: str = "json"


_address_decoders: dict[str, msgspec.json.Decoder[_ReplyAddress]
                        | msgspec.msgpack.Decoder[_ReplyAddress]] = {
    "json": msgspec.json.Decoder(_ReplyAddress),
    "msgpack": msgspec.msgpack.Decoder(_ReplyAddress),
}


async def send_result(producer, topic: str, result: Result, fmt: Format) -> None:
    """Write ``result`` keyed by its request id in ``fmt`` and wait for the ack."""
    await producer.send_and_wait(
        topic, _result_codec.encode(result, fmt), key=result.id.encode(),
        headers=[("content-type", content_type(fmt).encode())])


class TierIntake:
    """Reads the tier topics into ``core``; owns their offsets and commits.

    Shares ``core``, ``backlog``, ``metrics`` and ``totals`` with the
    service, on one event loop: every change happens between awaits.
    """

    def __init__(self, config: Config, topics: Topics, core: Scheduler, backlog: Backlog,
                 metrics: SchedulerMetrics, totals: dict[str, int], wake: asyncio.Event, *,
                 max_poll_records: int = 500):
        self.config = config
        self.topics = topics
        self.core = core
        self.backlog = backlog
        self.metrics = metrics
        self.totals = totals
        self.wake = wake
        self.max_poll_records = max_poll_records
        self.offsets = OffsetTracker()
        self.assigned: set[TopicPartition] = set()
        self.paused = False
        #: The newest ``admitted_ms`` read so far: the snapshot's
        #: ``admitted_through_ms`` (admission's throttle counts what it
        #: admitted after it as still on its way).
        self.admitted_through_ms: int | None = None
        #: The tier topic's hop, sampled per fetch (the snapshot's ``hops_ms``).
        self.hops = HopTime()
        self._origin: dict[str, tuple[TopicPartition, int]] = {}
        #: (partition, offset) of each held request -> its floor (see the module doc).
        self._floor_at: dict[tuple[TopicPartition, int], int] = {}
        #: Ids a predecessor already wrote in batches (read by the takeover).
        self.skip: set[str] = set()
        self.skipped = 0
        self._takeover_floor_ms: int | None = None
        self._replaying = False
        #: The floor as of the last commit the broker acknowledged.
        self.commit_floor_ms: int | None = None
        self._may_commit: Callable[[], bool] = lambda: False
        self._end_offsets: dict[TopicPartition, int] = {}
        self._consumer: Consumer | None = None
        self._producer = None
        self._tiers = frozenset(config.tier_names)
        self._last_tier = config.tier_names[-1]

    # -- lifecycle -------------------------------------------------------------

    async def start(self, kafka: KafkaSettings, producer, *, group: str,
                    partitions: list[TopicPartition], positions: dict[TopicPartition, int],
                    skip: set[str], floor_ms: int, may_commit: Callable[[], bool]) -> None:
        """Read ``partitions`` from ``positions`` (the rest from their start), committing to
        ``group`` while ``may_commit()``; ``skip``: ids already dispatched."""
        self._producer = producer
        self._may_commit = may_commit
        self.skip = skip
        self.skipped = 0
        self._takeover_floor_ms = self.commit_floor_ms = floor_ms
        self._replaying = True
        self._consumer = make_consumer(kafka, group_id=group,
                                       max_poll_records=self.max_poll_records)
        await self._consumer.start()
        self._consumer.assign(partitions)
        for tp in partitions:
            if tp in positions:
                self._consumer.seek(tp, positions[tp])
        if unknown := [tp for tp in partitions if tp not in positions]:
            await within(self._consumer.seek_to_beginning(*unknown), 10)
        self.assigned = set(partitions)
        log.info("tier_partitions_assigned", partitions=len(partitions), group=group,
                 positions=len(positions), skip=len(skip))

    async def stop(self) -> None:
        """Commit what is done (never a held request, and only while leading), stop reading."""
        if self._consumer is None:
            return
        with contextlib.suppress(Exception):
            await within(self.commit(), _COMMIT_ON_REVOKE_S)
        # Cleared first: the commit loop and lag updates skip a stopping consumer.
        consumer, self._consumer = self._consumer, None
        with contextlib.suppress(Exception):
            await stop_consumer(consumer)

    @property
    def consumer(self):
        """The tier consumer while started (for the topic keeper), else None."""
        return self._consumer

    def tier_topics(self, config: Config) -> list[str]:
        return [self.topics.tier(t) for t in config.tier_names]

    def reconfigure(self, config: Config) -> None:
        """Follow a new configuration; a new tier's partitions are read from their start
        once the caller adds them (:meth:`add_partitions`)."""
        self.config = config
        self._tiers = frozenset(config.tier_names)
        self._last_tier = config.tier_names[-1]

    async def add_partitions(self, partitions: list[TopicPartition]) -> None:
        """Read ``partitions`` too (from their start), keeping every position held now."""
        consumer = self._consumer
        new = [tp for tp in partitions if tp not in self.assigned]
        if consumer is None or not new:
            return
        kept = consumer.positions_now()
        consumer.assign([*self.assigned, *new])
        for tp, pos in kept.items():
            consumer.seek(tp, pos)
        self.assigned |= set(new)
        await within(consumer.seek_to_beginning(*new), 10)
        if self.paused:
            consumer.pause(*new)
        log.info("tier_partitions_added", partitions=len(new))

    async def broker_lost(self) -> None:
        """The broker lost its topics: what is held stays held (and is served); the new
        partitions are read from their start.

        Every held request's offset is held again in a fresh tracker: some
        may be the new partitions' already (read between the broker's return
        and this notice), and a commit must not pass them while they are
        held. The old partitions' offsets make commits lag (a successor then
        replays, and its workers skip what they answered), never run ahead.
        """
        self.offsets = OffsetTracker()
        for tp, offset in self._origin.values():
            self.offsets.hold(tp, offset)
        consumer = self._consumer
        if consumer is not None and self.assigned:
            with contextlib.suppress(Exception):
                await within(consumer.seek_to_beginning(*self.assigned), 10)

    # -- reading ---------------------------------------------------------------

    async def run(self) -> None:
        """Read forever, one slice of at most ``max_poll_records`` at a time.

        After each slice, and every ``_YIELD_EVERY`` requests within one, the
        dispatcher is woken and runs before intake goes on: a free worker slot
        (and a worker's report of one) is served within a few dozen requests of
        intake, never after a whole burst is read.
        """
        consumer = self._consumer
        assert consumer is not None, "start() ran"
        while True:
            batches = await consumer.getmany(timeout_ms=1000,
                                             max_records=self.max_poll_records)
            if not batches:
                if self._replaying and consumer.caught_up():
                    self._replayed()
                continue
            now_ms = int(time.time() * 1000)
            received: dict[str, int] = {}
            taken = 0
            newest = self.admitted_through_ms
            core = self.core
            for tp, records in batches.items():
                for rec in records:
                    if tp not in self.assigned:
                        break  # revoked while we yielded: the next owner reads the rest
                    before = core.held
                    rejected = self._hold_record(tp, rec, now_ms, received)
                    taken += max(1, core.held - before)
                    for bad, reason, error in rejected:
                        await self._reject(bad, reason, error)
                    if taken >= _YIELD_EVERY:
                        taken = 0
                        # The dispatcher (a freed slot), and the consumers'
                        # fetchers (the worker's credit among them), go first.
                        self.wake.set()
                        await asyncio.sleep(0)
            for tier, n in received.items():
                self.metrics.received_counter(tier).inc(n)
                self.totals["received"] += n
            if self.admitted_through_ms is not None and self.admitted_through_ms != newest:
                self.hops.observe(now_ms - self.admitted_through_ms, now_ms / 1000)
            if self._replaying and consumer.caught_up():
                self._replayed()  # after this slice's records were held or skipped
            self.check_pressure()
            self.wake.set()
            await asyncio.sleep(0)  # the dispatcher goes first

    def _replayed(self) -> None:
        """The intake has read what the tier topics held at the takeover: what a predecessor
        dispatched can no longer come up (a record written after the takeover's fences
        was never in a batch a worker serves)."""
        self._replaying = False
        log.info("takeover_replayed", skipped=self.skipped, held=self.core.held,
                 not_met=len(self.skip) - self.skipped)
        self.skip = set()

    async def _take(self, tp: TopicPartition, rec) -> None:
        """One tier record into the core, or to the dead letters (what :meth:`run` does)."""
        received: dict[str, int] = {}
        for bad, reason, error in self._hold_record(tp, rec, int(time.time() * 1000), received):
            await self._reject(bad, reason, error)
        for tier, n in received.items():
            self.metrics.received_counter(tier).inc(n)
            self.totals["received"] += n

    def _hold_record(self, tp: TopicPartition, rec, now_ms: int,
                     received: dict[str, int]) -> list[tuple[object, str, str]]:
        """Push a record's requests (one, or a pack's) into the core; returns what must be
        rejected: (the record, or one pack item as a record of its own bytes, reason, error).

        The record's offset stays held while any request of it is held; one
        bad item of a pack is rejected alone, and the others are held.
        """
        max_bytes = self.config.service.max_message_bytes
        held: dict[tuple[str, str, str], list[int]] = {}
        try:
            fmt = format_from_headers(rec.headers)
            if not is_pack(rec.headers):
                req = _request_codec.decode(rec.value, fmt, max_bytes=max_bytes)
                why = self._hold((tp, rec.offset), req, now_ms, received, held)
                self._held(tp, rec.offset, now_ms, held)
                return [] if why is None else self._rejected(tp, rec, *why)
            items = unpack_requests(rec.value, fmt, max_bytes=max_bytes)
        except DecodeError as e:
            return self._rejected(tp, rec, e.reason, str(e))
        self.totals["packs"] = self.totals.get("packs", 0) + 1
        out: list[tuple[object, str, str]] = []
        origin = (tp, rec.offset)  # one tuple for the pack's requests
        for item in items:
            if item.value is None:
                assert item.error is not None
                why = item.error.reason, str(item.error)
            else:
                why = self._hold(origin, item.value, now_ms, received, held)
            if why is not None:
                alone = dataclasses.replace(rec, value=item.raw, headers=_ITEM_HEADERS[fmt])
                out += self._rejected(tp, alone, *why)
        self._held(tp, rec.offset, now_ms, held)
        return out

    def _rejected(self, tp: TopicPartition, rec, reason: str,
                  error: str) -> list[tuple[object, str, str]]:
        self.offsets.consumed(tp, rec.offset)
        return [(rec, reason, error)]

    def _hold(self, origin: tuple[TopicPartition, int], req: AdmittedRequest, now_ms: int,
              received: dict[str, int],
              held: dict[tuple[str, str, str], list[int]]) -> tuple[str, str] | None:
        """Push one request into the core; (reason, error) if it must be rejected.

        What it holds is counted in ``held`` (``(endpoint, tier, org)`` ->
        ``[requests, tokens]``), for :meth:`_held` once per record. ``origin``: its
        record's (partition, offset).
        """
        if req.id in self.skip:
            # A predecessor's batch holds it, and a worker serves that batch.
            self.skipped += 1
            self.totals["taken_over_dispatched"] = self.totals.get("taken_over_dispatched", 0) + 1
            self.offsets.consumed(*origin)
            return None
        if self.admitted_through_ms is None or req.admitted_ms > self.admitted_through_ms:
            self.admitted_through_ms = req.admitted_ms
        lane = self.core.lanes.get(req.endpoint)
        if lane is None:
            return "unknown_endpoint", f"endpoint {req.endpoint!r} is not configured"
        limit = lane.endpoint.max_request_tokens
        if req.tokens > limit:
            # DRR relies on quantum x weight >= the largest request cost: a bigger
            # request would make the lane add quanta, turn after turn, for ever.
            return "too_many_tokens", (f"request has {req.tokens} tokens, the limit of endpoint "
                                       f"{req.endpoint!r} is max_request_tokens = {limit}")
        tier = req.tier if req.tier in self._tiers else self._last_tier  # a tier removed by a reload
        req.received_ms = now_ms
        entry = Entry(req.id, req.org, tier, req.tokens, priority=req.priority,
                      deadline=(NO_DEADLINE if req.deadline_at_ms is None
                                else req.deadline_at_ms / 1000),
                      arrival=now_ms / 1000, payload=req)
        received[tier] = received.get(tier, 0) + 1
        if self.core.push(req.endpoint, entry):
            self._origin[req.id] = origin
            c = held.get(key := (req.endpoint, tier, req.org))
            if c is None:
                held[key] = [1, req.tokens]
            else:
                c[0] += 1
                c[1] += req.tokens
        else:
            self.totals["duplicates"] += 1
            self.metrics.duplicates.labels(tier).inc()
            self.offsets.consumed(*origin)
        return None

    def _held(self, tp: TopicPartition, offset: int, now_ms: int,
              held: dict[tuple[str, str, str], list[int]]) -> None:
        """One record's requests were pushed (``held``, as :meth:`_hold` counts them): its
        offset is held once per request, and the backlog counts them."""
        n = sum(c[0] for c in held.values())
        if not n:
            return
        self.offsets.hold(tp, offset, n)
        floor = self._takeover_floor_ms if self._replaying else None
        # A pack's requests share one offset and one floor.
        self._floor_at.setdefault((tp, offset), now_ms if floor is None else min(floor, now_ms))
        for (endpoint, tier, org), (requests, tokens) in held.items():
            self.backlog.add(endpoint, tier, org, tokens, requests)

    async def _reject(self, rec, reason: str, error: str) -> None:
        """Dead-letter a tier record and answer its sender if the address is readable."""
        addr = self._reply_address(rec)
        ids = {"request_id": addr.id, "org": addr.org} if addr is not None else {}
        with bound_contextvars(**ids):
            await self._reject_bound(rec, addr, reason, error)

    async def _reject_bound(self, rec, addr: _ReplyAddress | None, reason: str,
                            error: str) -> None:
        self.totals["invalid"] += 1
        self.metrics.failures.labels(reason).inc()
        log.warning("request_invalid", topic=rec.topic, partition=rec.partition,
                    offset=rec.offset, reason=reason, error=error[:300])
        try:
            await send_dead_letter(self._producer, self.topics.dead_letters, rec, reason, error)
        except KafkaError as e:
            log.error("dead_letter_failed", error=repr(e))
        if addr is None:
            return
        result = Result(id=addr.id, status="invalid", org=addr.org, endpoint=addr.endpoint,
                        reason=reason, message=error[:1000],
                        completed_ms=int(time.time() * 1000))
        fmt: Format = "msgpack" if addr.reply_format == "msgpack" else "json"
        try:
            await send_result(self._producer, addr.reply_to, result, fmt)
        except KafkaError as e:
            log.error("result_send_failed", error=repr(e))
            return
        self.metrics.results.labels("invalid").inc()

    def _reply_address(self, rec) -> _ReplyAddress | None:
        allowed = self.topics.reply_prefix(self.config)
        for fmt in ("msgpack", "json"):
            try:
                addr = _address_decoders[fmt].decode(rec.value or b"")
            except (msgspec.DecodeError, ValueError, RecursionError):
                continue
            # A legal topic name too (as admission demands): an illegal one blocks
            # the send, and so this loop, for the producer's whole metadata
            # timeout, then fails anyway.
            to = addr.reply_to
            if addr.id and _LEGAL_TOPIC.fullmatch(to) and (
                    to == self.topics.results
                    or (to.startswith(allowed) and len(to) > len(allowed))):
                return addr
        return None

    # -- done, pressure, lag, commits -------------------------------------------

    def owns(self, request_id: str) -> bool:
        """True while ``request_id`` came from a partition this intake still holds."""
        return request_id in self._origin

    def hand_back_all(self) -> int:
        """Drop every held request from the core (after :meth:`stop`); returns how many.

        For a scheduler that stopped leading: nothing it held was committed,
        so the next leader replays all of it. The intake can start again.
        """
        dropped = 0
        for rid in list(self._origin):
            e = self.core.remove(rid)
            if e is not None:
                self.backlog.remove(e.payload.endpoint, e.tier, e.org, e.tokens)
                dropped += 1
        self._origin.clear()
        self._floor_at.clear()
        self.skip = set()
        self._replaying = False
        self.commit_floor_ms = None
        self.offsets = OffsetTracker()
        self.assigned = set()
        self._end_offsets = {}
        if self.paused:
            self.paused = False
            self.metrics.paused.set(0)
        return dropped

    def release(self, request_id: str) -> None:
        """``request_id`` is done: its offset may be committed past."""
        self.release_all((request_id,))

    def release_all(self, request_ids: Iterable[str]) -> None:
        """Each of ``request_ids`` is done (a batch's): their offsets may be committed past,
        each record's once for all its requests here."""
        origin_of = self._origin
        done: dict[tuple[TopicPartition, int], int] = {}
        for rid in request_ids:
            origin = origin_of.pop(rid, None)
            if origin is not None:
                done[origin] = done.get(origin, 0) + 1
        for origin, n in done.items():
            self.offsets.release(*origin, n)
            if not self.offsets.holds(*origin):  # a pack's last request
                self._floor_at.pop(origin, None)

    def check_pressure(self) -> None:
        """Pause at max_held_requests, resume below 90 % of it."""
        limit = self.config.service.max_held_requests
        consumer = self._consumer
        if consumer is None:
            return
        if not self.paused and self.core.held >= limit:
            self.paused = True
            consumer.pause(*consumer.assignment())
            self.metrics.paused.set(1)
            log.warning("intake_paused", held=self.core.held, max_held_requests=limit)
        elif self.paused and self.core.held < _RESUME_AT * limit:
            self.paused = False
            consumer.resume(*consumer.assignment())
            self.metrics.paused.set(0)
            log.info("intake_resumed", held=self.core.held)

    async def update_lag(self) -> None:
        """Per tier: records not yet read, ``highwater - position`` (see :func:`consumer_lag`)."""
        consumer = self._consumer
        if consumer is None:
            return
        lag: dict[str, int] = {t: 0 for t in self.config.tier_names}
        by_topic = {self.topics.tier(t): t for t in self.config.tier_names}
        assigned = list(self.assigned)
        found = await consumer_lag(consumer, assigned)
        for tp in assigned:
            tier = by_topic.get(tp.topic)
            if tier is None:
                continue
            n = found.get(tp, 0)
            if self.paused and tp in self._end_offsets:
                # No fetch while paused, so the high watermark is stale: the end
                # offsets asked for meanwhile cover that (on Tansu they may be
                # behind the true end by one produce batch, never ahead).
                pos = self.offsets.position(tp)
                if pos is not None:
                    n = max(n, self._end_offsets[tp] - pos)
            lag[tier] += n
        for tier, n in lag.items():
            self.metrics.lag.labels(tier).set(n)

    async def commit_loop(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.commit()
            except Exception as e:  # noqa: BLE001 - e.g. the consumer stopped by a deposition
                log.warning("commit_failed", error=repr(e))
            if self.paused and self.assigned and self._consumer is not None:
                with contextlib.suppress(KafkaError):
                    self._end_offsets = await self._consumer.end_offsets(list(self.assigned))
            await self.update_lag()

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit each partition up to its oldest held request (or all it read)."""
        consumer = self._consumer
        # No group membership to check (the consumer assigns itself): the
        # service says whether this instance still leads within its lease.
        if consumer is None or not self._may_commit():
            return
        offsets = {tp: off for tp, off in self.offsets.to_commit().items()
                   if tp in self.assigned and (only is None or tp in only)}
        if offsets:
            floor = self._floor_now() if only is None else None
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
            self.offsets.committed(offsets)
            if floor is not None:
                # Every partition's committed position is now its oldest held one.
                self.commit_floor_ms = floor

    def _floor_now(self) -> int:
        """The floor if every partition were committed now (see the module doc)."""
        now_ms = int(time.time() * 1000)
        idle = self._takeover_floor_ms if self._replaying else now_ms
        floor = now_ms if idle is None else idle
        for tp in self.assigned:
            if self.offsets.held(tp):
                oldest = self.offsets.committable(tp)
                assert oldest is not None, "a partition with held requests was consumed"
                at = self._floor_at.get((tp, oldest))
                if at is not None:
                    floor = min(floor, at)
        return floor

"""Active/standby schedulers: leadership by the leader's own heartbeat on a Kafka log.

No coordinator beyond Kafka, and no consumer group: group sessions cannot
go below Apache Kafka's ``group.min.session.timeout.ms`` (6 s by default),
and a takeover that waits for the group to notice a dead member took about
two sessions. Instead every scheduler reads the one-partition topic
``<prefix>scheduler-leader`` from its recent records on, and folds it with
:class:`scheduler.leadership.LeaderLog` (the rules are there):

* the **leader** writes a ``beat`` every ``leader_silence_ms / 5``, and
  dispatches only while its **lease** holds: 0.7 ``leader_silence_ms``
  after sending a beat it has read back as valid (:class:`Lease`);
* a **standby** that read nothing from the leader for ``leader_silence_ms``
  (or read its ``resign``) while it could read the partition (fetches
  answered, the position not beyond the end: a broker that is down or lost
  its topics is not a silent leader), and has read the partition to its
  end, writes a ``claim`` after the leader's epoch and reads the log back
  to it: the first claim for that succession wins, and only the winner goes
  on;
* the winner beats at once, runs the service's takeover
  (``on_elected``: the predecessor's tier positions, fences on the batch
  partitions, what the predecessor dispatched; :mod:`scheduler.takeover`)
  and then leads;
* a leader that reads a newer leader in the log (it was paused, or its
  beats were late) stops at once (``on_deposed``); a leader that stops
  cleanly writes ``resign``.

Transitions: ``standby`` -> ``claiming`` -> ``taking_over`` -> ``leading``
-> (deposed) ``standby``. :attr:`LeaderElection.state` and ``epoch`` are
changed by :meth:`LeaderElection.run` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from plumbing.bounded import cancel_within, within
from plumbing.kafka import Consumer, KafkaSettings, make_consumer, stop_consumer
from scheduler.leadership import LeaderLog, Lease, next_epoch
from schemas.codec import DecodeError, codec_for, content_type
from schemas.messages import LeaderClaim

__all__ = ["LeaderElection", "next_epoch"]

log = structlog.get_logger("scheduler")

_claim_codec = codec_for(LeaderClaim)
_MSGPACK_HEADERS = [("content-type", content_type("msgpack").encode())]
#: Records of the leader partition read at start: this far back (a leader
#: beats five times per silence, so any live one is in it).
_LOOKBACK_S = 60.0
#: The lease, as a share of the silence: what is left of the silence after it
#: (0.3 s at 1 s) covers a batch checked against the lease just before it ends
#: and written a little later, before a successor could claim.
_LEASE_SHARE = 0.7
#: The longest the broker may hold a read of the leader partition, as a share of
#: the silence: a beat is read back (renewing the lease) or noticed missing
#: within about this much (the embedded broker holds an empty fetch for its
#: whole wait).
_FETCH_WAIT_SHARE = 0.05
#: Shortest wait of one read of the leader partition.
_MIN_WAIT_S = 0.01
#: Longest wait for a claim of ours to be read back before it counts as lost.
_CLAIM_READ_BACK_S = 5.0


class LeaderElection:
    """This instance's view of the leader partition, and the transitions it makes.

    Fixed at creation: the topic, the instance id, the callbacks, the
    silence. ``floor`` (a callable) and ``fenced_ms`` are the service's: what
    each beat says (see LeaderClaim).
    """

    def __init__(self, kafka: KafkaSettings, topic: str, instance: str, producer, *,
                 on_elected: Callable[[int], Awaitable[None]],
                 on_deposed: Callable[[], Awaitable[None]],
                 silence_ms: int, registry: CollectorRegistry | None = None):
        if silence_ms < 50:
            raise ValueError(f"leader_silence_ms must be at least 50, got {silence_ms}")
        self.kafka = kafka
        self.topic = topic
        self.instance = instance
        self.producer = producer
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.silence_s = silence_ms / 1000
        self.beat_every_s = self.silence_s / 5
        self.log = LeaderLog(self.silence_s)
        self.lease = Lease(self.silence_s * _LEASE_SHARE)
        self.state = "standby"
        self.epoch = 0
        #: When this instance last became leader (epoch ms), for the takeover figure.
        self.elected_ms: int | None = None
        #: What the beats say (set by the service).
        self.floor: Callable[[], int | None] = lambda: None
        self.fenced_ms: int | None = None
        self._tp = TopicPartition(topic, 0)
        self._consumer: Consumer | None = None
        self._claim: LeaderClaim | None = None
        self._claim_offset: int | None = None
        self._claim_sent_s = 0.0
        self._beats: dict[int, float] = {}  # beat sent_ms -> monotonic send time
        self._beat_task: asyncio.Task | None = None
        self._next_beat_s = 0.0
        self._takeover: asyncio.Task | None = None
        self._lapsed = False
        #: Since when (monotonic) this instance has been reading the partition without a
        #: break (None: it is not): silence counts only while it can read.
        self._reading_since: float | None = None
        r = registry if registry is not None else CollectorRegistry()
        self._leader_gauge = Gauge("sf_scheduler_leader",
                                   "1 while this instance is the active scheduler", registry=r)
        self._epoch_gauge = Gauge("sf_scheduler_leader_epoch",
                                  "Epoch this instance leads with (0: standby)", registry=r)
        self._changes = Counter("sf_scheduler_leadership_changes_total",
                                "Leadership transitions of this instance", ["change"],
                                registry=r)

    @property
    def consumer(self):
        """The leader-partition reader while started (for the topic keeper), else None."""
        return self._consumer

    @property
    def leading(self) -> bool:
        return self.state == "leading"

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Read the leader partition from its recent records on."""
        # Silence is measured from when a beat is read: a reader that waits
        # long on an empty fetch learns of each beat late (the embedded broker
        # holds an empty fetch for its whole wait).
        wait = min(self.kafka.follow_fetch_max_wait_ms,
                   max(10, int(self.silence_s * 1000 * _FETCH_WAIT_SHARE)))
        self._consumer = make_consumer(self.kafka, group_id=None, follower=True,
                                       fetch_max_wait_ms=wait)
        await self._consumer.start()
        await self.seek_recent()
        log.info("leader_log_followed", topic=self.topic, instance=self.instance,
                 silence_ms=round(self.silence_s * 1000))

    async def seek_recent(self) -> None:
        """Read from the first record younger than the lookback (a broker that lost its
        topics: from the new partition's start); silence counts from now."""
        consumer = self._consumer
        assert consumer is not None, "start() ran"
        consumer.assign([self._tp])
        since_ms = int((time.time() - _LOOKBACK_S) * 1000)
        try:
            found = await within(consumer.offsets_for_times({self._tp: since_ms}), 5)
            hit = found.get(self._tp)
            if hit is not None:
                consumer.seek(self._tp, hit.offset)
            else:
                end = (await within(consumer.end_offsets([self._tp]), 5)).get(self._tp)
                if end is not None:
                    consumer.seek(self._tp, end)
        except (KafkaError, TimeoutError) as e:
            log.warning("leader_log_seek_failed", error=repr(e))
        self.log.start(time.monotonic())

    async def stop(self) -> None:
        """Resign if leading (a standby claims at once), then stop reading."""
        if self._takeover is not None:
            await cancel_within([self._takeover], 5.0, "the takeover to end", log=log)
        if self.state in ("leading", "taking_over") and self.producer is not None:
            rec = LeaderClaim(instance=self.instance, epoch=self.epoch, kind="resign",
                              sent_ms=int(time.time() * 1000))
            with contextlib.suppress(KafkaError, TimeoutError):
                await within(self._send(rec), 3.0)
                log.info("leadership_resigned", epoch=self.epoch, instance=self.instance)
        if self._beat_task is not None:
            await cancel_within([self._beat_task], 2.0, "a beat to end", log=log)
        self.lease.end()
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await stop_consumer(self._consumer)
            self._consumer = None
        self._set("standby", count=False)

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        """Read the log; beat while leading; claim after the leader's silence."""
        while True:
            consumer = self._consumer
            assert consumer is not None, "start() ran"
            now = time.monotonic()
            wait_s = self.beat_every_s / 2
            if self.state in ("leading", "taking_over"):
                wait_s = min(wait_s, self._next_beat_s - now)
            # Never 0: a fetch that may not wait returns without yielding, and a
            # beat still in flight would then never be sent (the loop spins).
            wait_s = max(_MIN_WAIT_S, wait_s)
            try:
                got = await consumer.getmany(self._tp, timeout_ms=int(wait_s * 1000))
            except KafkaError as e:
                log.warning("leader_log_fetch_failed", error=repr(e))
                await asyncio.sleep(0.2)
                continue
            now = time.monotonic()
            for rec in got.get(self._tp, []):
                self._read(rec, now)
            await self._step(now)

    def _read(self, rec, now: float) -> None:
        try:
            claim = _claim_codec.decode_record(rec.value, rec.headers)
        except DecodeError as e:
            log.warning("leader_record_undecodable", offset=rec.offset, error=str(e)[:200])
            return
        seen = self.log.apply(claim, now)
        ours = claim.instance == self.instance and claim.epoch == self.epoch
        if ours and claim.kind == "beat" and seen == "beat":
            sent = self._beats.pop(claim.sent_ms, None)
            if sent is not None:
                self.lease.confirmed(sent)
        if self._claim is not None and rec.offset == self._claim_offset:
            self._claim_read(seen)

    def _claim_read(self, seen: str) -> None:
        claim, self._claim, self._claim_offset = self._claim, None, None
        assert claim is not None, "_read() found our claim"
        if seen != "claim_won":
            log.info("leader_claim_lost", epoch=claim.epoch, after=claim.after,
                     leader=self.log.current.instance if self.log.current else None)
            self._set("standby", count=False)
            return
        self.epoch = claim.epoch
        self.elected_ms = claim.sent_ms
        self.lease.confirmed(self._claim_sent_s)
        self._epoch_gauge.set(claim.epoch)
        self._set("taking_over", count=False)
        self._next_beat_s = 0.0
        log.warning("leadership_acquired", epoch=claim.epoch, after=claim.after,
                    instance=self.instance)
        self._takeover = asyncio.create_task(self._take_over(claim.epoch), name="takeover")

    async def _step(self, now: float) -> None:
        if self.state in ("leading", "taking_over"):
            if not self.log.leads(self.instance, self.epoch):
                await self._deposed()
                return
            if now >= self._next_beat_s and (self._beat_task is None or self._beat_task.done()):
                self._next_beat_s = now + self.beat_every_s
                self._beat_task = asyncio.create_task(self._beat(), name="leader-beat")
            if self.state == "leading":
                self.lease_valid()  # logs a lapse
            return
        if self.state == "claiming":
            if time.monotonic() - self._claim_sent_s > _CLAIM_READ_BACK_S:
                log.warning("leader_claim_unread", epoch=self._claim.epoch if self._claim else 0)
                self._claim = self._claim_offset = None
                self._set("standby", count=False)
            return
        if not self._reading(now):
            return
        assert self._reading_since is not None, "_reading() said it reads"
        if (now - self._reading_since >= self.silence_s and self.log.silent(now)
                and await self._caught_up()):
            await self._send_claim()

    def _reading(self, now: float) -> bool:
        """True while the partition answers: a fetch answered within half a silence, and
        the position not beyond its end (a broker that lost the partition answers a read
        there with nothing, and a standby would take the leader's beats for silence)."""
        consumer = self._consumer
        assert consumer is not None, "start() ran"
        try:
            polled_ms = consumer.last_poll_timestamp(self._tp)
        except AssertionError:  # not assigned (yet)
            polled_ms = None
        high = consumer.highwater(self._tp)
        pos = consumer.positions_now().get(self._tp)
        ok = (polled_ms is not None and time.time() * 1000 - polled_ms < self.silence_s * 500
              and high is not None and pos is not None and pos <= high)
        if not ok:
            self._reading_since = None
        elif self._reading_since is None:
            self._reading_since = now
        return ok

    def broker_lost(self) -> None:
        """The broker lost its topics: silence counts again from reading the new partition
        (the leader's beats resume once the topic is back)."""
        self._reading_since = None

    async def _caught_up(self) -> bool:
        assert self._consumer is not None, "start() ran"
        high = self._consumer.highwater(self._tp)
        try:
            pos = await within(self._consumer.position(self._tp), 1)
        except (KafkaError, TimeoutError):
            return False
        # No fetch answered yet (an empty partition): Kafka reports no high watermark.
        return (high is None and pos == 0) or (high is not None and pos >= high)

    async def _send_claim(self) -> None:
        claim = self.log.claim(self.instance, int(time.time() * 1000), self.epoch)
        cur = self.log.current
        log.info("leader_silent", leader=cur.instance if cur else None,
                 epoch=cur.epoch if cur else 0, resigned=bool(cur and cur.resigned),
                 claiming=claim.epoch)
        self._set("claiming", count=False)
        self._claim_sent_s = time.monotonic()
        try:
            md = await self._send(claim)
        except (KafkaError, TimeoutError) as e:
            log.warning("leader_claim_failed", error=repr(e))
            self._set("standby", count=False)
            await asyncio.sleep(0.2)
            return
        self._claim, self._claim_offset = claim, md.offset

    async def _take_over(self, epoch: int) -> None:
        try:
            await self.on_elected(epoch)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a failed takeover gives leadership up
            log.error("takeover_failed", epoch=epoch, error=repr(e))
            await self._resign_after_failure(epoch)
            return
        if self.state == "taking_over" and self.epoch == epoch:
            self._set("leading")
            log.info("leading", epoch=epoch, instance=self.instance)

    async def _resign_after_failure(self, epoch: int) -> None:
        rec = LeaderClaim(instance=self.instance, epoch=epoch, kind="resign",
                          sent_ms=int(time.time() * 1000))
        with contextlib.suppress(KafkaError, TimeoutError):
            await within(self._send(rec), 3.0)
        self._drop_leadership()
        await self.on_deposed()

    async def _deposed(self) -> None:
        cur = self.log.current
        log.warning("leadership_lost", epoch=self.epoch, instance=self.instance,
                    successor=cur.instance if cur else None,
                    successor_epoch=cur.epoch if cur else 0)
        if self._takeover is not None and not self._takeover.done():
            await cancel_within([self._takeover], 5.0, "the takeover to end", log=log)
        self._drop_leadership()
        self._set("standby")
        await self.on_deposed()

    def _drop_leadership(self) -> None:
        self.lease.end()
        self.epoch = 0
        self.fenced_ms = None
        self._reading_since = None  # silence counts afresh, from reading as a standby
        self._epoch_gauge.set(0)
        self._beats.clear()
        self._takeover = None
        self._set("standby", count=False)

    async def _beat(self) -> None:
        now_ms = int(time.time() * 1000)
        rec = LeaderClaim(instance=self.instance, epoch=self.epoch, kind="beat", sent_ms=now_ms,
                          after=(cur.after if (cur := self.log.current) is not None else 0),
                          floor_ms=self.floor(), fenced_ms=self.fenced_ms)
        self._beats[now_ms] = time.monotonic()
        while len(self._beats) > 64:
            del self._beats[next(iter(self._beats))]
        try:
            await self._send(rec)
        except (KafkaError, TimeoutError) as e:
            log.warning("leader_beat_failed", epoch=rec.epoch, error=repr(e))

    async def _send(self, rec: LeaderClaim):
        return await within(self.producer.send_and_wait(
            self.topic, _claim_codec.encode(rec), key=self.instance.encode(), partition=0,
            headers=_MSGPACK_HEADERS), self.kafka.produce_timeout_ms / 1000 + 1)

    # -- the lease ---------------------------------------------------------------

    def lease_valid(self) -> bool:
        """True within the lease of a beat (or the claim) read back as valid."""
        valid = self.lease.valid(time.monotonic())
        if not valid and not self._lapsed and self.state == "leading":
            self._lapsed = True
            log.warning("leader_lease_lapsed", epoch=self.epoch,
                        lease_s=round(self.lease.length_s, 3))
        elif valid and self._lapsed:
            self._lapsed = False
            log.info("leader_lease_renewed", epoch=self.epoch)
        return valid

    def _set(self, state: str, *, count: bool = True) -> None:
        self.state = state
        self._leader_gauge.set(1 if state == "leading" else 0)
        if count:
            self._changes.labels(state).inc()

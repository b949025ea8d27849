"""Active/standby schedulers: leadership through a Kafka consumer group.

No coordinator beyond Kafka. Every scheduler instance joins the consumer
group ``<prefix>scheduler-leader`` on the one-partition topic
``<prefix>scheduler-leader``; the instance the group assigns partition 0 to
is the **leader**. Only the leader joins the tier group and dispatches; the
others are **standbys**: they read the worker events all along (so their
slot registry is warm) and wait.

Terms
-----

* **Epoch.** A leader's number, higher than every earlier leader's: the
  larger of the wall clock in milliseconds at the takeover and one more than
  the highest epoch claimed so far in the leader partition (read before
  claiming), so it also grows across clock skew and after a broker restart
  that lost the partition. Batches (``Batch.epoch``) and snapshots
  (``SchedulerState.epoch``) carry it.
* **Claim.** Before dispatching, a new leader writes a
  :class:`~schemas.messages.LeaderClaim` with its epoch to the partition and
  waits for the acknowledgement.
* **Sticky assignment.** The group's assignor gives partition 0 to the
  member that already leads (each member's join metadata carries the epoch
  it leads with, or nothing), the highest epoch if two claim, else to the
  smallest member id. So a standby joining or leaving does not move
  leadership, and a member that was expelled while it still believed it led
  loses to the leader elected meanwhile.

Transitions, as the callbacks see them
--------------------------------------

* ``on_suspend`` (sync): the group is rebalancing and this instance led.
  Kafka revokes everything before every rebalance, so leadership is in
  doubt: dispatch stops at once, nothing else changes.
* ``on_resume`` (sync): the rebalance gave partition 0 back: leadership never
  passed to anyone else (assignments are exclusive per generation), so the
  same epoch continues.
* ``on_elected(epoch)`` (async): partition 0 is newly ours and the claim is
  acknowledged.
* ``on_deposed`` (async): the rebalance gave partition 0 to someone else.
  The service hands back everything it holds (the new leader replays it
  from the committed tier offsets).

How fast a standby takes over
-----------------------------

After a clean stop (``LeaveGroup``) within one group join (Tansu holds a
join for ``session_timeout_ms / 2``). After a crash (SIGKILL), only once the
group notices the dead member: after its session timeout (Tansu: ~1.5x the
session), then a join, then the tier group's join. The leader group has a
session timeout of its own for that reason (``leader_session_timeout_ms``).

The lease: no two leaders at once
---------------------------------

A leader that stalls (a long pause, a partition from the group coordinator)
for longer than its session is expelled and a standby takes over; when it
wakes, it would learn that only at its next heartbeat. So leadership also
needs a **lease**: :meth:`LeaderElection.lease_valid` is true only within
two thirds of a session after the last heartbeat (or join) the coordinator
accepted. An accepted heartbeat proves this instance still held partition
0 in the group's current generation, and the group can expel it only a full
session after that heartbeat, so the old leader stops dispatching before a
new one can be elected (assuming clocks that run at about the same rate).
As a backstop, workers drop a batch of an older epoch that follows a newer
epoch's batch on the same partition (see :meth:`worker.service.WorkerService._fenced`).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

import structlog
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from plumbing.bounded import within
from plumbing.kafka import KafkaSettings, make_consumer, stop_consumer
from schemas.codec import DecodeError, codec_for, content_type
from schemas.messages import LeaderClaim

__all__ = ["LeaderElection", "choose_leader", "next_epoch"]

log = structlog.get_logger("scheduler")

_claim_codec = codec_for(LeaderClaim)
_MSGPACK_HEADERS = [("content-type", content_type("msgpack").encode())]
_EPOCH = struct.Struct(">q")


def next_epoch(now_ms: int, highest_claimed: int, own_last: int = 0) -> int:
    """A new leader's epoch: above every claim seen and our own last, at least the clock."""
    return max(now_ms, highest_claimed + 1, own_last + 1)


def choose_leader(claims: Mapping[str, int]) -> str | None:
    """The member that gets partition 0, from each member's claimed epoch (0: none).

    The highest claim wins (the current leader, or the newest of two); with
    no claim, the smallest member id (any fixed rule would do).
    """
    if not claims:
        return None
    return min(claims, key=lambda m: (-claims[m], m))


class _KeepLeaderAssignor(AbstractPartitionAssignor):
    """Every partition of the leader topic to :func:`choose_leader`'s member.

    aiokafka calls assignors as classes; :meth:`LeaderElection.__init__`
    derives one subclass per instance so that its metadata says what this
    instance claims.
    """

    name = "sf-keep-leader"
    version = 0
    claimed: Callable[[], int] = staticmethod(lambda: 0)

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        epoch = cls.claimed()
        return ConsumerProtocolMemberMetadata(cls.version, sorted(topics),
                                              _EPOCH.pack(epoch) if epoch else b"")

    @classmethod
    def assign(cls, cluster, members: Mapping[str, ConsumerProtocolMemberMetadata]
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        claims = {m: _decode_epoch(md.user_data) for m, md in members.items()}
        leader = choose_leader(claims)
        topics = sorted({t for md in members.values() for t in md.subscription})
        out = {}
        for member in members:
            parts = []
            if member == leader:
                for t in topics:
                    ps = cluster.partitions_for_topic(t)
                    if ps:
                        parts.append((t, sorted(ps)))
            out[member] = ConsumerProtocolMemberAssignment(cls.version, parts, b"")
        return out

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass


def _decode_epoch(data: bytes | None) -> int:
    if not data or len(data) != _EPOCH.size:
        return 0
    return max(0, _EPOCH.unpack(data)[0])


class _Listener(ConsumerRebalanceListener):
    def __init__(self, election: LeaderElection):
        self.election = election

    async def on_partitions_revoked(self, revoked):
        self.election._revoked()

    async def on_partitions_assigned(self, assigned):
        await self.election._assigned(list(assigned))


class LeaderElection:
    """This instance's membership in the leader group, and the transitions it sees.

    Fixed at creation: the topic, the instance id, the callbacks. ``state``
    (``standby``, ``electing``, ``leading``, ``suspended``) and ``epoch``
    are changed by the listener and :meth:`run` alone.
    """

    def __init__(self, kafka: KafkaSettings, topic: str, group: str, instance: str, producer, *,
                 on_elected: Callable[[int], Awaitable[None]],
                 on_deposed: Callable[[], Awaitable[None]],
                 on_suspend: Callable[[], None], on_resume: Callable[[], None],
                 session_timeout_ms: int | None = None,
                 heartbeat_interval_ms: int | None = None,
                 registry: CollectorRegistry | None = None):
        self.kafka = kafka
        self.topic = topic
        self.group = group
        self.instance = instance
        self.producer = producer
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.on_suspend = on_suspend
        self.on_resume = on_resume
        self.session_timeout_ms = session_timeout_ms or kafka.session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms or min(
            kafka.heartbeat_interval_ms, self.session_timeout_ms // 3)
        self.state = "standby"
        self.epoch = 0
        #: Highest epoch read from the leader partition.
        self.highest_claimed = 0
        #: When this instance last became leader (epoch ms), for the takeover figure.
        self.elected_ms: int | None = None
        #: Lease length, two thirds of the session; None where aiokafka's
        #: heartbeat cannot be observed (then leadership rests on the revocation alone).
        self.lease_s: float | None = self.session_timeout_ms / 1000 * 2 / 3
        self._confirmed = 0.0
        self._lapsed = False
        self._tp = TopicPartition(topic, 0)
        self._generation = 0
        self._wake = asyncio.Event()
        self._consumer = None
        self._assignor = type("KeepLeaderAssignor", (_KeepLeaderAssignor,),
                              {"claimed": staticmethod(self._claimed)})
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
        """The leader-group consumer while started (for the topic keeper), else None."""
        return self._consumer

    @property
    def leading(self) -> bool:
        return self.state == "leading"

    def _claimed(self) -> int:
        return self.epoch if self.state in ("leading", "suspended") else 0

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        self._consumer = make_consumer(
            self.kafka, group_id=self.group, follower=True, session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            partition_assignment_strategy=(self._assignor,))
        self._consumer.subscribe([self.topic], listener=_Listener(self))
        await self._consumer.start()
        self._observe_heartbeats()
        log.info("leader_election_joined", group=self.group, instance=self.instance,
                 session_timeout_ms=self.session_timeout_ms)

    async def stop(self) -> None:
        """Leave the group (a standby takes over within one join)."""
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await stop_consumer(self._consumer)
            self._consumer = None
        self._set("standby", count=False)

    async def run(self) -> None:
        """Read claims; finish an election once the partition is read to its end."""
        consumer = self._consumer
        while True:
            try:
                got = await consumer.getmany(timeout_ms=200)
            except KafkaError as e:
                log.warning("leader_claims_fetch_failed", error=repr(e))
                await asyncio.sleep(0.5)
                continue
            for rec in got.get(self._tp, []):
                try:
                    claim = _claim_codec.decode_record(rec.value, rec.headers)
                except DecodeError:
                    continue
                self.highest_claimed = max(self.highest_claimed, claim.epoch)
            if self.state == "electing" and await self._caught_up():
                await self._claim(self._generation)

    # -- the lease ---------------------------------------------------------------

    def lease_valid(self) -> bool:
        """True within ``lease_s`` of the last heartbeat or join the coordinator accepted."""
        if self.lease_s is None:
            return True
        valid = time.monotonic() - self._confirmed < self.lease_s
        if not valid and not self._lapsed and self.state == "leading":
            self._lapsed = True
            log.warning("leader_lease_lapsed", epoch=self.epoch, lease_s=round(self.lease_s, 2))
        return valid

    def _confirm(self) -> None:
        self._confirmed = time.monotonic()
        if self._lapsed:
            self._lapsed = False
            if self.state == "leading":
                log.info("leader_lease_renewed", epoch=self.epoch)
                self.on_resume()

    def _observe_heartbeats(self) -> None:
        """Note each accepted heartbeat (aiokafka 0.14 internals, read defensively)."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        beat = getattr(coordinator, "_do_heartbeat", None)
        if beat is None:
            self.lease_s = None
            log.warning("leader_lease_unavailable",
                        detail="cannot observe heartbeats; relying on revocation alone")
            return

        async def heartbeat():
            ok = await beat()
            if ok:
                self._confirm()
            return ok
        coordinator._do_heartbeat = heartbeat

    # -- transitions -------------------------------------------------------------

    def _revoked(self) -> None:
        self._generation += 1
        if self.state == "leading":
            self._set("suspended")
            self.on_suspend()
        elif self.state == "electing":
            self._set("standby", count=False)

    async def _assigned(self, assigned: list[TopicPartition]) -> None:
        self._generation += 1
        self._confirm()  # the join and sync just succeeded
        ours = self._tp in assigned
        if ours and self.state == "suspended":
            self._set("leading", count=False)
            log.info("leadership_kept", epoch=self.epoch, instance=self.instance)
            self.on_resume()
        elif ours:
            self._set("electing", count=False)
        elif self.state == "suspended":
            self._set("standby")
            log.warning("leadership_lost", epoch=self.epoch, instance=self.instance)
            self.epoch = 0
            self._epoch_gauge.set(0)
            await self.on_deposed()

    async def _caught_up(self) -> bool:
        high = self._consumer.highwater(self._tp)
        if high is None:
            return False
        try:
            return await within(self._consumer.position(self._tp), 1) >= high
        except (KafkaError, TimeoutError):
            return False

    async def _claim(self, generation: int) -> None:
        now_ms = int(time.time() * 1000)
        epoch = next_epoch(now_ms, self.highest_claimed, self.epoch)
        claim = LeaderClaim(instance=self.instance, epoch=epoch, sent_ms=now_ms)
        try:
            await self.producer.send_and_wait(self.topic, _claim_codec.encode(claim),
                                              key=self.instance.encode(), partition=0,
                                              headers=_MSGPACK_HEADERS)
        except KafkaError as e:
            log.warning("leader_claim_failed", error=repr(e))
            await asyncio.sleep(0.5)
            return
        if generation != self._generation or self.state != "electing":
            return  # a rebalance came in between: its outcome decides
        self.highest_claimed = max(self.highest_claimed, epoch)
        self.epoch = epoch
        self.elected_ms = now_ms
        self._epoch_gauge.set(epoch)
        self._set("leading")
        log.warning("leadership_acquired", epoch=epoch, instance=self.instance)
        await self.on_elected(epoch)

    def _set(self, state: str, *, count: bool = True) -> None:
        self.state = state
        self._leader_gauge.set(1 if state == "leading" else 0)
        if count:
            self._changes.labels(state).inc()

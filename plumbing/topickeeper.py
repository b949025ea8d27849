"""Noticing a broker that lost its topics, and putting them back.

A Kafka cluster keeps its topics across restarts; the embedded Tansu broker
(memory storage) does not: after a restart every topic, record, group and
committed offset is gone, while the clients reconnect as if nothing
happened. What each kind of client then does, measured with aiokafka 0.14:

* a **producer** writing to a topic that no longer exists gets an
  acknowledgement, and the record is gone: nothing reads it back;
* a **group consumer** is told its member id is unknown, rejoins, finds no
  committed offset and starts at the earliest one: it recovers by itself
  once the topic exists again;
* an **assigned consumer** (no group: the scheduler's worker events,
  admission's scheduler state, a client's replies) keeps its position, say
  5000, and fetches nothing from a new topic until it has 5000 records;
  Tansu answers a fetch beyond the end with no records rather than
  ``OFFSET_OUT_OF_RANGE``, so ``auto_offset_reset`` never applies. A group
  consumer lands there too when an old offset was committed into the new
  group (a commit sent before the member noticed the group was gone).

So every service runs a :class:`TopicKeeper`. Every ``interval_s`` it asks
for the metadata of its own topics (one request, auto-creation off) and
checks the positions of the consumers it follows. Evidence of a lost broker:
a topic missing, a topic whose partition count changed (auto-created by some
client with the broker's default), a followed partition whose high
watermark is below our position at the same position two checks in a row
(stuck beyond the end: one sighting under a burst of writes was a lagging
high watermark, not a restart), or a record we wrote landing at a lower
offset than one we wrote before (:meth:`TopicKeeper.wrote`): whoever
recreated the topics first, every service sees one of these. Then it logs **one** ``broker_restarted``
warning per incident with the evidence, recreates the topics
(:func:`~plumbing.topics.ensure_topics`, idempotent: another service may
have done it already), moves every followed partition found beyond its
end back to the beginning (what ``auto_offset_reset = earliest`` would do
on Kafka), and calls the service's ``on_lost`` hook, which re-seeks what it
follows and forgets what the broker forgot. A failed
recreation is retried at the next check; nothing raises out of the loop.

Whatever was written between the restart and the recreation is lost (the
first bullet): requests in it get no result, and clients time out (or are
told, see :class:`producer.client.FairnessClient`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

import structlog
from aiokafka.protocol.metadata import MetadataRequest

from plumbing.background import Background
from plumbing.bounded import within
from plumbing.kafka import KafkaSettings
from plumbing.topics import ensure_topics

__all__ = ["TopicKeeper", "truncated"]

log = structlog.get_logger("broker")

_UNKNOWN_TOPIC = 3


async def truncated(consumer, timeout_s: float = 0.5) -> dict:
    """Assigned partitions whose high watermark is below the consumer's position: tp -> position."""
    out = {}
    for tp in consumer.assignment():
        high = consumer.highwater(tp)
        if high is None:
            continue
        pos = None
        with contextlib.suppress(Exception):  # no position now: nothing to compare
            pos = await within(consumer.position(tp), timeout_s)
        if pos is not None and high < pos:
            out[tp] = pos
    return out


class TopicKeeper(Background):
    """Checks ``specs()`` (topic -> partitions) through ``client`` (an ``AIOKafkaClient``).

    ``follow()`` returns the consumers whose positions to check (the
    assigned ones). ``on_lost`` runs after the topics are back. Mutable
    state (known partition counts, the incident clock) is the loop's alone.
    """

    def __init__(self, kafka: KafkaSettings, client, specs: Callable[[], Mapping[str, int]], *,
                 service: str, on_lost: Callable[[], Awaitable[None]] | None = None,
                 follow: Callable[[], Iterable] = tuple, interval_s: float = 1.0,
                 timeout_s: float = 2.0, quiet_s: float = 30.0):
        self.kafka = kafka
        self.client = client
        self.specs = specs
        self.service = service
        self.on_lost = on_lost
        self.follow = follow
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        #: Evidence within this long of the last ``broker_restarted`` line is
        #: the same incident: acted on, not logged again.
        self.quiet_s = quiet_s
        self.incidents = 0
        self._counts: dict[str, int] = {}
        self._last_logged = -float("inf")
        self._pending: list[str] | None = None
        self._written: dict = {}
        self._went_back: list[str] = []
        #: Partitions seen beyond their high watermark at the last check: tp -> position.
        self._beyond: dict = {}
        self.task_name = f"{service}-topic-keeper"

    def known(self, counts: Mapping[str, int]) -> None:
        """Partition counts as created at start (``ensure_topics``' answer)."""
        self._counts.update(counts)

    def wrote(self, tp, offset: int) -> None:
        """Note where a record of ours landed; an offset going back is evidence."""
        last = self._written.get(tp)
        if last is not None and offset < last:
            self._went_back.append(f"our writes to {tp.topic}[{tp.partition}] went back "
                                   f"from offset {last} to {offset}")
        self._written[tp] = offset

    async def metadata(self, topics: list[str]) -> dict[str, int] | None:
        """Partitions per existing topic of ``topics``; None when no broker answered."""
        nodes = [b.nodeId for b in self.client.cluster.brokers()]
        random.shuffle(nodes)
        request = MetadataRequest(topics, allow_auto_topic_creation=False)
        for node in nodes:
            resp = None
            with contextlib.suppress(Exception):  # try the next broker, or the next round
                resp = await within(self.client.send(node, request), self.timeout_s)
            if resp is not None:
                return {t[1]: len(t[3]) for t in resp.topics if t[0] != _UNKNOWN_TOPIC}
        return None

    async def check(self) -> list[str]:
        """Evidence that the broker lost state (empty: none)."""
        specs = self.specs()
        counts = await self.metadata(sorted(specs))
        if counts is None:
            return []  # unreachable: the broker probe reports that, not us
        evidence, self._went_back = self._went_back, []
        evidence += [f"missing {t}" for t in sorted(specs) if t not in counts]
        evidence += [f"partitions of {t}: {self._counts[t]} -> {n}" for t, n in counts.items()
                     if t in self._counts and n != self._counts[t]]
        seen: dict = {}
        for consumer in self.follow():
            if consumer is None:
                continue
            found = await truncated(consumer)
            seen.update(found)
            # Evidence only when a consumer is stuck beyond the end: the same
            # position, above the high watermark, at two checks in a row. One
            # sighting is not enough: under a burst of writes the broker's
            # high watermark in a fetch answer can lag the records it just
            # returned, and a client that took that for a restart declared
            # thousands of requests in flight lost while nothing was.
            beyond = [tp for tp, pos in found.items() if self._beyond.get(tp) == pos]
            evidence += [f"high watermark of {tp.topic}[{tp.partition}] below our position"
                         for tp in beyond]
            if beyond:
                with contextlib.suppress(Exception):  # revoked meanwhile: its owner resets
                    await consumer.seek_to_beginning(*beyond)
                for tp in beyond:
                    seen.pop(tp, None)
        self._beyond = seen
        return evidence

    async def recover(self, evidence: list[str]) -> bool:
        """Log (once per incident), recreate the topics, run ``on_lost``; True when done."""
        now = time.monotonic()
        if now - self._last_logged > self.quiet_s:
            self.incidents += 1
            log.warning("broker_restarted", service=self.service, evidence=evidence[:10],
                        detail="the broker lost topics or records; recreating the topics, "
                               "what was written since the restart is lost")
        self._last_logged = now
        specs = self.specs()
        try:
            counts = await ensure_topics(self.kafka, specs)
        except Exception as e:  # noqa: BLE001 - retried at the next check
            log.warning("topics_recreate_failed", service=self.service, error=repr(e))
            return False
        self._counts.update(counts)
        if self.on_lost is not None:
            try:
                await self.on_lost()
            except Exception as e:  # noqa: BLE001 - retried at the next check
                log.warning("broker_recovery_failed", service=self.service, error=repr(e))
                return False
        log.info("topics_recreated", service=self.service, topics=len(counts))
        return True

    async def run(self) -> None:
        while True:
            try:
                evidence = self._pending or await self.check()
                self._pending = None
                if evidence and not await self.recover(evidence):
                    self._pending = evidence
            except Exception as e:  # noqa: BLE001 - the keeper must never stop the service
                log.warning("topic_check_failed", service=self.service, error=repr(e))
            await asyncio.sleep(self.interval_s)


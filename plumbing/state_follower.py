"""Following the scheduler's state topic: the latest snapshots, handed to a callback.

The leader publishes a :class:`~schemas.messages.SchedulerState` every
``service.state_interval_ms``: admission's throttle predicts waits from it,
and every scheduler instance keeps it so a standby knows the leader's
adaptive costs (:mod:`scheduler.handover`). A :class:`StateFollower` reads
that topic without a group, from snapshots at most ``since_s`` old (older
ones would be stale anyway), and hands each decoded snapshot to
``on_state``. It runs as a task of its own and never stops its service: an
undecodable record goes to ``on_undecodable`` (logged by default) and is
skipped, a failed fetch is retried. :meth:`StateFollower.seek_recent` starts
over from the recent snapshots (a broker that lost its topics).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from plumbing.background import Background
from plumbing.kafka import Consumer, KafkaSettings, make_consumer, stop_consumer
from schemas.codec import DecodeError, codec_for
from schemas.messages import SchedulerState

__all__ = ["StateFollower"]

log = structlog.get_logger("state")

_state_codec = codec_for(SchedulerState)


class StateFollower(Background):
    """Reads ``topic`` from recent snapshots on and calls ``on_state`` for each."""

    task_name = "scheduler-state-follower"

    def __init__(self, kafka: KafkaSettings, topic: str,
                 on_state: Callable[[SchedulerState], None], *, since_s: float = 60.0,
                 on_undecodable: Callable[[object, DecodeError], None] | None = None):
        self.kafka = kafka
        self.topic = topic
        self.on_state = on_state
        self.on_undecodable = on_undecodable or _log_undecodable
        self.since_s = since_s
        self.read = 0
        self.consumer: Consumer | None = None

    # An async start (the consumer is started and placed before the loop
    # runs): its callers await it; it is never handed to Service.keep.
    async def start(self) -> StateFollower:  # type: ignore[override]
        self.consumer = make_consumer(self.kafka, group_id=None, follower=True)
        await self.consumer.start()
        await self.seek_recent()
        return super().start()

    async def seek_recent(self) -> None:
        """Read from the first snapshot younger than ``since_s`` (or from now on)."""
        assert self.consumer is not None, "start() ran"
        partitions = self.consumer.partitions_for_topic(self.topic) or {0}
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self.consumer.assign(tps)
        since_ms = int((time.time() - self.since_s) * 1000)
        try:
            found = await self.consumer.offsets_for_times({tp: since_ms for tp in tps})
            for tp in tps:
                hit = found.get(tp)
                if hit is not None:
                    self.consumer.seek(tp, hit.offset)
                else:  # nothing that recent: only what comes from now on
                    end = (await self.consumer.end_offsets([tp])).get(tp)
                    if end is not None:
                        self.consumer.seek(tp, end)
        except KafkaError as e:
            log.warning("scheduler_state_seek_failed", error=repr(e))

    async def run(self) -> None:
        while True:
            try:
                assert self.consumer is not None, "start() ran"
                batches = await self.consumer.getmany(timeout_ms=500)
            except KafkaError as e:
                log.warning("scheduler_state_fetch_failed", error=repr(e))
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for rec in records:
                    try:
                        state = _state_codec.decode_record(rec.value, rec.headers)
                    except DecodeError as e:
                        self.on_undecodable(rec, e)
                        continue
                    self.read += 1
                    self.on_state(state)

    async def stop(self) -> None:
        await super().stop()
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                await stop_consumer(self.consumer)
            self.consumer = None


def _log_undecodable(rec, e: DecodeError) -> None:
    log.warning("scheduler_state_undecodable", offset=rec.offset, error=str(e)[:300])

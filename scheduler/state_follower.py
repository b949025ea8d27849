"""Every scheduler instance reads the state topic, so a standby knows the leader's costs.

The leader publishes a :class:`~schemas.messages.SchedulerState` every
``service.state_interval_ms`` (for admission's throttle, and with its
adaptive costs for a successor: see :mod:`scheduler.handover`). A
:class:`StateFollower` reads that one-partition topic without a group, from
snapshots at most ``since_s`` old (older ones would be stale anyway), and
hands each decoded snapshot to a callback. It runs as a task of its own and
never stops the scheduler: a broken record is skipped, a failed fetch retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer, stop_consumer
from schemas.codec import DecodeError, codec_for
from schemas.messages import SchedulerState

__all__ = ["StateFollower"]

log = structlog.get_logger("scheduler")

_state_codec = codec_for(SchedulerState)


class StateFollower:
    """Reads ``topic`` from recent snapshots on and calls ``on_state`` for each."""

    def __init__(self, kafka: KafkaSettings, topic: str,
                 on_state: Callable[[SchedulerState], None], *, since_s: float = 60.0):
        self.kafka = kafka
        self.topic = topic
        self.on_state = on_state
        self.since_s = since_s
        self.read = 0
        self._consumer = None
        self._task: asyncio.Task | None = None

    async def start(self) -> StateFollower:
        self._consumer = make_consumer(self.kafka, group_id=None)
        await self._consumer.start()
        partitions = self._consumer.partitions_for_topic(self.topic) or {0}
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        since_ms = int((time.time() - self.since_s) * 1000)
        try:
            found = await self._consumer.offsets_for_times({tp: since_ms for tp in tps})
            for tp in tps:
                hit = found.get(tp)
                if hit is not None:
                    self._consumer.seek(tp, hit.offset)
                else:  # nothing that recent: only what comes from now on
                    end = (await self._consumer.end_offsets([tp])).get(tp)
                    if end is not None:
                        self._consumer.seek(tp, end)
        except KafkaError as e:
            log.warning("scheduler_state_seek_failed", error=repr(e))
        self._task = asyncio.create_task(self._run(), name="scheduler-state-follower")
        return self

    async def _run(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=500)
            except KafkaError as e:
                log.warning("scheduler_state_fetch_failed", error=repr(e))
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for rec in records:
                    try:
                        state = _state_codec.decode_record(rec.value, rec.headers)
                    except DecodeError as e:
                        log.warning("scheduler_state_undecodable", offset=rec.offset,
                                    error=str(e)[:300])
                        continue
                    self.read += 1
                    self.on_state(state)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await stop_consumer(self._consumer)
            self._consumer = None

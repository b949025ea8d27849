"""A partition's unread records never hold back the fetch of a quiet partition."""

from __future__ import annotations

import asyncio
import time
import types

import aiokafka.consumer.fetcher as fetcher_module
import pytest
from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer, make_producer
from plumbing.topics import ensure_topics

pytestmark = pytest.mark.integration


async def _fetched_while_busy_unread(kafka_settings: KafkaSettings, topic: str,
                                     monkeypatch: pytest.MonkeyPatch,
                                     **consumer_kwargs) -> bool:
    """Read one slice of a backlog on p0, write one record to p1, and say whether the
    consumer fetches p1 while the rest of p0's fetch is still unread.

    aiokafka's fetcher clock is frozen after the first slice, so a backoff
    counted on it never runs out: what is fetched is fetched because nothing
    held it back, not because time passed.
    """
    await ensure_topics(kafka_settings, {topic: 2})
    busy, quiet = TopicPartition(topic, 0), TopicPartition(topic, 1)
    producer = make_producer(kafka_settings)
    await producer.start()
    consumer = make_consumer(kafka_settings, group_id=None, **consumer_kwargs)
    await consumer.start()
    try:
        for i in range(2_000):
            await producer.send(topic, b"burst %d" % i, partition=0)
        await producer.flush()
        consumer.assign([busy, quiet])
        await consumer.seek_to_beginning(busy, quiet)
        async with asyncio.timeout(30):
            while not (got := await consumer.getmany(timeout_ms=200, max_records=100)):
                pass
        assert set(got) == {busy} and len(got[busy]) == 100
        records = consumer._fetcher._records
        assert busy in records, "the rest of the burst's fetch is not buffered unread"
        frozen = time.monotonic()
        monkeypatch.setattr(fetcher_module, "time", types.SimpleNamespace(
            monotonic=lambda: frozen, time=time.time))
        await producer.send_and_wait(topic, b"quiet", partition=1)
        for _ in range(300):  # 3 s of event-loop turns: far more than one fetch needs
            if quiet in records:
                break
            await asyncio.sleep(0.01)
        assert busy in records, "the burst's unread records were handed out meanwhile"
        return quiet in records
    finally:
        await consumer.stop()
        await producer.stop()


async def test_a_quiet_partition_is_fetched_while_a_busy_ones_records_wait_unread(
        kafka_settings: KafkaSettings, topic_prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours fetches the quiet partition while 1,900 burst records wait in its buffer."""
    assert await _fetched_while_busy_unread(kafka_settings, f"{topic_prefix}fb", monkeypatch)


async def test_with_aiokafkas_backoff_the_quiet_partition_waits_for_the_busy_one(
        kafka_settings: KafkaSettings, topic_prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: aiokafka's own 100 ms backoff, on a clock that does not move, never
    lets the quiet partition's fetch go while the busy one's records are unread."""
    assert not await _fetched_while_busy_unread(kafka_settings, f"{topic_prefix}fa",
                                                monkeypatch, prefetch_backoff_s=0.1)

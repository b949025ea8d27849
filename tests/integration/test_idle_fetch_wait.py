"""Consumers that know nothing is due to them poll at ``idle_fetch_max_wait_ms``.

A client with no request in flight (its reply topic), the scheduler with no
batch out (its worker events); each at ``fetch_max_wait_ms`` otherwise.
Counted as fetch requests sent, on the embedded broker.
"""

from __future__ import annotations

import asyncio
import time

from plumbing.kafka import make_producer
from plumbing.topics import ensure_topics
from producer.client import FairnessClient
from scheduler.service import SchedulerService
from schemas.codec import codec_for, content_type
from schemas.messages import Result
from schemas.topics import Topics
from tests.integration.pipeline_setup import (
    fake_worker,
    make_config,
    produce,
    request,
    running,
    until,
)


def count_fetches(consumer) -> list[float]:
    """Record the time of every fetch request ``consumer`` sends from now on."""
    kafka_client = consumer._client
    sent: list[float] = []
    send = kafka_client.send

    def counting(node_id, request, *args, **kwargs):
        if type(request).__name__.startswith("FetchRequest"):
            sent.append(time.monotonic())
        return send(node_id, request, *args, **kwargs)

    kafka_client.send = counting
    return sent


async def fetches_within(sent: list[float], seconds: float) -> int:
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    return sum(t0 <= t < t0 + seconds for t in sent)


async def test_a_client_with_nothing_in_flight_polls_at_the_idle_wait(kafka_settings,
                                                                     topic_prefix):
    """On the embedded broker, with no services: the request stays in flight until the
    test answers it on the reply topic itself."""
    cfg = make_config(topic_prefix)
    await ensure_topics(kafka_settings, Topics.of(cfg).all(cfg))
    fast, idle = kafka_settings.fetch_max_wait_ms, kafka_settings.idle_fetch_max_wait_ms
    assert idle >= 4 * fast  # the comparison below needs the waits apart
    async with FairnessClient(kafka_settings, cfg) as client:
        consumer = client._consumer
        sent = count_fetches(consumer)
        assert consumer.fetch_wait_ms == idle
        idle_fetches = await fetches_within(sent, 1.0)

        rid = await client.submit({"org": "acme", "endpoint": "embed",
                                   "input": {"type": "embed", "texts": ["hello"]}})
        assert consumer.fetch_wait_ms == fast
        busy_fetches = await fetches_within(sent, 1.0)
        # At 10 ms the broker answers an empty fetch ~100 times a second, at
        # 50 ms ~20: half is far from both.
        assert idle_fetches * 2 < busy_fetches, (idle_fetches, busy_fetches)

        producer = make_producer(kafka_settings)
        await producer.start()
        try:
            await producer.send_and_wait(
                client.reply_topic,
                codec_for(Result).encode(Result(id=rid, status="ok", org="acme",
                                                endpoint="embed"), "json"),
                headers=[("content-type", content_type("json").encode())])
        finally:
            await producer.stop()
        result = await client.result(rid, timeout=10)
        assert result.id == rid
        assert consumer.fetch_wait_ms == idle


async def test_the_scheduler_with_no_batch_out_polls_worker_events_at_the_idle_wait(
        kafka_settings, topic_prefix):
    """A fake model that takes 3 s a batch keeps one batch out while the fetches are counted."""
    cfg = make_config(topic_prefix, slots=1)
    topics = Topics.of(cfg)
    fast, idle = kafka_settings.fetch_max_wait_ms, kafka_settings.idle_fetch_max_wait_ms
    sched = SchedulerService(cfg, kafka_settings)
    worker = fake_worker(cfg, kafka_settings, "w-a", model="fake:ms_per_batch=3000")
    async with running(sched), running(worker):
        await until(lambda: sched.flow.workers, "the worker to be seen by the scheduler")
        consumer = sched._event_consumer
        sent = count_fetches(consumer)
        await until(lambda: consumer.fetch_wait_ms == idle, "the idle wait with no batch out")
        idle_fetches = await fetches_within(sent, 1.0)

        await produce(kafka_settings, lambda r: topics.tier(r.tier),
                      [request(0, "acme", ["hello world"], topics=topics)])
        await until(lambda: sched.flow.in_flight, "the batch to be out")
        assert consumer.fetch_wait_ms == fast
        busy_fetches = await fetches_within(sent, 1.0)
        assert sched.flow.in_flight, "the batch came back before the fetches were counted"
        assert idle_fetches * 2 < busy_fetches, (idle_fetches, busy_fetches)

        await until(lambda: not sched.flow.in_flight, "the batch to be reported done")
        await until(lambda: consumer.fetch_wait_ms == idle, "the idle wait again", 5)

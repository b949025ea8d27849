"""A client polls its reply topic slowly while nothing is in flight, at full speed otherwise.

On the embedded broker, with no services: the request stays in flight until
the test answers it on the reply topic itself.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from plumbing.kafka import make_producer
from plumbing.topics import ensure_topics
from producer.client import FairnessClient
from schemas.codec import codec_for, content_type
from schemas.messages import Result
from schemas.topics import Topics
from tests.integration.pipeline_setup import make_config


def count_fetches(client: FairnessClient) -> list[float]:
    """Record the time of every fetch request the client's consumer sends from now on."""
    kafka_client = client._consumer._client
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
    cfg = make_config(topic_prefix)
    await ensure_topics(kafka_settings, Topics.of(cfg).all(cfg))
    # The default idle wait is the busy one on the embedded broker
    # (KafkaSettings); a deployment that sets it longer gets this.
    kafka_settings = msgspec.structs.replace(kafka_settings, idle_fetch_max_wait_ms=50)
    fast, idle = kafka_settings.fetch_max_wait_ms, kafka_settings.idle_fetch_max_wait_ms
    assert idle >= 4 * fast  # the comparison below needs the waits apart
    async with FairnessClient(kafka_settings, cfg) as client:
        consumer = client._consumer
        sent = count_fetches(client)
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

"""A client's in-flight bound: a submit past it waits for a result, and says so when none comes.

On the embedded broker, with no services: requests stay in flight until the
test answers them on the reply topic itself.
"""

from __future__ import annotations

import asyncio

import pytest

from plumbing.kafka import make_producer
from plumbing.topics import ensure_topics
from producer.client import FairnessClient
from schemas.codec import codec_for, content_type
from schemas.messages import Request, Result
from schemas.topics import Topics
from tests.integration.pipeline_setup import Reader, make_config


def request(i: int) -> dict:
    return {"id": f"r{i}", "org": "acme", "endpoint": "embed",
            "input": {"type": "embed", "texts": [f"text {i}"]}}


async def answer(kafka_settings, client: FairnessClient, rid: str) -> None:
    producer = make_producer(kafka_settings)
    await producer.start()
    try:
        await producer.send_and_wait(
            client.reply_topic,
            codec_for(Result).encode(Result(id=rid, status="ok", org="acme", endpoint="embed"),
                                     "json"),
            headers=[("content-type", content_type("json").encode())])
    finally:
        await producer.stop()


@pytest.fixture
async def cfg(kafka_settings, topic_prefix):
    """The test's configuration, its topics made."""
    config = make_config(topic_prefix)
    await ensure_topics(kafka_settings, Topics.of(config).all(config))
    return config


async def ingress_ids(kafka_settings, cfg) -> list[str]:
    """The ids of every request the ingress topic holds."""
    async with Reader(kafka_settings, Topics.of(cfg).ingress, cfg.service.ingress_partitions,
                      typ=Request) as reader:
        await reader.settle(quiet_s=0)
    return [r.id for r in reader.items]


async def test_a_submit_past_the_bound_waits_for_a_result(kafka_settings, cfg):
    async with FairnessClient(kafka_settings, cfg, max_in_flight=2,
                              in_flight_wait_s=30) as client:
        await client.submit(request(0))
        await client.submit(request(1))
        third = asyncio.create_task(client.submit(request(2)))
        await asyncio.sleep(0.5)
        assert not third.done(), "two in flight: the third waits"
        assert client.waiting == 2
        await answer(kafka_settings, client, "r0")
        assert await asyncio.wait_for(third, 10) == "r2"
        assert client.waiting == 2
        # A resubmitted id already in flight takes no new room: it does not wait.
        assert await asyncio.wait_for(client.submit(request(1)), 5) == "r1"
        # One abandoned (its caller went away) frees its room as a result does.
        fourth = asyncio.create_task(client.submit(request(3)))
        await asyncio.sleep(0.3)
        assert not fourth.done(), "two in flight: the fourth waits"
        client.abandon("r1")
        assert await asyncio.wait_for(fourth, 5) == "r3"
    ids = await ingress_ids(kafka_settings, cfg)
    assert sorted(ids) == ["r0", "r1", "r1", "r2", "r3"]


async def test_a_bound_no_result_frees_says_what_it_waited_for(kafka_settings, cfg):
    async with FairnessClient(kafka_settings, cfg, max_in_flight=1,
                              in_flight_wait_s=0.3) as client:
        await client.submit(request(0))
        with pytest.raises(TimeoutError, match=r"0.3 s .* 1 requests in flight "
                                               r"\(max_in_flight = 1\).*not sent"):
            await client.submit(request(1))
        assert client.waiting == 1
    ids = await ingress_ids(kafka_settings, cfg)
    assert ids == ["r0"], "the one past the bound was not sent"


async def test_a_submit_waiting_for_room_ends_when_the_client_stops(kafka_settings, cfg):
    client = FairnessClient(kafka_settings, cfg, max_in_flight=1, in_flight_wait_s=60)
    await client.start()
    await client.submit(request(0))
    waiting = asyncio.create_task(client.submit(request(1)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await client.stop()
    with pytest.raises(RuntimeError, match="stopped while a submit waited for room"):
        await asyncio.wait_for(waiting, 5)


def test_a_bound_under_one_is_refused(kafka_settings):
    with pytest.raises(ValueError, match="max_in_flight must be 1 or more, not 0"):
        FairnessClient(kafka_settings, max_in_flight=0)

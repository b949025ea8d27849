"""Packed replies end to end: client -> admission -> scheduler -> worker -> client.

Three clients send through the in-process pipeline: two ask for packed
replies (one in JSON, one in msgpack), one does not. Every request comes
back once; on the reply topics themselves (read raw, each record as it was
written) every result is there exactly once, the packed clients' topics
hold packs, none larger than ``service.max_message_bytes`` (set low enough
that a micro-batch's results need more than one), and the other client's
topic holds plain records only. The HTTP gateway, built on the client,
gets its results packed too and answers each request.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import msgspec
import pytest
from aiokafka.structs import TopicPartition

from app.stack import Stack
from gateway.keys import hash_key, new_key
from plumbing.kafka import KafkaSettings, make_consumer, stop_consumer
from plumbing.service_settings import GatewaySettings
from producer.client import FairnessClient, results_in
from producer.service import AdmissionService, AdmissionSettings
from scheduler.service import SchedulerService
from schemas.build import build_config
from schemas.codec import DecodeError
from schemas.packs import is_pack
from tests.integration.pipeline_setup import fake_worker, make_config, running

pytestmark = pytest.mark.integration

#: Room for three fake results of one text in msgpack (about 650 bytes each), two in JSON
#: (about 1,120): a batch of four for one client needs two packs, or a pack and a record.
MAX_MESSAGE_BYTES = 2_500


async def read_raw(kafka: KafkaSettings, topic: str, timeout_s: float = 15.0) -> list:
    """Every record of ``topic`` (one partition) up to its end, as written."""
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    records: list = []
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        async with asyncio.timeout(timeout_s):
            while True:
                got = await consumer.getmany(timeout_ms=200)
                records.extend(r for recs in got.values() for r in recs)
                high = consumer.highwater(tp)
                if high is not None and await consumer.position(tp) >= high:
                    return records
    finally:
        await stop_consumer(consumer)


async def results_within(client: FairnessClient, ids: list[str], timeout_s: float) -> list:
    """The results of ``ids`` that came within ``timeout_s`` (a missing one is left out)."""
    async def one(rid: str):
        with contextlib.suppress(TimeoutError):
            return await client.result(rid, timeout=timeout_s)
        return None

    got = await asyncio.gather(*(one(rid) for rid in ids))
    return [r for r in got if r is not None]


async def test_packed_replies_through_the_pipeline_each_result_once(kafka_settings,
                                                                     topic_prefix):
    base = make_config(topic_prefix)
    cfg = msgspec.structs.replace(base, service=msgspec.structs.replace(
        base.service, max_message_bytes=MAX_MESSAGE_BYTES))
    admission = AdmissionService(cfg, kafka_settings,
                                 settings=AdmissionSettings(token_counter="fake"))
    sched = SchedulerService(cfg, kafka_settings)
    # Slow enough batches that requests queue up and a batch answers several of a client.
    worker = fake_worker(cfg, kafka_settings, "w-a", model="fake:ms_per_batch=30")
    clients = {
        "json": FairnessClient(kafka_settings, cfg, wire_format="json"),
        "msgpack": FairnessClient(kafka_settings, cfg, wire_format="msgpack"),
        "plain": FairnessClient(kafka_settings, cfg, wire_format="msgpack",
                                packed_replies=False),
    }
    sent: dict[str, list[str]] = {}
    got: dict[str, list] = {}
    raw: dict[str, list] = {}
    async with running(sched), running(admission), running(worker), \
            contextlib.AsyncExitStack() as stack:
        for c in clients.values():
            await stack.enter_async_context(c)

        async def send(name: str, client: FairnessClient) -> None:
            sent[name] = list(await asyncio.gather(*(client.submit({
                "org": ("acme", "bulk")[i % 2], "endpoint": "embed",
                "input": {"type": "embed", "texts": [f"{name} text {i}"]}}) for i in range(24))))
            got[name] = await results_within(client, sent[name], 20)

        await asyncio.gather(*(send(n, c) for n, c in clients.items()))
        for name, client in clients.items():
            raw[name] = await read_raw(kafka_settings, client.reply_topic)

    for name in clients:
        # Through the client: each request's result, once.
        assert sorted(r.id for r in got[name]) == sorted(sent[name]), name
        assert {r.status for r in got[name]} == {"ok"}, name
        # On the wire: every result exactly once, none unreadable.
        on_wire = [x for rec in raw[name] for x in results_in(rec.value, rec.headers)]
        assert not [x for x in on_wire if isinstance(x, DecodeError)], name
        assert sorted(x.id for x in on_wire) == sorted(sent[name]), (
            f"{name}: a result lost or written twice on the reply topic")
    for name in ("json", "msgpack"):
        packs = [rec for rec in raw[name] if is_pack(rec.headers)]
        assert packs, f"{name}: no pack was written"
        assert len(raw[name]) < len(sent[name]), name
        assert all(len(rec.value) <= MAX_MESSAGE_BYTES for rec in packs), name
    assert not [rec for rec in raw["plain"] if is_pack(rec.headers)]
    assert len(raw["plain"]) == len(sent["plain"])


async def test_the_gateway_gets_packed_replies_through_its_client(kafka_settings, topic_prefix):
    """Concurrent HTTP requests: answered each, their results packed on the gateway's topic."""
    key = new_key()
    cfg = build_config(
        prefix=topic_prefix, heartbeat_ms=200, state_interval_ms=100, tier_partitions=1,
        endpoints={"embed": {"partitions": 1, "max_batch_size": 4}},
        orgs={"acme": {"tier": "gold", "api_keys": [hash_key(key)]}}).config
    async with Stack(cfg, kafka_settings, model="fake:ms_per_batch=100", worker_slots=1,
                     gateway=GatewaySettings(port=0)) as stack, \
            aiohttp.ClientSession(stack.gateway.url) as http:
        async def post(i: int) -> tuple[int, int]:
            async with http.post("/v1/embeddings", json={"model": "embed", "input": f"t {i}"},
                                 headers={"Authorization": f"Bearer {key}"}) as r:
                return r.status, len((await r.json()).get("data", []))

        answers = await asyncio.gather(*(post(i) for i in range(12)))
        raw = await read_raw(kafka_settings, stack.gateway.reply_topic)
    assert answers == [(200, 1)] * 12
    assert stack.gateway.client.packed_replies
    on_wire = [x for rec in raw for x in results_in(rec.value, rec.headers)]
    assert len(on_wire) == 12 and len({x.id for x in on_wire}) == 12
    assert any(is_pack(rec.headers) for rec in raw), "no pack on the gateway's reply topic"

"""The shared Kafka plumbing against a real (embedded Tansu) broker."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from plumbing.broker import BrokerStartError, EmbeddedBroker
from plumbing.kafka import (
    KafkaSettings,
    add_kafka_arguments,
    kafka_endpoint,
    make_admin,
    make_consumer,
    make_producer,
    settings_from_args,
    stop_consumer,
)
from plumbing.topics import TopicError, describe_topics, ensure_topics

pytestmark = pytest.mark.integration


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


async def _consume(consumer, n: int, timeout_s: float = 10.0) -> list:
    records: list = []
    async with asyncio.timeout(timeout_s):
        while len(records) < n:
            batches = await consumer.getmany(timeout_ms=200, max_records=n - len(records))
            for batch in batches.values():
                records.extend(batch)
    return records


async def _members(kafka: KafkaSettings, group: str) -> list[str]:
    """Member ids of a consumer group, as the coordinator describes it."""
    admin = make_admin(kafka)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    [(error, name, _state, _ptype, _protocol, members)] = response.groups
    assert error == 0 and name == group, response
    return [m[0] for m in members]


def test_broker_starts_and_stops() -> None:
    """A started broker accepts connections; after stop its process, port and temp log are gone."""
    with EmbeddedBroker() as b:
        pid, port, log = b.pid, b.port, b.log_path
        assert b.running and b.bootstrap == f"127.0.0.1:{port}"
        assert not _refused(port)
        assert log is not None and log.exists()
    assert not b.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _refused(port)
    assert not log.exists()


def test_start_failure_names_cause() -> None:
    """A broker that cannot bind its port fails fast with Tansu's own error in the message."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = EmbeddedBroker(port=taken.getsockname()[1], start_timeout_s=5)
        with pytest.raises(BrokerStartError, match="AddrInUse"):
            broker.start()
    assert not broker.running


async def test_ensure_topics_is_idempotent(kafka_settings: KafkaSettings, topic_prefix: str) -> None:
    """ensure_topics creates each topic with its partitions, repeats harmlessly, refuses fewer."""
    specs = {f"{topic_prefix}a": 3, f"{topic_prefix}b": 1}
    assert await ensure_topics(kafka_settings, specs) == specs
    # Asking for fewer than exist is satisfied by what exists.
    again = await ensure_topics(kafka_settings, {**specs, f"{topic_prefix}b": 1, f"{topic_prefix}a": 2})
    assert again == specs
    assert await describe_topics(kafka_settings, topic_prefix) == specs
    with pytest.raises(TopicError, match=f"{topic_prefix}a"):
        await ensure_topics(kafka_settings, {f"{topic_prefix}a": 5})


async def test_keyed_message_with_headers_round_trips(
    kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    """Key, value and headers come back unchanged, on the partition the producer chose by key."""
    topic = f"{topic_prefix}rt"
    await ensure_topics(kafka_settings, {topic: 3})
    sent = {}
    producer = make_producer(kafka_settings)
    await producer.start()
    try:
        for i, org in enumerate(["org-a", "org-b", "org-c", "org-a"]):
            meta = await producer.send_and_wait(
                topic,
                f"payload-{i}".encode(),
                key=org.encode(),
                headers=[("content-type", b"application/msgpack"), ("n", str(i).encode())],
            )
            sent[f"payload-{i}".encode()] = (org.encode(), meta.partition, meta.offset)
    finally:
        await producer.stop()
    consumer = make_consumer(kafka_settings, topic)
    await consumer.start()
    try:
        records = await _consume(consumer, len(sent))
    finally:
        await consumer.stop()
    for r in records:
        key, partition, offset = sent[r.value]
        assert (r.key, r.partition, r.offset) == (key, partition, offset)
        assert dict(r.headers)["content-type"] == b"application/msgpack"
    assert len({r.partition for r in records if r.key == b"org-a"}) == 1


async def test_restart_loses_topics_and_ensure_recreates() -> None:
    """After restart() on the same port the topics are gone and ensure_topics brings them back."""
    async with EmbeddedBroker() as b:
        settings = KafkaSettings(bootstrap=b.bootstrap)
        await ensure_topics(settings, {"r.one": 2})
        port = b.port
        await b.arestart()
        assert b.port == port and b.running
        assert await describe_topics(settings, "r.") == {}
        assert await ensure_topics(settings, {"r.one": 2}) == {"r.one": 2}
        producer = make_producer(settings)
        await producer.start()
        try:
            meta = await producer.send_and_wait("r.one", b"after-restart", partition=1)
        finally:
            await producer.stop()
        assert (meta.partition, meta.offset) == (1, 0)


async def test_group_commit_survives_consumer_restart(
    kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    """A new member resumes at the committed offset, and promptly: the first one left the group."""
    topic, group = f"{topic_prefix}g", f"{topic_prefix}group"
    tp = TopicPartition(topic, 0)
    await ensure_topics(kafka_settings, {topic: 1})
    producer = make_producer(kafka_settings)
    await producer.start()
    try:
        for i in range(10):
            await producer.send(topic, str(i).encode(), key=b"k")
        await producer.flush()
    finally:
        await producer.stop()

    first = make_consumer(kafka_settings, topic, group_id=group)
    await first.start()
    try:
        done = (await _consume(first, 10))[:6]
        assert [r.value for r in done] == [str(i).encode() for i in range(6)]
        await first.commit({tp: done[-1].offset + 1})
    finally:
        await stop_consumer(first)
    # It left (LeaveGroup, even in Tansu's generation 0): the group is empty, so
    # the next member need not wait out the first one's session.
    assert await _members(kafka_settings, group) == []

    second = make_consumer(kafka_settings, topic, group_id=group)
    await second.start()
    try:
        rest = await _consume(second, 4)
        assert await second.committed(tp) == 6
    finally:
        await stop_consumer(second)
    assert [r.value for r in rest] == [str(i).encode() for i in range(6, 10)]


async def test_flags_override_env_and_embedded_endpoint_works() -> None:
    """--bootstrap embedded beats SF_BOOTSTRAP, and kafka_endpoint then serves a working broker."""
    parser = argparse.ArgumentParser()
    add_kafka_arguments(parser)
    args = parser.parse_args(["--bootstrap", "embedded", "--kafka-linger-ms", "2"])
    env = {"SF_BOOTSTRAP": "kafka.invalid:9092", "SF_KAFKA_LINGER_MS": "9", "SF_KAFKA_ACKS": "1"}
    settings = settings_from_args(args, env)
    assert (settings.bootstrap, settings.linger_ms, settings.acks) == (None, 2, 1)
    async with kafka_endpoint(settings) as bootstrap:
        live = msgspec.structs.replace(settings, bootstrap=bootstrap)
        assert await ensure_topics(live, {"e.t": 1}) == {"e.t": 1}


async def test_a_producer_keeps_the_topics_it_writes_to_after_writing_to_a_new_one(
        kafka_settings: KafkaSettings, topic_prefix: str) -> None:
    """aiokafka tracks in its metadata only the topics ``add_topic`` was called
    for; a topic the producer found in its bootstrap metadata (all topics) is
    written to untracked. The first write to a new topic (a reply topic)
    narrows the metadata requests to the tracked topics: the untracked one
    loses its leaders, and a batch for it waits until the produce timeout,
    then fails with aiokafka's own ``NotLeaderForPartitionError`` (an
    overload run stalled 4-5 s that way; Tansu had answered every request).
    """
    old, new = f"{topic_prefix}tier", f"{topic_prefix}reply"
    await ensure_topics(kafka_settings, {old: 2})
    producer = make_producer(msgspec.structs.replace(kafka_settings, produce_timeout_ms=3000))
    await producer.start()
    try:
        await producer.send_and_wait(old, b"first", partition=1)
        await ensure_topics(kafka_settings, {new: 1})  # created after the producer started
        await producer.send_and_wait(new, b"reply")
        assert producer.client.cluster.leader_for_partition(TopicPartition(old, 1)) is not None, \
            f"{old} dropped from the producer's metadata after its first write to {new}"
        async with asyncio.timeout(10):  # the produce timeout is 3 s: a stuck batch fails first
            await producer.send_and_wait(old, b"second", partition=1)
    finally:
        await producer.stop()


async def _one_record_batches(kafka: KafkaSettings, topic: str, n: int) -> None:
    """A one-partition ``topic`` holding ``n`` records, one batch each, values "0".."n-1"."""
    await ensure_topics(kafka, {topic: 1})
    producer = make_producer(kafka)
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, str(i).encode(), partition=0)
    finally:
        await producer.stop()


def _with_offsets_reserved(batch, reserved: int):
    """``batch`` built, claiming ``reserved`` offsets for the records it holds (a real gap after it)."""
    buf = batch._build()  # aiokafka offers no public way to write such a batch
    struct.pack_into(">i", buf, 23, reserved - 1)  # lastOffsetDelta
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    return batch


async def test_a_consumer_reads_again_what_a_fetch_jumped_past(
        kafka_settings: KafkaSettings, topic_prefix: str, monkeypatch) -> None:
    """Tansu can answer a fetch with a later batch while an earlier one, its
    offsets reserved by a concurrent produce, is not stored yet; aiokafka
    then moves past it for good (plumbing/contiguity.py). Here aiokafka's
    own answer hides offsets 3 and 4 once, after consuming them, as that
    fetch would: our consumer must still hand on every offset, once, in order.
    """
    topic = f"{topic_prefix}jump"
    await _one_record_batches(kafka_settings, topic, 10)

    real_getmany = AIOKafkaConsumer.getmany
    hidden: list[int] = []

    async def jumping_getmany(self, *partitions, **kwargs):
        got = await real_getmany(self, *partitions, **kwargs)
        if not hidden:
            for tp, records in got.items():
                if any(r.offset == 3 for r in records):
                    hidden.extend(r.offset for r in records if r.offset in (3, 4))
                    got[tp] = [r for r in records if r.offset not in (3, 4)]
        return got

    monkeypatch.setattr(AIOKafkaConsumer, "getmany", jumping_getmany)
    consumer = make_consumer(kafka_settings, topic, group_id=f"{topic_prefix}g")
    await consumer.start()
    try:
        records = await _consume(consumer, 10)
    finally:
        await stop_consumer(consumer)
    assert hidden == [3, 4], "the fetch never jumped: the test checked nothing"
    assert [r.offset for r in records] == list(range(10))
    assert consumer.gaps_refetched >= 1 and consumer.gaps_skipped == 0


async def test_a_gap_that_stays_is_passed_over_once_and_named(
        kafka_settings: KafkaSettings, topic_prefix: str) -> None:
    """A real gap (a batch claiming more offsets than it holds, as compaction or a
    transaction marker leaves) is held for the grace, then let through."""
    topic = f"{topic_prefix}gap"
    await ensure_topics(kafka_settings, {topic: 1})
    producer = make_producer(kafka_settings)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"a", partition=0)
        batch = producer.create_batch()
        batch.append(key=None, value=b"b", timestamp=None)
        await (await producer.send_batch(_with_offsets_reserved(batch, 4), topic, partition=0))
        await producer.send_and_wait(topic, b"c", partition=0)
    finally:
        await producer.stop()

    consumer = make_consumer(kafka_settings, topic, group_id=f"{topic_prefix}g", gap_grace_s=0.3)
    await consumer.start()
    try:
        records = await _consume(consumer, 3)
    finally:
        await stop_consumer(consumer)
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (5, b"c")]
    assert consumer.gaps_skipped == 1


async def test_a_consumer_behind_whose_fetches_come_back_empty_says_so(
        kafka_settings: KafkaSettings, topic_prefix: str, monkeypatch) -> None:
    """Past ~10,000 batches the embedded broker answers a fetch at a partition's
    end with nothing, for ever (bench/investigations/broker_fetch_cost.py). Here aiokafka's
    fetch answers, sets the high watermark, and its records are put back
    unread, as that broker's would be: the consumer must name the stall,
    and its end when records come."""
    topic = f"{topic_prefix}stall"
    await _one_record_batches(kafka_settings, topic, 5)

    real_getmany = AIOKafkaConsumer.getmany
    starving = True

    async def empty_getmany(self, *partitions, **kwargs):
        got = await real_getmany(self, *partitions, **kwargs)
        if starving:
            for tp in got:
                self.seek(tp, 0)  # read nothing: the records stay where they are
            return {}
        return got

    monkeypatch.setattr(AIOKafkaConsumer, "getmany", empty_getmany)
    consumer = make_consumer(kafka_settings, group_id=None, stall_after_s=0.5)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    try:
        async with asyncio.timeout(10):
            while consumer.stalls == 0:
                assert await consumer.getmany(timeout_ms=100) == {}
        assert consumer.highwater(tp) == 5, "the fetch never answered: nothing was checked"
        starving = False
        records = await _consume(consumer, 5)
        assert [r.offset for r in records] == list(range(5))
        assert consumer.stalls == 1
    finally:
        await stop_consumer(consumer)

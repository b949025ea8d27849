"""Admission's backlog against the embedded broker: a burst past ``backlog_after_records``
waits in the backlog topic, not the read-ahead; it comes back in order, every request
admitted once, the org behind it not held, and every offset of both topics committed;
a restart in the middle loses nothing and admits again at most one backlog record's
worth (:mod:`producer.backlog`)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from plumbing.kafka import KafkaSettings
from producer.backlog import RECORD_ITEMS
from producer.service import AdmissionService
from schemas.messages import AdmittedRequest
from schemas.topics import Topics
from tests.admission_setup import registry
from tests.integration.pipeline_setup import running
from tests.integration.test_admission_service import (
    _admission,
    _send_burst,
    _until,
)
from tests.integration.test_admission_shaping import read_settled
from tests.packed import admitted_in

pytestmark = pytest.mark.integration

BURST, AFTER, ALLOWANCE, PER_S = 300, 20, 10, 200.0


def _config(tmp_path: Path, prefix: str) -> Path:
    """The test registry, the throttle's held-request limit out of the way: admission
    alone, no scheduler drains what it admits."""
    path = tmp_path / "config.toml"
    path.write_text(registry(prefix=prefix, max_held_requests=100_000).text)
    return path


def _sample(service: AdmissionService, name: str) -> float:
    return service.registry.get_sample_value(name) or 0.0


async def _committed(service: AdmissionService, topic: str) -> int:
    consumer = service._consumer
    assert consumer is not None
    return sum([(await consumer.committed(tp)) or 0 for tp in consumer.assignment()
                if tp.topic == topic])


async def _until_topic_committed(service: AdmissionService, topic: str, n: int,
                                 timeout_s: float = 20.0) -> None:
    done = 0
    try:
        async with asyncio.timeout(timeout_s):
            while (done := await _committed(service, topic)) != n:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {n} offsets of {topic} to be "
                             f"committed: {done}") from None


def _shaped(kafka_settings: KafkaSettings, tmp_path: Path, prefix: str,
            from_records: int) -> AdmissionService:
    """Admission deciding bulk at PER_S past ALLOWANCE, its backlog past AFTER read ahead
    once the read-ahead holds ``from_records``."""
    return _admission(kafka_settings, _config(tmp_path, prefix), shape_org_per_s=PER_S,
                      shape_org_burst=ALLOWANCE, backlog_after_records=AFTER,
                      backlog_from_records=from_records)


async def _burst_admitted(kafka_settings: KafkaSettings, service: AdmissionService,
                          topics: Topics) -> list[AdmittedRequest]:
    """Send the burst once ``service`` is assigned; what it admitted (the whole tier topic),
    checked: bulk's every request once, in the burst's order, and quiet's once."""
    await _until(lambda: service.readiness()[0], "the ingress partitions to be assigned")
    await _send_burst(kafka_settings, topics.ingress, BURST)
    records = await read_settled(kafka_settings, topics.tier("standard"), BURST + 1,
                                 timeout_s=30)
    admitted = admitted_in(records)
    assert [a.id for a in admitted if a.org == "bulk"] == [f"bulk-{i}" for i in range(BURST)]
    assert [a.id for a in admitted if a.org == "quiet"] == ["quiet-0"]
    return admitted


async def _all_committed(service: AdmissionService, topics: Topics) -> None:
    """Every request admitted and every ingress offset committed: nothing left to replay."""
    await _until(lambda: service.totals["admitted"] == BURST + 1, "all to be admitted")
    await _until_topic_committed(service, topics.ingress, BURST + 1)


async def test_a_burst_past_the_bound_waits_in_the_backlog_and_comes_back_in_order(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """300 records of bulk, shaped to 200/s so they wait, then one of quiet: past bulk's
    20th read ahead the rest go to the backlog (the 20 stay read ahead, ahead of them);
    each comes back and is admitted once, in order; quiet's is not held behind them;
    every offset of the ingress and the backlog is committed at the end."""
    topics = Topics(topic_prefix)
    service = _shaped(kafka_settings, tmp_path, topic_prefix, from_records=0)
    async with running(service):
        # Nothing lost, nothing twice (the whole topic read), in the burst's order.
        admitted = await _burst_admitted(kafka_settings, service, topics)
        # Most of it went through the backlog, and all of that came back.
        written = _sample(service, "sf_admission_backlog_written_total")
        assert written >= BURST - 2 * AFTER, written
        assert _sample(service, "sf_admission_backlog_read_total") == written
        # quiet's record, behind the whole burst on its producer, went before most of it.
        order = [a.id for a in admitted]
        assert order.index("quiet-0") < AFTER + ALLOWANCE + 10, order.index("quiet-0")
        # Every offset of both topics committed: nothing left to replay.
        await _all_committed(service, topics)
        # The whole topic, to each partition's end: every backlog record written.
        backlog_records = len(await read_settled(kafka_settings, topics.backlog, 0, count=len))
        assert backlog_records >= written / RECORD_ITEMS
        await _until_topic_committed(service, topics.backlog, backlog_records)
        assert _sample(service, "sf_admission_read_ahead_records") == 0


async def test_a_burst_is_not_read_back_while_its_first_records_wait_read_ahead(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """The copy begins at 3 x AFTER read ahead: bulk keeps about that many there, the rest
    go to the backlog, and none is read back until fewer than AFTER of bulk's wait (so
    the read-ahead does not hold its first records and as many read back besides); all
    admitted once, in order."""
    topics = Topics(topic_prefix)
    service = _shaped(kafka_settings, tmp_path, topic_prefix, from_records=3 * AFTER)
    # What bulk has in the read-ahead (from ingress, or read back) as each backlog
    # fetch is read back.
    waiting: list[int] = []
    read_back = service._read_back

    def spy(tp, records, fetched_ms):
        waiting.append(service._ahead.count(TopicPartition(topics.ingress, tp.partition),
                                            b"bulk"))
        return read_back(tp, records, fetched_ms)

    service._read_back = spy  # type: ignore[method-assign]
    async with running(service):
        await _burst_admitted(kafka_settings, service, topics)
        assert _sample(service, "sf_admission_backlog_written_total") > 0
        assert waiting and max(waiting) < AFTER, waiting
        await _all_committed(service, topics)


async def test_a_burst_the_read_ahead_holds_below_from_records_is_not_copied(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """The same burst, the read-ahead never holding backlog_from_records: nothing goes to
    the backlog; every request admitted once, in order, quiet's not behind them."""
    topics = Topics(topic_prefix)
    service = _shaped(kafka_settings, tmp_path, topic_prefix, from_records=BURST + 1)
    async with running(service):
        admitted = await _burst_admitted(kafka_settings, service, topics)
        assert _sample(service, "sf_admission_backlog_written_total") == 0
        order = [a.id for a in admitted]
        assert order.index("quiet-0") < AFTER + ALLOWANCE + 10, order.index("quiet-0")
        await _all_committed(service, topics)


async def test_a_restart_in_the_middle_of_a_backlog_loses_nothing(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """The first instance stops with most of the burst still in the backlog; the second
    reads it back from the committed offsets: every request admitted, in order of first
    admission, and at most one backlog record's worth admitted twice."""
    topics = Topics(topic_prefix)
    config = _config(tmp_path, topic_prefix)
    # Committing after every step: its last commit is where it stopped deciding, often
    # in the middle of a backlog record, whose requests not yet decided must come back.
    first = _admission(kafka_settings, config, shape_org_per_s=PER_S / 2,
                       shape_org_burst=ALLOWANCE, backlog_after_records=AFTER,
                       backlog_from_records=0, commit_interval_ms=0)
    async with running(first):
        await _until(lambda: first.readiness()[0], "the ingress partitions to be assigned")
        await _send_burst(kafka_settings, topics.ingress, BURST)
        await _until(lambda: first.totals["admitted"] >= BURST // 4,
                     "a quarter of the burst to be admitted")
    second = _admission(kafka_settings, config, backlog_after_records=AFTER,
                        backlog_from_records=0)
    async with running(second):
        records = await read_settled(kafka_settings, topics.tier("standard"), BURST + 1,
                                     timeout_s=30)
        await _until(lambda: second.readiness()[0], "the second instance to be assigned")
        await _until_topic_committed(second, topics.ingress, BURST + 1)
    admitted = [a.id for a in admitted_in(records)]
    assert set(admitted) == {f"bulk-{i}" for i in range(BURST)} | {"quiet-0"}
    twice = sum(n - 1 for n in Counter(admitted).values())
    assert twice <= RECORD_ITEMS, twice
    firsts = [i for i in dict.fromkeys(a for a in admitted if a.startswith("bulk-"))]
    assert firsts == [f"bulk-{i}" for i in range(BURST)]


async def test_an_unreadable_backlog_record_is_dead_lettered_and_the_rest_flow(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """A record in the backlog topic that admission did not write goes to the dead
    letters whole; its offset is committed; the loop goes on."""
    from tests.integration.test_admission_service import _produce, _read

    topics = Topics(topic_prefix)
    service = _admission(kafka_settings, _config(tmp_path, topic_prefix),
                         backlog_after_records=AFTER,
                         backlog_from_records=0)
    async with running(service):
        await _until(lambda: service.readiness()[0], "the partitions to be assigned")
        await _produce(kafka_settings, topics.backlog, b"not a backlog record")
        [letter] = await _read(kafka_settings, topics.dead_letters, 1)
        assert b"undecodable_backlog" in letter.value
        await _until_topic_committed(service, topics.backlog, 1)
        await _send_burst(kafka_settings, topics.ingress, 3)
        await read_settled(kafka_settings, topics.tier("standard"), 4)
        dead = service.registry.get_sample_value("sf_admission_dead_letters_total",
                                                 {"reason": "undecodable_backlog"})
        assert dead == 1


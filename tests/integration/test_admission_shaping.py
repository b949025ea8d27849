"""Admission's shaping against the embedded broker: a burst spread at the set rate,
another org not held behind it, every record forwarded once, in order, and committed."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from plumbing.kafka import KafkaSettings, make_producer
from producer.service import AdmissionService, AdmissionSettings
from schemas.codec import codec_for
from schemas.config import load_config
from schemas.messages import AdmittedRequest
from schemas.topics import Topics
from tests.admission_setup import registry, request_dict
from tests.integration.test_admission_service import _read, _until

pytestmark = pytest.mark.integration

BURST, ALLOWANCE, PER_S = 60, 10, 50.0


async def test_a_shaped_burst_is_spread_and_the_org_behind_it_is_not(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """60 records of bulk at once, then one of quiet on the same producer: past its
    allowance of 10, bulk is decided at 50/s, so its last record at least ~1 s after its
    first (a bound a slow machine only widens); quiet's is not held behind it."""
    path = tmp_path / "config.toml"
    path.write_text(registry(prefix=topic_prefix).text)
    topics = Topics(topic_prefix)
    service = AdmissionService(
        load_config(path), kafka_settings, registry=CollectorRegistry(),
        settings=AdmissionSettings(token_counter="fake", metrics_port=0, config_poll_ms=0,
                                   shape_org_per_s=PER_S, shape_org_burst=ALLOWANCE))
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        await _until(lambda: service.readiness()[0], "the ingress partitions to be assigned")
        producer = make_producer(kafka_settings)
        await producer.start()
        try:
            sends = [await producer.send(topics.ingress, msgspec.json.encode(
                request_dict(id=f"bulk-{i}", org="bulk")), key=b"bulk") for i in range(BURST)]
            sends.append(await producer.send(topics.ingress, msgspec.json.encode(
                request_dict(id="quiet-0", org="quiet")), key=b"quiet"))
            await asyncio.gather(*sends)
        finally:
            await producer.stop()
        def waiting() -> float:
            return service.registry.get_sample_value("sf_admission_read_ahead_records")

        # The shaped records wait read ahead, and the gauge says so.
        await _until(lambda: waiting() > 0, "shaped records to be counted read ahead")
        records = await _read(kafka_settings, topics.tier("standard"), BURST + 1, timeout_s=30)
        admitted = [codec_for(AdmittedRequest).decode(r.value) for r in records]
        bulk = [a for a in admitted if a.org == "bulk"]
        # Nothing lost, nothing twice, each org in its order.
        assert [a.id for a in bulk] == [f"bulk-{i}" for i in range(BURST)]
        [quiet] = [a for a in admitted if a.org == "quiet"]
        # Spread: 50 records past the allowance at 50/s take 1 s (10 % off for the clocks).
        span_ms = bulk[-1].admitted_ms - bulk[0].admitted_ms
        assert span_ms >= 0.9 * (BURST - ALLOWANCE) / PER_S * 1000, span_ms
        # quiet's record, fetched behind the burst, went before most of it.
        before_quiet = sum(a.admitted_ms <= quiet.admitted_ms for a in bulk)
        assert before_quiet <= ALLOWANCE + 5, before_quiet
        # Every ingress offset committed once the last shaped record was written.
        await _until(lambda: service.totals["admitted"] == BURST + 1, "all to be admitted")
        assert waiting() == 0

        async def committed() -> int:
            total = 0
            for tp in service._consumer.assignment():
                total += (await service._consumer.committed(tp)) or 0
            return total

        done = 0
        try:
            async with asyncio.timeout(15):
                while (done := await committed()) != BURST + 1:
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for the {BURST + 1} ingress offsets to "
                                 f"be committed: {done}") from None
    finally:
        service.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await service.stop()

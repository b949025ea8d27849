"""Admission's shaping against the embedded broker: a burst spread at the set rate,
another org not held behind it, every record forwarded once, in order, and committed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from plumbing.kafka import KafkaSettings
from schemas.topics import Topics
from tests.integration.pipeline_setup import running
from tests.integration.test_admission_service import (
    _admission,
    _read_ahead,
    _send_burst,
    _until,
    _until_committed,
    _write_config,
    from_start,
)
from tests.packed import admitted_in

pytestmark = pytest.mark.integration


async def read_settled(settings: KafkaSettings, topic: str, n: int, timeout_s: float = 15.0,
                       quiet_s: float = 1.0,
                       count: Callable[[list], int] | None = None) -> list:
    """Every record of ``topic`` (all partitions, no group): at least ``n`` requests (a
    pack's each counted, :mod:`tests.packed`; ``count`` counts otherwise), then on to
    each partition's end and ``quiet_s`` more with nothing new, so a late second copy
    is read too (reading only the first ``n`` would stop before it)."""
    counted = count or (lambda records: len(admitted_in(records)))
    records: list = []
    async with from_start(settings, topic) as (consumer, tps):
        try:
            return await _read_to_end(consumer, tps, records, n, counted,
                                      timeout_s + quiet_s, quiet_s)
        except TimeoutError:
            raise AssertionError(
                f"timed out after {timeout_s + quiet_s:.0f} s reading {topic}: "
                f"{counted(records)} requests of the {n} waited for") from None


async def _read_to_end(consumer, tps: list, records: list, n: int,
                       count: Callable[[list], int], timeout_s: float, quiet_s: float) -> list:
    """Read into ``records`` until at least ``n`` requests and the end, then ``quiet_s``."""
    async with asyncio.timeout(timeout_s):
        quiet_since = None
        while True:
            got = [r for batch in (await consumer.getmany(timeout_ms=100)).values()
                   for r in batch]
            records.extend(got)
            at_end = True
            for tp in tps:
                high = consumer.highwater(tp)
                if high is None or await consumer.position(tp) < high:
                    at_end = False
            if got or not at_end or count(records) < n:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                return records


BURST, ALLOWANCE, PER_S = 60, 10, 50.0


async def test_a_shaped_burst_is_spread_and_the_org_behind_it_is_not(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """60 records of bulk at once, then one of quiet on the same producer: past its
    allowance of 10, bulk is decided at 50/s, so its last record at least ~1 s after its
    first (a bound a slow machine only widens); quiet's is not held behind it."""
    topics = Topics(topic_prefix)
    service = _admission(kafka_settings, _write_config(tmp_path / "config.toml", topic_prefix),
                         shape_org_per_s=PER_S, shape_org_burst=ALLOWANCE)
    async with running(service):
        await _until(lambda: service.readiness()[0], "the ingress partitions to be assigned")
        await _send_burst(kafka_settings, topics.ingress, BURST)
        # The shaped records wait read ahead, and the gauge says so.
        await _until(lambda: _read_ahead(service) > 0, "shaped records to be counted read ahead")
        records = await read_settled(kafka_settings, topics.tier("standard"), BURST + 1,
                                     timeout_s=30)
        admitted = admitted_in(records)
        bulk = [a for a in admitted if a.org == "bulk"]
        # Nothing lost, nothing twice (the whole topic read), each org in its order.
        assert [a.id for a in bulk] == [f"bulk-{i}" for i in range(BURST)]
        assert len(admitted) == BURST + 1, [a.id for a in admitted]
        [quiet] = [a for a in admitted if a.org == "quiet"]
        # Spread: 50 records past the allowance at 50/s take 1 s (10 % off for the clocks).
        span_ms = bulk[-1].admitted_ms - bulk[0].admitted_ms
        assert span_ms >= 0.9 * (BURST - ALLOWANCE) / PER_S * 1000, span_ms
        # quiet's record, fetched behind the burst, went before most of it.
        before_quiet = sum(a.admitted_ms <= quiet.admitted_ms for a in bulk)
        assert before_quiet <= ALLOWANCE + 5, before_quiet
        # Every ingress offset committed once the last shaped record was written.
        await _until(lambda: service.totals["admitted"] == BURST + 1, "all to be admitted")
        assert _read_ahead(service) == 0
        await _until_committed(service, BURST + 1)

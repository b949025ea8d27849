"""Admission's pacing against the embedded broker: while the scheduler holds a second of
service for an org, its records wait in the read-ahead and another org's go on; once the
backlog drains, every one is forwarded once, in order, and committed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from plumbing.kafka import KafkaSettings, make_producer
from producer.service import AdmissionService
from scheduler.service import SchedulerService
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, LaneState, SchedulerState
from schemas.topics import Topics
from tests.admission_setup import request_dict
from tests.integration.pipeline_setup import fake_worker, running
from tests.integration.test_admission_service import (
    _admission,
    _read,
    _read_ahead,
    _send_burst,
    _until,
    _until_committed,
    _write_config,
)
from tests.integration.test_admission_shaping import read_settled
from tests.packed import admitted_in

pytestmark = pytest.mark.integration

BURST = 30


def _snapshot(bulk_tokens: int, *, sent_ms: int, tokens_per_s: float = 1000.0) -> SchedulerState:
    """The scheduler holding ``bulk_tokens`` of bulk's, ``tokens_per_s`` (0: not measured
    yet): in the future, so it stays fresh for the whole test (a scheduler's would be
    replaced)."""
    lane = LaneState(endpoint="embed", held_requests=1, held_cost_by_tier={},
                     held_tokens_by_tier={"standard": bulk_tokens}, tokens_per_s=tokens_per_s,
                     free_slots=0, workers=1, org_held_tokens={"bulk": bulk_tokens},
                     turns=True)
    return SchedulerState(sent_ms=sent_ms, lanes={"embed": lane}, held_requests=1)


@contextlib.asynccontextmanager
async def _paced(kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path,
                 **settings) -> AsyncIterator[AdmissionService]:
    """A running admission service, ready, pacing at a second of backlog or four full
    batches before a rate is measured (``settings``: more of its settings)."""
    service = _admission(kafka_settings, _write_config(tmp_path / "config.toml", topic_prefix),
                         pace_backlog_s=1.0, pace_cold_batches=4, **settings)
    async with running(service):
        await _until(lambda: service.readiness()[0], "the ingress partitions to be assigned")
        yield service


@pytest.mark.parametrize("measured", [True, False], ids=["measured-rate", "before-a-rate"])
async def test_a_paced_burst_waits_until_its_backlog_drains_and_the_org_behind_it_does_not(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path, measured: bool):
    topics = Topics(topic_prefix)
    async with _paced(kafka_settings, topic_prefix, tmp_path) as service:
        later_ms = int(time.time() * 1000) + 600_000
        if measured:
            # Two seconds of bulk's work held at the scheduler (1.0 is the limit).
            held = _snapshot(2000, sent_ms=later_ms)
        else:
            # No rate yet: four full batches of bulk's held (pace_cold_batches).
            full = service.config.endpoints["embed"].max_batch_tokens
            held = _snapshot(4 * full, sent_ms=later_ms, tokens_per_s=0.0)
        assert service.throttle.observe(held, later_ms)
        await _send_burst(kafka_settings, topics.ingress, BURST)

        await _until(lambda: service.totals["admitted"] == 1, "quiet's record to be admitted")
        [first] = await _read(kafka_settings, topics.tier("standard"), 1)
        assert codec_for(AdmittedRequest).decode(first.value).id == "quiet-0"
        await _until(lambda: _read_ahead(service) == BURST, "bulk's records to wait read ahead")
        await asyncio.sleep(0.3)  # several of the pacer's looks: still held
        assert service.totals["admitted"] == 1 and _read_ahead(service) == BURST

        # The backlog drained: bulk's records go, each once, in order.
        drained = _snapshot(0, sent_ms=later_ms + 1, tokens_per_s=1000.0 if measured else 0.0)
        assert service.throttle.observe(drained, later_ms + 1)
        records = await read_settled(kafka_settings, topics.tier("standard"), BURST + 1,
                                     timeout_s=30)
        admitted = admitted_in(records)
        assert [a.id for a in admitted if a.org == "bulk"] == [f"bulk-{i}" for i in range(BURST)]
        assert len(admitted) == BURST + 1
        await _until(lambda: service.totals["admitted"] == BURST + 1, "all to be admitted")
        assert _read_ahead(service) == 0
        await _until_committed(service, BURST + 1)


async def test_a_snapshot_read_while_a_fetch_waits_paces_what_that_fetch_returns(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """The first snapshot (a fresh pipeline, a takeover) is read while admission waits in a
    fetch, and the burst comes back from that same fetch: it is paced. (Admission chose
    its pacer before the fetch, with no snapshot fresh, and relayed such a burst at once:
    the running scheduler's case below went unpaced in about one run of three.) A long
    poll timeout keeps the loop in that one fetch while the snapshot comes and the burst
    is sent."""
    topics = Topics(topic_prefix)
    async with _paced(kafka_settings, topic_prefix, tmp_path, poll_timeout_ms=3000) as service:
        assert service.throttle.state is None
        await asyncio.sleep(0.1)  # the loop waits in its fetch
        later_ms = int(time.time() * 1000) + 600_000
        full = service.config.endpoints["embed"].max_batch_tokens
        assert service.throttle.observe(_snapshot(4 * full, sent_ms=later_ms, tokens_per_s=0.0),
                                        later_ms)
        await _send_burst(kafka_settings, topics.ingress, BURST)

        await _until(lambda: service.totals["admitted"] == 1, "quiet's record to be admitted")
        await _until(lambda: _read_ahead(service) == BURST, "bulk's records to wait read ahead")
        await asyncio.sleep(0.3)  # several of the pacer's looks: still held
        assert service.totals["admitted"] == 1 and _read_ahead(service) == BURST

        drained = _snapshot(0, sent_ms=later_ms + 1, tokens_per_s=0.0)
        assert service.throttle.observe(drained, later_ms + 1)
        await _until(lambda: service.totals["admitted"] == BURST + 1, "all to be admitted")
        records = await read_settled(kafka_settings, topics.tier("standard"), BURST + 1,
                                     timeout_s=30)
        admitted = admitted_in(records)
        assert [a.id for a in admitted if a.org == "bulk"] == [f"bulk-{i}" for i in range(BURST)]


async def test_a_reload_to_larger_batches_lets_a_burst_paced_before_a_rate_go(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """The rate assumed before one is measured follows the installed config: four full
    batches held pace the burst; after a reload to batches twice as large the same
    backlog is two of them, and the burst goes on with no new snapshot."""
    topics = Topics(topic_prefix)
    async with _paced(kafka_settings, topic_prefix, tmp_path) as service:
        later_ms = int(time.time() * 1000) + 600_000
        endpoint = service.config.endpoints["embed"]
        full = endpoint.max_batch_tokens
        held = _snapshot(4 * full, sent_ms=later_ms, tokens_per_s=0.0)
        assert service.throttle.observe(held, later_ms)
        await _send_burst(kafka_settings, topics.ingress, BURST)
        await _until(lambda: _read_ahead(service) == BURST, "bulk's records to wait read ahead")
        await asyncio.sleep(0.3)  # several of the pacer's looks: still held
        assert _read_ahead(service) == BURST

        larger = msgspec.structs.replace(endpoint, max_batch_tokens=2 * full)
        await service.apply(msgspec.structs.replace(
            service.config, endpoints={**service.config.endpoints, "embed": larger}))
        records = await read_settled(kafka_settings, topics.tier("standard"), BURST + 1,
                                     timeout_s=30)
        admitted = admitted_in(records)
        assert [a.id for a in admitted if a.org == "bulk"] == [f"bulk-{i}" for i in range(BURST)]
        assert len(admitted) == BURST + 1
        await _until(lambda: service.totals["admitted"] == BURST + 1, "all to be admitted")


#: Sixteen words: 16 tokens by the fake counter (max_request_tokens 20), 31 characters.
_SIXTEEN = " ".join("abcdefghijklmnop")


async def test_a_running_schedulers_own_snapshot_paces_a_burst(
        kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path):
    """No made-up snapshot: a running scheduler with no worker holds bulk's 16 requests of 16
    tokens (four full batches of 64, no rate measured yet) and says so in its own snapshot;
    admission paces bulk's burst on it while quiet's record goes, and once a worker drains
    the backlog the burst goes, each record once, in order."""
    topics = Topics(topic_prefix)
    held = [request_dict(id=f"held-{i}", org="bulk", input={"type": "embed",
                                                           "texts": [_SIXTEEN]})
            for i in range(16)]
    async with _paced(kafka_settings, topic_prefix, tmp_path) as service:
        # A target no wait here reaches: what the burst waited paced is not refused later.
        endpoint = msgspec.structs.replace(service.config.endpoints["embed"],
                                           latency_target_ms=120_000)
        await service.apply(msgspec.structs.replace(
            service.config, endpoints={**service.config.endpoints, "embed": endpoint}))
        cfg = service.config
        full = cfg.endpoints["embed"].max_batch_tokens
        async with running(SchedulerService(cfg, kafka_settings)):
            producer = make_producer(kafka_settings)
            await producer.start()
            try:
                await asyncio.gather(*[await producer.send(
                    topics.ingress, msgspec.json.encode(r), key=b"bulk") for r in held])
            finally:
                await producer.stop()

            def bulk_held() -> int:
                state = service.throttle.state
                lane = state.lanes.get("embed") if state is not None else None
                return 0 if lane is None else lane.org_held_tokens.get("bulk", 0)
            await _until(lambda: bulk_held() >= 4 * full,
                         "the scheduler's snapshot to show bulk's four full batches held",
                         timeout_s=30)
            state = service.throttle.state
            assert state.sent_ms <= time.time() * 1000 + 1000, "not the scheduler's own"
            assert state.lanes["embed"].tokens_per_s == 0.0  # no rate yet: the cold one paces

            await _send_burst(kafka_settings, topics.ingress, BURST)
            await _until(lambda: service.totals["admitted"] == len(held) + 1,
                         "quiet's record to be admitted")
            await _until(lambda: _read_ahead(service) == BURST, "bulk's records to wait read ahead")
            await asyncio.sleep(0.3)  # several of the pacer's looks: still held
            assert service.totals["admitted"] == len(held) + 1 and _read_ahead(service) == BURST

            async with running(fake_worker(cfg, kafka_settings, "w-a")):
                total = len(held) + BURST + 1
                await _until(lambda: service.totals["admitted"] == total, "all to be admitted",
                             timeout_s=30)
                records = await read_settled(kafka_settings, topics.tier("standard"), total,
                                             timeout_s=30)
        admitted = admitted_in(records)
        assert [a.id for a in admitted if a.id.startswith("bulk-")] == [
            f"bulk-{i}" for i in range(BURST)]
        assert sorted(a.id for a in admitted) == sorted(
            [r["id"] for r in held] + [f"bulk-{i}" for i in range(BURST)] + ["quiet-0"])
        assert service.totals["admitted"] == total, service.totals
        await _until_committed(service, total)

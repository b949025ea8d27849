"""After a failover the new leader charges the same adaptive costs as the old one.

Two scheduler services on the embedded broker, one endpoint with
``cost_model = "adaptive"``. The leader learns that one org costs five times
per token what another does from reports the standby never reads (handed to
the leader directly, as a history older than what a standby reads would be),
then from reports on the worker-events topic that both read. The leader
stops; the standby takes over from the costs in the leader's last state
snapshot plus the reports after it, and must charge each org exactly what
the old leader charged.
"""

from __future__ import annotations

import time

import pytest

from plumbing.kafka import KafkaSettings
from scheduler import Entry
from scheduler.service import SchedulerService, SchedulerSettings
from schemas.build import build_config
from schemas.codec import codec_for
from schemas.config import Config
from schemas.messages import BatchTiming, WorkerEvent
from schemas.topics import Topics
from tests.integration.pipeline_setup import produce, running, until

pytestmark = pytest.mark.integration

ORGS = ("pads", "lean", "other")


def make_config(prefix: str) -> Config:
    """One tier, the embed endpoint on the adaptive cost, the three orgs."""
    return build_config(
        prefix=prefix, heartbeat_ms=200, state_interval_ms=100, tier_partitions=1, tiers=["t0"],
        endpoints={"embed": {"cost_model": "adaptive", "quantum": 4096, "max_batch_tokens": 512,
                             "max_request_tokens": 512, "partitions": 1}},
        orgs=dict.fromkeys(ORGS, "t0")).config


def report(i: int, worker: str, pads_per_token: float) -> WorkerEvent:
    timings = [BatchTiming(org="pads", tokens=40, seconds=40 * pads_per_token),
               BatchTiming(org="lean", tokens=60, seconds=60 * 1e-4)]
    return WorkerEvent(worker=worker, endpoint="embed", kind="batch_done", partitions=[],
                       slots=1, free_slots=1, sent_ms=int(time.time() * 1000), batch_id=f"b{i}",
                       timings=timings)


def charged(s: SchedulerService) -> dict[str, float]:
    cost = s.core.lanes["embed"].cost.cost
    return {org: cost(Entry(f"probe-{org}", org, "t0", 100)) for org in ORGS}


async def test_the_new_leader_charges_the_same_adaptive_costs(kafka_settings: KafkaSettings,
                                                              topic_prefix: str):
    """Costs per org after a clean failover equal the old leader's, and differ without the handover."""
    cfg = make_config(topic_prefix)
    topics = Topics.of(cfg)
    settings = SchedulerSettings(leader_silence_ms=1000)
    a = SchedulerService(cfg, kafka_settings, settings=settings)
    b = SchedulerService(cfg, kafka_settings, settings=settings)
    async with running(a):
        await until(lambda: a.may_dispatch(), "the first scheduler to lead", 15)
        # History the standby never reads.
        for i in range(20):
            a._observe(report(i, "w-gone", 5e-4), time.time() * 1000)
        async with running(b):
            await until(lambda: b.election is not None and b.election.state == "standby",
                        "the second scheduler to stand by", 15)
            # Reports both read, from the topic.
            events = codec_for(WorkerEvent)
            await produce(kafka_settings, None,
                          [(topics.worker_events, 0, events.encode(report(100 + i, "w-live", 8e-4)))
                           for i in range(10)])
            await until(lambda: {r[2].batch_id for r in b.handover.recent} >=
                        {f"b{100 + i}" for i in range(10)}, "the standby to read the reports", 10)
            await until(lambda: {r[2].batch_id for r in a.handover.recent} >=
                        {f"b{100 + i}" for i in range(10)}, "the leader to read the reports", 10)
            # A snapshot of the leader's, taken after it read them all, reached the standby.
            t = time.time() * 1000
            await until(lambda: b.handover.latest is not None
                        and b.handover.latest.sent_ms > t, "a snapshot taken after them", 10)
            want = charged(a)
            standby_own = charged(b)
            a_epoch = a.epoch
            await a.stop()
            await until(lambda: b.may_dispatch(), "the standby to take over", 20)
            assert b.epoch > a_epoch
            got = charged(b)
    assert want["pads"] > 3 * want["lean"], want  # the measurements matter
    assert got == pytest.approx(want, rel=1e-12)
    assert standby_own != pytest.approx(want, rel=1e-3), "the standby alone would differ"

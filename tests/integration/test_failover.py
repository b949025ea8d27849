"""Active/standby schedulers and epoch fencing, in-process on the embedded broker.

Crashes (SIGKILL) of real processes are in ``test_crash.py``; here the
handover is a clean stop, and fencing is exercised with hand-written batches.
"""

from __future__ import annotations

import time

import pytest

from plumbing.kafka import KafkaSettings, group_generation
from plumbing.topics import ensure_topics
from scheduler.service import SchedulerService
from schemas.codec import codec_for
from schemas.messages import Batch
from schemas.topics import Topics
from tests.integration.pipeline_setup import (
    Reader,
    fake_worker,
    make_config,
    produce,
    request,
    running,
    sample,
    until,
)

pytestmark = pytest.mark.integration


async def test_standby_waits_then_takes_over_a_clean_stop(kafka_settings: KafkaSettings,
                                                          topic_prefix: str):
    """One leader at a time; after the leader stops, the standby serves the rest, nothing twice."""
    cfg = make_config(topic_prefix, slots=1)
    topics = Topics.of(cfg)
    a = SchedulerService(cfg, kafka_settings)
    b = SchedulerService(cfg, kafka_settings)
    worker = fake_worker(cfg, kafka_settings, "w-a", model="fake:ms_per_batch=40")
    reqs = [request(i, org, [f"text {i}"], tier="gold" if org == "acme" else "free",
                    topics=topics) for i, org in enumerate(["acme", "bulk"] * 20)]
    async with running(a), running(worker), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await until(lambda: a.readiness()[0], "the first scheduler to lead")
        before = group_generation(a.election.consumer)
        async with running(b):
            # b's join rebalances the leader group; once both members are in the
            # same, newer generation, the rebalance is over and a must still lead.
            def rebalanced() -> bool:
                ga = group_generation(a.election.consumer)
                gb = group_generation(b.election.consumer)
                return ga is not None and gb is not None and ga[0] == gb[0] > before[0]
            await until(rebalanced, "both schedulers in the leader group's next generation")
            await until(lambda: a.may_dispatch(), "the leader to resume after the rebalance")
            assert not b.leading and b.election.state == "standby"
            ready, why = b.readiness()
            assert not ready and why.startswith("standby")
            await until(lambda: b.flow.workers, "the standby to know the worker")
            await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
            await results.until(lambda items: len(items) >= 8, "the first results")
            a_epoch = a.epoch
            await a.stop()
            await until(lambda: b.readiness()[0], "the standby to take over")
            assert b.epoch > a_epoch
            await results.until(lambda items: {r.id for r in items} >= {r.id for r in reqs},
                                "a result for every request", timeout_s=30)
            await until(lambda: b.core.held == 0
                        and not any(w.outstanding for w in b.flow.workers.values()),
                        "the new leader to hold nothing and see every batch done")
            got = await results.settle()  # the whole topic, then a quiet second
    ids = [r.id for r in got]
    assert sorted(ids) == sorted(r.id for r in reqs), "a clean handover dispatches nothing twice"
    assert {r.status for r in got} == {"ok"}
    by_leader = {r.batch_id.split("-")[0] for r in got}
    assert by_leader == {a.instance, b.instance}
    assert worker.stats.max_backlog <= 1, "the new leader over-sent to a busy worker"


async def test_worker_drops_a_batch_older_than_one_it_saw(kafka_settings: KafkaSettings,
                                                          topic_prefix: str):
    """A batch of an older epoch after a newer one on a partition is skipped and committed past."""
    cfg = make_config(topic_prefix)
    topics = Topics.of(cfg)
    await ensure_topics(kafka_settings, topics.all(cfg))
    codec = codec_for(Batch)
    now = int(time.time() * 1000)
    reqs = [request(i, "acme", [f"text {i}"], topics=topics) for i in range(3)]
    batches = [Batch(id=f"b{i}", endpoint="embed", requests=[r], tokens=r.tokens, created_ms=now,
                     epoch=epoch) for i, (r, epoch) in enumerate(zip(reqs, (5, 3, 5)))]
    await produce(kafka_settings, None,
                  [(topics.batches("embed"), 0, codec.encode(b)) for b in batches])
    worker = fake_worker(cfg, kafka_settings, "w-f")
    async with running(worker), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await until(lambda: sample(worker.registry, "sf_worker_failures_total", endpoint="embed",
                                   reason="stale_epoch") == 1, "the stale batch to be dropped")
        await until(lambda: worker.stats.batches == 2, "the two current batches to be served")
        got = await results.settle()  # the whole topic, then a quiet second
        assert sorted(r.id for r in got) == sorted([reqs[0].id, reqs[2].id])

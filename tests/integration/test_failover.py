"""Active/standby schedulers and epoch fencing, in-process on the embedded broker.

Crashes (SIGKILL) of real processes are in ``test_crash.py``; here the
handover is a clean stop, and fencing is exercised with hand-written batches.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from plumbing.kafka import KafkaSettings
from plumbing.topics import ensure_topics
from scheduler.service import SchedulerService
from schemas.codec import codec_for
from schemas.messages import Batch, LeaderClaim
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
    # 250 ms a batch of 4: 40 requests take ~2.5 s, so the leader still holds work when it
    # stops after the first 8 results, on a loaded machine too (at 40 ms it had served
    # all 40 before its stop in one CI-like run at load average ~12, and the standby none).
    worker = fake_worker(cfg, kafka_settings, "w-a", model="fake:ms_per_batch=250")
    reqs = [request(i, org, [f"text {i}"], tier="gold" if org == "acme" else "free",
                    topics=topics) for i, org in enumerate(["acme", "bulk"] * 20)]
    async with running(a), running(worker), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await until(lambda: a.readiness()[0], "the first scheduler to lead")
        epoch = a.epoch
        async with running(b):
            # b reads a's beats and stands by: a keeps leading, with the same epoch.
            await until(lambda: b.election.log.leads(a.instance, epoch),
                        "the standby to read the leader's beats")
            await asyncio.sleep(2 * b.election.silence_s)
            assert a.election.state == "leading" and a.epoch == epoch, "the leader was replaced"
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
                     epoch=epoch) for i, (r, epoch) in enumerate(zip(reqs, (5, 3, 5), strict=True))]
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


async def test_a_new_leader_skips_what_its_predecessor_wrote_and_fences_the_rest(
        kafka_settings: KafkaSettings, topic_prefix: str):
    """A predecessor's batch before the fence is served by the worker and not dispatched
    again; one it writes after the fence (it was paused) is refused, its requests served once."""
    cfg = make_config(topic_prefix, slots=2)
    topics = Topics.of(cfg)
    await ensure_topics(kafka_settings, topics.all(cfg))
    batches, claims = codec_for(Batch), codec_for(LeaderClaim)
    reqs = [request(i, "acme", [f"text {i}"], topics=topics) for i in range(12)]
    await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
    # The predecessor: it claimed, beat, and wrote one batch of four, then went silent.
    now = int(time.time() * 1000)
    old = 1_000
    leader_log = [LeaderClaim(instance="old", epoch=old, kind="claim", sent_ms=now),
                  LeaderClaim(instance="old", epoch=old, kind="beat", sent_ms=now,
                              floor_ms=now - 1000, fenced_ms=now - 1000)]
    before = Batch(id="old-1", endpoint="embed", requests=reqs[:4], tokens=4, created_ms=now,
                   epoch=old)
    await produce(kafka_settings, None,
                  [(topics.scheduler_leader, 0, claims.encode(c)) for c in leader_log]
                  + [(topics.batches("embed"), 0, batches.encode(before))])
    worker = fake_worker(cfg, kafka_settings, "w-t")
    b = SchedulerService(cfg, kafka_settings)
    async with running(worker), running(b), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await until(lambda: b.readiness()[0], "the scheduler to take over from the silent one")
        assert b.election.log.predecessor(b.epoch).instance == "old"
        # The predecessor wakes up and sends what its producer held: behind the fences.
        late = [Batch(id=f"old-{2 + p}", endpoint="embed", requests=reqs[4 + 2 * p:6 + 2 * p],
                      tokens=2, created_ms=now, epoch=old) for p in (0, 1)]
        await produce(kafka_settings, None,
                      [(topics.batches("embed"), p, batches.encode(x)) for p, x in
                       zip((0, 1), late, strict=True)])
        await until(lambda: sample(worker.registry, "sf_worker_failures_total",
                                   endpoint="embed", reason="stale_epoch") == 2,
                    "both late batches to be refused")
        await results.until(lambda items: {r.id for r in items} >= {r.id for r in reqs},
                            "a result for every request", timeout_s=30)
        got = await results.settle()
    ids = [r.id for r in got]
    assert sorted(ids) == sorted(r.id for r in reqs), "a request served twice, or not at all"
    assert {r.batch_id for r in got if r.id in {q.id for q in reqs[:4]}} == {"old-1"}
    assert b.totals["taken_over_dispatched"] == 4


async def test_a_worker_does_not_run_a_request_it_already_answered(
        kafka_settings: KafkaSettings, topic_prefix: str):
    """A request id brought back by a later batch is skipped, counted, and answered once."""
    cfg = make_config(topic_prefix)
    topics = Topics.of(cfg)
    await ensure_topics(kafka_settings, topics.all(cfg))
    codec = codec_for(Batch)
    now = int(time.time() * 1000)
    r = [request(i, "acme", [f"text {i}"], topics=topics) for i in range(4)]
    batches = [Batch(id="b1", endpoint="embed", requests=[r[0], r[1]], tokens=2, created_ms=now),
               Batch(id="b2", endpoint="embed", requests=[r[1], r[2]], tokens=2, created_ms=now),
               Batch(id="b3", endpoint="embed", requests=[r[0]], tokens=1, created_ms=now),
               Batch(id="b4", endpoint="embed", requests=[r[3]], tokens=1, created_ms=now)]
    worker = fake_worker(cfg, kafka_settings, "w-d", slots=1)
    async with running(worker), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        for b in batches:  # one at a time: each after the one before was answered
            await produce(kafka_settings, None, [(topics.batches("embed"), 0, codec.encode(b))])
            want = {q.id for q in b.requests}
            await results.until(lambda items, want=want: want <= {x.id for x in items},
                                f"the results of {b.id}")
        got = await results.settle()
    assert sorted(x.id for x in got) == sorted(q.id for q in r), "a request was run twice"
    assert sample(worker.registry, "sf_worker_duplicate_requests_total", endpoint="embed") == 2

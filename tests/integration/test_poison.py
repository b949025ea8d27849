"""Poison on a real broker: hostile bursts against the running services.

Admission gets ~200 hostile ingress records from ``tests/fuzz/hostile.py``
(fixed seed) with good ones in between; the worker gets hostile records and
poisoned-but-decodable batches on its batch topic. Each service must stay up,
keep serving the good records, and account for every bad one: a dead letter,
an ``invalid`` result on an allowed reply topic, or both, never nothing.

A record counted in both is one that fails the schema yet still shows a valid
request id: it is kept on the dead-letter topic (its bytes, for an operator)
*and* answered ``invalid`` (so its sender is not left waiting for a result that
will never come). Every other bad record yields exactly one of the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from plumbing.kafka import KafkaSettings, make_consumer, make_producer, stop_consumer
from plumbing.topics import describe_topics, ensure_topics
from producer.service import AdmissionService, AdmissionSettings
from schemas.build import build_config
from schemas.codec import codec_for, format_from_headers
from schemas.config import Config
from schemas.messages import (
    AdmittedRequest,
    Batch,
    DeadLetter,
    EmbedInput,
    RerankInput,
    Result,
)
from schemas.topics import Topics
from tests.admission_setup import registry
from tests.fuzz.hostile import hostile_burst
from tests.fuzz.internal import KINDS, hostile_record_from
from tests.packed import admitted_in
from worker.service import WorkerService, WorkerSettings

pytestmark = pytest.mark.integration

#: The burst's seed: the same 200 hostile records on every run.
SEED = 20_261_129


def _config(prefix: str, **service) -> Config:
    return registry(prefix=prefix, **service).config


async def _until(cond, what: str, timeout_s: float = 30.0) -> None:
    """Wait for ``cond()`` (a bool, or an awaitable of one); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not await _holds(cond):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def _holds(cond) -> bool:
    got = cond()
    return await got if asyncio.iscoroutine(got) else bool(got)


async def _committed_to_end(consumer) -> bool:
    """A service's group consumer committed every assigned partition up to its high watermark:
    each record it read is decided and everything it wrote for it is acknowledged. Not
    while it holds no partition (mid-rebalance): nothing would be checked."""
    assigned = consumer.assignment()
    if not assigned:
        return False
    for tp in assigned:
        high = consumer.highwater(tp)
        if high is None or (await consumer.committed(tp) or 0) < high:
            return False
    return True


class _Tail:
    """Every record of some topics from the beginning (no group), kept as they come."""

    def __init__(self, kafka: KafkaSettings, partitions: dict[str, int]):
        self.kafka, self.partitions = kafka, partitions
        self.records: dict[str, list] = {t: [] for t in partitions}
        self._task: asyncio.Task | None = None

    async def __aenter__(self):
        self.consumer = make_consumer(self.kafka, group_id=None)
        await self.consumer.start()
        tps = [TopicPartition(t, p) for t, n in self.partitions.items() for p in range(n)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self):
        while True:
            for tp, recs in (await self.consumer.getmany(timeout_ms=100)).items():
                self.records[tp.topic].extend(recs)

    async def at_end(self) -> bool:
        """Every watched partition fetched and read up to its high watermark."""
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            if high is None or await self.consumer.position(tp) < high:
                return False
        return True

    async def __aexit__(self, *exc):
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await stop_consumer(self.consumer)


@contextlib.asynccontextmanager
async def _running(service):
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        yield task
    finally:
        service.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
        await service.stop()


def _results(records) -> list[Result]:
    codec = codec_for(Result)
    return [codec.decode(r.value, format_from_headers(r.headers)) for r in records]


async def test_admission_survives_a_hostile_burst(kafka_settings, topic_prefix):
    """200 hostile records: admission stays up, admits the good, and accounts for every bad one."""
    cfg = _config(topic_prefix)
    topics = Topics.of(cfg)
    reply_topic = f"{topic_prefix}replies.poison"
    await ensure_topics(kafka_settings, {**topics.all(cfg), reply_topic: 1})
    burst = hostile_burst(topic_prefix, 200, SEED, reply_topic=reply_topic)
    bad = [r for r in burst if not r.good]
    good = [r for r in burst if r.good]
    assert len(bad) == 200 and {r.label for r in bad} >= {"illegal_reply_to", "msgpack_bomb",
                                                          "deep_nesting", "unknown_org"}
    service = AdmissionService(cfg, kafka_settings, registry=CollectorRegistry(),
                               settings=AdmissionSettings(token_counter="fake", config_poll_ms=0))
    watched = {topics.dead_letters: 1, topics.results: cfg.service.results_partitions,
               reply_topic: 1, topics.tier("enterprise"): cfg.service.tier_partitions}
    async with _running(service) as task, _Tail(kafka_settings, watched) as tail:
        await _until(lambda: service.readiness()[0], "the ingress partitions")
        producer = make_producer(kafka_settings)
        await producer.start()
        where: dict[tuple[int, int], int] = {}  # (partition, offset) -> index in burst
        try:
            for i, r in enumerate(burst):
                meta = await producer.send_and_wait(topics.ingress, r.value, key=b"k%d" % (i % 7),
                                                    headers=r.headers)
                where[(meta.partition, meta.offset)] = i
        finally:
            await producer.stop()

        want_dead = sum(r.dead for r in bad)
        want_answers = sum(r.answered for r in bad)
        await _until(lambda: len(tail.records[topics.dead_letters]) >= want_dead
                     and len(tail.records[topics.results]) + len(tail.records[reply_topic])
                     >= want_answers
                     and len(admitted_in(tail.records[topics.tier("enterprise")])) >= len(good),
                     "every dead letter, answer and admission")
        # Nothing more can come: every record is committed (so what was written for it is
        # acknowledged), and the tail has read each output topic to its end.
        await _until(lambda: _committed_to_end(service._consumer), "the ingress commits")
        await _until(tail.at_end, "the outputs read to their end")
        assert not task.done(), "the admission loop died"
        assert service.readiness()[0]

        # Good records: admitted, all of them, and nothing else was.
        admitted = admitted_in(tail.records[topics.tier("enterprise")])
        assert sorted(a.id for a in admitted) == sorted(r.rid for r in good)

        # Dead letters: exactly the records that must be kept, each once, with a reason.
        letters = [codec_for(DeadLetter).decode(r.value) for r in tail.records[topics.dead_letters]]
        dead_idx = [where[(d.partition, d.offset)] for d in letters]
        assert sorted(dead_idx) == sorted(i for i, r in enumerate(burst) if r.dead)
        for d, i in zip(letters, dead_idx, strict=True):
            assert d.reason and d.error and d.source_topic == topics.ingress
            assert d.payload == (burst[i].value or b"")

        # Answers: every one invalid, on the address the trust rules allow, one per record.
        answers = [(topics.results, r) for r in _results(tail.records[topics.results])]
        answers += [(reply_topic, r) for r in _results(tail.records[reply_topic])]
        by_id = {r.rid: r for r in bad if r.answered}
        assert sorted(res.id for _, res in answers) == sorted(by_id)
        for topic, res in answers:
            assert res.status == "invalid" and res.reason and res.message, res
            assert topic == by_id[res.id].answer_to, (res.id, by_id[res.id].label, topic)

        # None lost: bad in = dead letters only + answers only + both (see the docstring).
        only_dead = sum(r.dead and not r.answered for r in bad)
        only_answered = sum(r.answered and not r.dead for r in bad)
        both = sum(r.dead and r.answered for r in bad)
        assert len(bad) == only_dead + only_answered + both
        assert len(letters) == only_dead + both and len(answers) == only_answered + both

    # Nothing was written outside the deployment's topics and the client's reply topic.
    existing = set(await describe_topics(kafka_settings, topic_prefix))
    assert existing <= set(topics.all(cfg)) | {reply_topic}, existing - set(topics.all(cfg))


# -- the worker ---------------------------------------------------------------------------


def _worker_config(prefix: str) -> Config:
    """One tier and acme: what the worker needs to take batches of the embed endpoint."""
    return build_config(prefix=prefix, heartbeat_ms=200, tiers=["gold"],
                        endpoints={"embed": {"quantum": 512, "max_batch_tokens": 512,
                                             "max_request_tokens": 512, "partitions": 2}},
                        orgs={"acme": "gold"}).config


def _request(rid: str, topics: Topics, *, inp=None, deadline_at_ms=None,
             fmt: str = "msgpack") -> AdmittedRequest:
    now = int(time.time() * 1000)
    return AdmittedRequest(id=rid, org="acme", endpoint="embed", tier="gold",
                           input=inp or EmbedInput(texts=("hello world",)), tokens=2,
                           deadline_at_ms=deadline_at_ms, created_ms=now, admitted_ms=now,
                           reply_to=topics.results, reply_format=fmt)


def _poisoned_batches(topics: Topics, rng: random.Random, n: int) -> list[Batch]:
    """Batches the schema accepts, each request in trouble: wrong input kind, expired,
    empty, 3,000 words, 150 texts, the same id twice, answers wanted in JSON."""
    batches = []
    for b in range(n):
        reqs = []
        for k in range(rng.randint(1, 4)):
            rid = f"p{b}-{k}"
            trouble = rng.choice(["kind", "expired", "empty", "long", "many", "dup", "json"])
            if trouble == "kind":
                reqs.append(_request(rid, topics, inp=RerankInput(query="q", documents=("d",))))
            elif trouble == "expired":
                reqs.append(_request(rid, topics, deadline_at_ms=1))
            elif trouble == "empty":
                reqs.append(_request(rid, topics, inp=EmbedInput(texts=("", " "))))
            elif trouble == "long":
                reqs.append(_request(rid, topics, inp=EmbedInput(texts=("w " * 3000,))))
            elif trouble == "many":
                reqs.append(_request(rid, topics, inp=EmbedInput(texts=("a b",) * 150)))
            elif trouble == "dup" and reqs:
                reqs.append(reqs[-1])
            else:
                reqs.append(_request(rid, topics, fmt="json"))
        batches.append(Batch(id=f"poisoned-{b}", endpoint="embed", requests=reqs, tokens=1,
                             created_ms=int(time.time() * 1000)))
    return batches


async def test_worker_survives_poisoned_batches(kafka_settings, topic_prefix):
    """Undecodable and poisoned batches: dead letters and per-request answers; good batches served."""
    cfg = _worker_config(topic_prefix)
    topics = Topics.of(cfg)
    await ensure_topics(kafka_settings, topics.all(cfg))
    rng = random.Random(SEED)
    codec = codec_for(Batch)
    undecodable = []
    while len(undecodable) < 40:
        value, headers, _ = hostile_record_from(Batch, rng.choice(KINDS),
                                                rng.getrandbits(64))
        if len(value or b"") > 1 << 20:
            continue
        try:
            codec.decode_record(value, headers)
        except Exception:  # noqa: BLE001 - only records the worker cannot read are wanted
            undecodable.append((value, headers))
    poisoned = _poisoned_batches(topics, rng, 20)
    mp = [("content-type", b"application/msgpack")]
    good = [Batch(id=f"good-{p}", endpoint="embed", requests=[_request(f"g{p}", topics)],
                  tokens=2, created_ms=int(time.time() * 1000)) for p in (0, 1)]
    worker = WorkerService(cfg, kafka_settings, WorkerSettings(endpoint="embed", model="fake",
                                                               worker_id="w-poison", slots=2))
    producer = make_producer(kafka_settings)
    await producer.start()
    try:
        items = [(v, h) for v, h in undecodable] + [(codec.encode(b), mp) for b in poisoned]
        random.Random(SEED).shuffle(items)
        for i, (value, headers) in enumerate(items):
            await producer.send_and_wait(topics.batches("embed"), value, key=b"k%d" % i,
                                         partition=i % 2, headers=headers)
        for p, b in enumerate(good):  # last on each partition: served only if nothing wedged
            await producer.send_and_wait(topics.batches("embed"), codec.encode(b), partition=p,
                                         headers=mp)
    finally:
        await producer.stop()

    want = {r.id for b in poisoned for r in b.requests} | {"g0", "g1"}
    answers = sum(len(b.requests) for b in poisoned) + 2
    watched = {topics.results: cfg.service.results_partitions, topics.dead_letters: 1}
    async with _Tail(kafka_settings, watched) as tail, _running(worker) as task:
        await _until(lambda: len(tail.records[topics.results]) >= answers
                     and len(tail.records[topics.dead_letters]) >= len(undecodable),
                     "every answer and dead letter", 45)
        await _until(lambda: _committed_to_end(worker._consumer), "every batch committed")
        await _until(tail.at_end, "the results and dead letters read to their end")
        assert not task.done(), "the worker died"
        results = _results(tail.records[topics.results])
        assert {r.id for r in results} == want and len(results) == answers
        status = {r.id: r.status for r in results}
        assert status["g0"] == status["g1"] == "ok"
        for b in poisoned:
            for r in b.requests:
                expected = "invalid" if isinstance(r.input, RerankInput) else \
                    "expired" if r.deadline_at_ms == 1 else "ok"
                assert status[r.id] == expected, (r.id, status[r.id])
        letters = [codec_for(DeadLetter).decode(r.value) for r in tail.records[topics.dead_letters]]
        assert len(letters) == len(undecodable) == worker.stats.dead_letters
        assert {d.source_topic for d in letters} == {topics.batches("embed")}
        assert all(d.reason in ("malformed", "invalid", "empty", "bad_content_type", "too_large")
                   for d in letters)


# -- the scheduler ------------------------------------------------------------------------


def _ghost_events(topics: Topics, now_ms: int) -> list:
    """Worker events that decode but lie: partitions that do not exist, 1024 free slots,
    NaN and int64-sized timings, an unknown endpoint, a time stamp in year 5138."""
    from schemas.messages import BatchTiming, WorkerEvent

    common = {"slots": 1024, "free_slots": 1024, "sent_ms": now_ms}
    return [
        WorkerEvent(worker="ghost-a", endpoint="embed", kind="hello", partitions=[99],
                    **common),
        WorkerEvent(worker="ghost-b", endpoint="embed", kind="heartbeat", partitions=[-1, 7],
                    **common),
        WorkerEvent(worker="ghost-c", endpoint="nope", kind="hello", partitions=[0], **common),
        WorkerEvent(worker="ghost-d", endpoint="embed", kind="batch_done", partitions=[],
                    slots=0, free_slots=0, sent_ms=10**14, batch_id="nothing",
                    batch_tokens=2**63 - 1, inference_ms=float("nan"),
                    timings=[BatchTiming(org="acme", tokens=2**63 - 1, seconds=float("nan")),
                             BatchTiming(org="acme", tokens=1, seconds=5e-324)]),
    ]


async def test_scheduler_survives_poisoned_worker_events(kafka_settings, topic_prefix):
    """Lying and undecodable worker events: the scheduler stays up and a real worker gets the work."""
    from scheduler.service import SchedulerService
    from schemas.messages import WorkerEvent

    cfg = _worker_config(topic_prefix)
    topics = Topics.of(cfg)
    await ensure_topics(kafka_settings, topics.all(cfg))
    rng = random.Random(SEED)
    mp = [("content-type", b"application/msgpack")]
    scheduler = SchedulerService(cfg, kafka_settings)
    worker = WorkerService(cfg, kafka_settings, WorkerSettings(endpoint="embed", model="fake",
                                                               worker_id="w-real"))
    reqs = [_request(f"r{i}", topics) for i in range(6)]
    watched = {topics.results: cfg.service.results_partitions}
    async with _Tail(kafka_settings, watched) as tail, _running(scheduler) as task:
        await _until(lambda: scheduler.readiness()[0], "the scheduler to lead", 30)
        producer = make_producer(kafka_settings)
        await producer.start()
        try:
            for _ in range(30):
                value, headers, _ = hostile_record_from(WorkerEvent, rng.choice(KINDS),
                                                        rng.getrandbits(64))
                if len(value or b"") < 1 << 20:
                    await producer.send_and_wait(topics.worker_events, value, key=b"x",
                                                 headers=headers)
            for ev in _ghost_events(topics, int(time.time() * 1000)):
                await producer.send_and_wait(topics.worker_events,
                                             codec_for(WorkerEvent).encode(ev), key=b"x",
                                             headers=mp)
            for r in reqs:
                await producer.send_and_wait(topics.tier("gold"),
                                             codec_for(AdmittedRequest).encode(r), key=b"acme",
                                             headers=mp)
        finally:
            await producer.stop()
        async with _running(worker):
            await _until(lambda: task.done() or len(tail.records[topics.results]) >= len(reqs),
                         "the requests to be served", 45)
        assert not task.done(), f"the scheduler died: {task.exception()!r}"
        results = _results(tail.records[topics.results])
        assert sorted(r.id for r in results) == sorted(r.id for r in reqs)
        assert all(r.status == "ok" for r in results)

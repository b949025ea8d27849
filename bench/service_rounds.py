"""Each service alone on the broker, against a raw aiokafka relay of the same records.

Used by ``bench/pipeline.py``. A service's own cost is what it adds to the
Kafka I/O it cannot avoid: it reads its input topic and writes its output.
The baseline is the least a correct Kafka service does with the same
records: a consumer in a group reads them, a producer writes the same
output records (``send()`` each, wait for the acknowledgements, commit),
and a reader reads them back. Both sides run in this process on the same
event loop; time runs from the first input record sent to the last output
record read. ``ratio = relay seconds / service seconds`` (1.0: the service
costs nothing beyond its I/O).

- **admission**: ingress requests (JSON, keyed by org) -> ``requests.<tier>``;
  relay: each ingress record written to the tier topic as it is.
- **scheduler**: admitted requests on ``requests.<tier>``, packed as
  admission packs them (one pack per org per step of 100), -> batches on
  ``batches.embed``, read by a stub fleet (``workers`` of ``slots`` each, the
  batch partitions dealt among them) that reports each batch done the
  moment it reads it (no model at all); relay: one tier record per request,
  each written to a batch topic as it is (the baseline stays one record per
  request, so the ratio shows what packs gain). The scheduler has first served
  ``warm_up`` requests (2,048 by default, untimed): a fresh scheduler gives each
  stub worker one batch at a time until that worker's first report measures its
  credit (:mod:`scheduler.credit`), which a scheduler that has been serving has
  done long before; the relay's consumers are likewise assigned and fetching
  before its round is timed.
- **worker**: batches of 64 requests -> one result per request (fake model
  at zero time); relay: each batch record answered by the same result
  records, made beforehand by the worker's own executor (the same vectors
  and stamps, so the same bytes).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

import msgspec
from aiokafka.structs import TopicPartition

from plumbing.bounded import bounded
from plumbing.kafka import Consumer, KafkaSettings, make_consumer, make_producer
from plumbing.topics import delete_topics, ensure_topics
from producer.service import AdmissionService, AdmissionSettings
from scheduler.service import SchedulerService
from schemas.codec import DecodeError, codec_for, format_from_headers
from schemas.config import Config
from schemas.messages import AdmittedRequest, Batch, EmbedInput, Request, Result, WorkerEvent
from schemas.packs import PACK_HEADER, encode_packed, is_pack, unpack_requests, unpack_results
from schemas.topics import Topics
from worker.execute import BatchExecutor
from worker.fake import FakeEmbedder
from worker.service import WorkerService, WorkerSettings

__all__ = ["MSGPACK", "WARM_UP", "BatchHead", "Phases", "admission_rounds", "batch_reader",
           "scheduler_rounds", "send_all_tiers", "tier_records", "until", "worker_rounds"]

MSGPACK = [("content-type", b"application/msgpack")]
_JSON = [("content-type", b"application/json")]
_PACK = [*MSGPACK, PACK_HEADER]
Record = tuple[bytes, bytes | None, list]  # value, key, headers


async def _send_all(kafka: KafkaSettings, topic: str, records: list[Record],
                    partition_of: Callable[[int], int | None] = lambda i: None) -> None:
    producer = make_producer(kafka)
    await producer.start()
    try:
        futures = [await producer.send(topic, v, key=k, headers=h, partition=partition_of(i))
                   for i, (v, k, h) in enumerate(records)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _read_until(kafka: KafkaSettings, topics: dict[str, int], count: Callable[[object], int],
                      total: int, started: asyncio.Event, timeout_s: float = 120.0) -> float:
    """Read ``topics`` from their start until ``count`` of the records reaches ``total``."""
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        started.set()
        seen = 0
        async with asyncio.timeout(timeout_s):
            while seen < total:
                got = await consumer.getmany(timeout_ms=100)
                for recs in got.values():
                    for rec in recs:
                        seen += count(rec)
        return time.perf_counter()
    finally:
        await consumer.stop()


async def _timed(kafka: KafkaSettings, send: Callable, out: dict[str, int],
                 count: Callable[[object], int], total: int) -> float:
    started = asyncio.Event()
    reader = asyncio.create_task(_read_until(kafka, out, count, total, started))
    await started.wait()
    await asyncio.sleep(0.2)  # the reader's first fetch is out
    t0 = time.perf_counter()
    await send()
    return await reader - t0


def _requests_in(rec) -> int:
    """Requests (or results) one output record carries: a pack's count, else one.

    A pack of admitted requests (admission's) or of results (a worker's, for a
    sender that asked): the same header, told apart by the field it holds.
    """
    if not is_pack(rec.headers):
        return 1
    fmt = format_from_headers(rec.headers)
    try:
        return len(unpack_requests(rec.value, fmt))
    except DecodeError:
        return len(unpack_results(rec.value, fmt))


class _Relay:
    """The raw baseline: a group consumer that writes ``out_for(record)`` for each record."""

    def __init__(self, kafka: KafkaSettings, in_topic: str, out_for: Callable):
        self.kafka, self.in_topic, self.out_for = kafka, in_topic, out_for

    async def __aenter__(self):
        self.consumer = make_consumer(self.kafka, self.in_topic,
                                      group_id=f"relay-{uuid.uuid4().hex[:8]}")
        await self.consumer.start()
        self.producer = make_producer(self.kafka)
        await self.producer.start()
        async with asyncio.timeout(30):
            while not self.consumer.assignment():
                await asyncio.sleep(0.05)
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            got = await self.consumer.getmany(timeout_ms=100, max_records=500)
            futures = []
            for recs in got.values():
                for rec in recs:
                    for topic, value, key, headers in self.out_for(rec):
                        futures.append(await self.producer.send(topic, value, key=key,
                                                                headers=headers))
            if futures:
                await asyncio.gather(*futures)
                await self.consumer.commit()

    async def __aexit__(self, *exc):
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.producer.stop()
        await self.consumer.stop()


def _requests(n: int, orgs: list[str], words: int, reply_to: str) -> list[Request]:
    text = " ".join(["word"] * words)
    run = uuid.uuid4().hex[:6]
    return [Request(id=f"r{i}-{run}", org=orgs[i % len(orgs)], endpoint="embed",
                    input=EmbedInput(texts=(text,)), reply_to=reply_to) for i in range(n)]


def _admitted(n: int, orgs: list[str], config: Config, words: int) -> list[AdmittedRequest]:
    now = int(time.time() * 1000)
    topics = Topics.of(config)
    text = " ".join(["word"] * words)
    return [AdmittedRequest(id=f"a{i}-{uuid.uuid4().hex[:6]}", org=orgs[i % len(orgs)],
                            endpoint="embed", tier=config.orgs[orgs[i % len(orgs)]].tier,
                            input=EmbedInput(texts=(text,)), tokens=words, created_ms=now,
                            admitted_ms=now, reply_to=topics.results)
            for i in range(n)]


ConfigFor = Callable[[], Config]
#: Requests a scheduler serves, untimed, before its round (see the module doc).
WARM_UP = 2048


async def admission_rounds(kafka: KafkaSettings, config_for: ConfigFor, n: int, words: int,
                           repeat: int) -> tuple[list[float], list[float]]:
    """(relay seconds, admission seconds) per round, interleaved; a fresh prefix per round."""
    codec = codec_for(Request)
    relay_s, service_s = [], []
    for r in range(repeat):
        config = config_for()
        topics = Topics.of(config)
        orgs = [o for o in config.orgs if config.orgs[o].tier != "free"]
        out = {topics.tier(t): config.service.tier_partitions for t in config.tier_names}
        reqs = _requests(n, orgs, words, topics.results)
        records = [(codec.encode(q, "json"), q.org.encode(), _JSON) for q in reqs]
        # Relay: ingress -> a tier topic, each record as it is.
        tier_topic = f"{topics.prefix}relay-{r}"
        await ensure_topics(kafka, {topics.ingress: config.service.ingress_partitions,
                                    tier_topic: config.service.tier_partitions})
        async with _Relay(kafka, topics.ingress,
                          lambda rec, t=tier_topic: [(t, rec.value, rec.key, MSGPACK)]):
            relay_s.append(await _timed(kafka, lambda t=topics.ingress, rs=records: _send_all(kafka, t, rs),
                                        {tier_topic: config.service.tier_partitions},
                                        _requests_in, n))
        await delete_topics(kafka, [tier_topic, topics.ingress])
        config = config_for()
        topics = Topics.of(config)
        out = {topics.tier(t): config.service.tier_partitions for t in config.tier_names}
        records = [(codec.encode(q, "json"), q.org.encode(), _JSON)
                   for q in _requests(n, orgs, words, topics.results)]
        service = AdmissionService(config, kafka, settings=AdmissionSettings(token_counter="fake"))
        await service.start()
        task = asyncio.create_task(service.run())
        try:
            async with asyncio.timeout(30):
                while not service.readiness()[0]:
                    await asyncio.sleep(0.05)
            service_s.append(await _timed(kafka, lambda t=topics.ingress, rs=records: _send_all(kafka, t, rs),
                                          out, _requests_in, n))
        finally:
            service.request_stop()
            await asyncio.wait_for(task, 30)
            await service.stop()
        await delete_topics(kafka, list(topics.all(config)))
    return relay_s, service_s


class BatchHead(msgspec.Struct):
    """A batch as a stub worker reads it: its requests left unparsed."""

    id: str
    tokens: int
    requests: list[msgspec.Raw]
    worker: str = ""


async def batch_reader(kafka: KafkaSettings, topics: Topics, partitions: int) -> Consumer:
    """A started consumer (no group) of every partition of ``embed``'s batch topic, from
    its start: a stub fleet's."""
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    tps = [TopicPartition(topics.batches("embed"), p) for p in range(partitions)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return consumer


class _StubWorker:
    """A fleet of ``workers`` stub workers of ``slots`` each, the batch partitions dealt
    among them: one consumer takes batches off every partition and reports each done
    at once, in the name of the worker it was sent to."""

    def __init__(self, kafka: KafkaSettings, config: Config, slots: int, workers: int = 1):
        self.kafka, self.topics, self.slots = kafka, Topics.of(config), slots
        self.partitions = config.endpoints["embed"].partitions
        # One partition at least each: a partition has one owner.
        self.names = [f"stub-{i}" for i in range(max(1, min(workers, self.partitions)))]
        self.requests = 0
        self.batches = 0
        # Only what it reports back: a stub costs the scheduler's bench as little as it can.
        self._batch = msgspec.msgpack.Decoder(BatchHead)
        self._event = codec_for(WorkerEvent)

    def _owned(self, name: str) -> list[int]:
        i, n = self.names.index(name), len(self.names)
        return [p for p in range(self.partitions) if p % n == i]

    def _ev(self, kind: str, worker: str, **fields) -> bytes:
        return self._event.encode(WorkerEvent(
            worker=worker, endpoint="embed", kind=kind, partitions=self._owned(worker),
            slots=self.slots, free_slots=self.slots, sent_ms=int(time.time() * 1000), **fields))

    async def __aenter__(self):
        self.consumer = await batch_reader(self.kafka, self.topics, self.partitions)
        self.producer = make_producer(self.kafka, linger_ms=0)
        await self.producer.start()
        for name in self.names:
            await self.producer.send_and_wait(self.topics.worker_events, self._ev("hello", name),
                                              key=name.encode(), headers=MSGPACK)
        self.tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._beat())]
        return self

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            for name in self.names:
                await self.producer.send(self.topics.worker_events, self._ev("heartbeat", name),
                                         key=name.encode(), headers=MSGPACK)

    async def _run(self) -> None:
        while True:
            got = await self.consumer.getmany(timeout_ms=100)
            for recs in got.values():
                for rec in recs:
                    batch = self._batch.decode(rec.value)
                    self.requests += len(batch.requests)
                    self.batches += 1
                    name = batch.worker if batch.worker in self.names else self.names[0]
                    await self.producer.send(
                        self.topics.worker_events,
                        self._ev("batch_done", name, batch_id=batch.id,
                                 batch_requests=len(batch.requests), batch_tokens=batch.tokens,
                                 service_ms=0.001, held_ms=0.001),
                        key=name.encode(), headers=MSGPACK)

    async def __aexit__(self, *exc):
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.producer.stop()
        await self.consumer.stop()


def tier_records(config: Config, n: int, words: int,
                  step: int = 100) -> dict[str, list[Record]]:
    """What admission writes for ``n`` requests of its orgs in turn: each step of ``step``
    requests (its ``max_step_records``) as one pack per org (one request alone: a plain
    record), in the order decided."""
    topics = Topics.of(config)
    orgs = [o for o in config.orgs if config.orgs[o].tier != "free"]
    codec = codec_for(AdmittedRequest)
    admitted = _admitted(n, orgs, config, words)
    by_tier: dict[str, list[Record]] = {}
    for at in range(0, n, step):
        packs: dict[str, list[AdmittedRequest]] = {}
        for q in admitted[at:at + step]:
            packs.setdefault(q.org, []).append(q)
        for org, reqs in packs.items():
            topic = topics.tier(reqs[0].tier)
            if len(reqs) == 1:
                by_tier.setdefault(topic, []).append((codec.encode(reqs[0]), org.encode(),
                                                      MSGPACK))
            else:
                by_tier.setdefault(topic, []).append(
                    (encode_packed([codec.encode(q) for q in reqs]), org.encode(), _PACK))
    return by_tier


def _single_records(config: Config, n: int, words: int) -> dict[str, list[Record]]:
    """One record per admitted request: the relay's input (the baseline stays a record
    per request, so the ratio shows what packs gained)."""
    topics = Topics.of(config)
    orgs = [o for o in config.orgs if config.orgs[o].tier != "free"]
    codec = codec_for(AdmittedRequest)
    by_tier: dict[str, list[Record]] = {}
    for q in _admitted(n, orgs, config, words):
        by_tier.setdefault(topics.tier(q.tier), []).append(
            (codec.encode(q), q.org.encode(), MSGPACK))
    return by_tier


async def scheduler_rounds(kafka: KafkaSettings, config_for: ConfigFor, n: int, words: int,
                           repeat: int, slots: int, fleets: tuple[int, ...] = (1,),
                           phases: dict[int, list[Phases]] | None = None,
                           warm_up: int = WARM_UP
                           ) -> tuple[list[float], dict[int, list[float]]]:
    """(relay seconds, {fleet: scheduler seconds}) per round, interleaved: each round the
    relay, then the scheduler feeding each stub fleet of ``fleet`` workers of ``slots``.
    ``phases``: filled with each round's :class:`Phases`, by fleet; ``warm_up``: requests
    each scheduler serves before its round is timed (0: none)."""
    relay_s: list[float] = []
    service_s: dict[int, list[float]] = {w: [] for w in fleets}
    for _ in range(repeat):
        config = config_for()
        topics = Topics.of(config)
        by_tier = _single_records(config, n, words)
        out_topic = f"{topics.prefix}relay-batches"
        await ensure_topics(kafka, {**topics.all(config), out_topic: 4})
        relays = [_Relay(kafka, t, lambda rec, o=out_topic: [(o, rec.value, rec.key, MSGPACK)])
                  for t in by_tier]
        for relay in relays:
            await relay.__aenter__()
        try:
            relay_s.append(await _timed(kafka, _sender(kafka, by_tier), {out_topic: 4},
                                        _requests_in, n))
        finally:
            for relay in relays:
                await relay.__aexit__()
        await delete_topics(kafka, [out_topic, *topics.all(config)])
        for workers in fleets:
            seconds, phase = await _scheduler_round(kafka, config_for(), n, words, slots, workers,
                                                    warm_up)
            service_s[workers].append(seconds)
            if phases is not None:
                phases.setdefault(workers, []).append(phase)
    return relay_s, service_s


async def send_all_tiers(kafka: KafkaSettings, by_tier: dict[str, list[Record]]) -> None:
    """Write each tier topic's records (:func:`tier_records`), the topics side by side."""
    await asyncio.gather(*(_send_all(kafka, t, recs) for t, recs in by_tier.items()))


def _sender(kafka: KafkaSettings, by_tier: dict[str, list[Record]]) -> Callable:
    return lambda: send_all_tiers(kafka, by_tier)


async def until(done: Callable[[], bool]) -> None:
    """Return once ``done()``, looking every 2 ms (bound it: :func:`bounded`)."""
    while not done():
        await asyncio.sleep(0.002)


class Phases(NamedTuple):
    """Where a scheduler round's time went, in ms from its first tier record sent, read
    from the service's own counts as the round waits (every 2 ms): its first request
    held, its last one held (the intake's slice holding it done), its last one in a
    batch the broker acknowledged, and the stub fleet's read of the last."""

    first_held_ms: float
    all_held_ms: float
    all_dispatched_ms: float
    all_read_ms: float


async def _scheduler_round(kafka: KafkaSettings, config: Config, n: int, words: int, slots: int,
                           workers: int, warm_up: int = WARM_UP) -> tuple[float, Phases]:
    """Seconds from the first tier record sent until the stub fleet has read all ``n``, and
    the round's :class:`Phases`; ``warm_up`` requests served first, untimed."""
    by_tier = tier_records(config, n, words)
    service = SchedulerService(config, kafka)
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        async with _StubWorker(kafka, config, slots, workers) as stub:
            async with asyncio.timeout(30):
                while not (service.readiness()[0]
                           and len(service.flow.workers) >= len(stub.names)):
                    await asyncio.sleep(0.05)
            totals = service.totals
            if warm_up > 0:
                await _sender(kafka, tier_records(config, warm_up, words))()
                await bounded(until(lambda: stub.requests >= warm_up
                                     and totals["dispatched"] >= warm_up), 60,
                              f"the stub fleet to read the {warm_up:,} warm-up requests")
                stub.requests = 0
            received, dispatched = totals["received"], totals["dispatched"]
            marks: dict[str, float] = {}

            def mark(name: str, reached: bool) -> None:
                if reached and name not in marks:
                    marks[name] = (time.perf_counter() - t0) * 1000

            async def watch() -> None:
                while True:
                    # The core's count moves request by request; the totals once a slice.
                    mark("first", service.core.held > 0 or totals["received"] > received)
                    mark("held", totals["received"] - received >= n)
                    mark("dispatched", totals["dispatched"] - dispatched >= n)
                    await asyncio.sleep(0.002)

            t0 = time.perf_counter()
            watcher = asyncio.create_task(watch())
            try:
                await _sender(kafka, by_tier)()
                await bounded(until(lambda: stub.requests >= n), 120,
                              f"the stub fleet to read all {n:,} requests")
                seconds = time.perf_counter() - t0
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            for name in ("first", "held", "dispatched"):
                mark(name, True)  # reached by now: the fleet read all n
            return seconds, Phases(marks["first"], marks["held"], marks["dispatched"],
                                   seconds * 1000)
    finally:
        service.request_stop()
        await asyncio.wait_for(task, 30)
        await service.stop()
        await delete_topics(kafka, list(Topics.of(config).all(config)))


async def _worker_answers(batch: Batch, rcodec) -> list[tuple[str, bytes, bytes, list]]:
    """The result records a worker writes for ``batch``: same model, same fields, same bytes.

    A relay that wrote smaller records (a constant vector, no stamps) was
    compared with a worker writing real ones: the ratio charged the worker
    for bytes the relay never sent.
    """
    executor = BatchExecutor(FakeEmbedder(), "embed", worker="relay", inline=True)
    taken = int(time.time() * 1000)
    out = []
    async for done in executor.serve(batch):
        for s in done:
            s.result.taken_ms = taken
            fmt = s.request.reply_format
            out.append((s.request.reply_to, rcodec.encode(s.result, fmt), s.result.id.encode(),
                        MSGPACK if fmt == "msgpack" else _JSON))
    return out


async def worker_rounds(kafka: KafkaSettings, config_for: ConfigFor, n: int, words: int,
                        repeat: int, slots: int) -> tuple[list[float], list[float]]:
    """(relay seconds, worker seconds) per round, interleaved; batches of 64 requests."""
    bcodec, rcodec = codec_for(Batch), codec_for(Result)
    relay_s, service_s = [], []

    def make(config: Config):
        topics = Topics.of(config)
        orgs = [o for o in config.orgs if config.orgs[o].tier != "free"]
        reqs = _admitted(n, orgs, config, words)
        batches = [Batch(id=f"b{i}-{uuid.uuid4().hex[:6]}", endpoint="embed",
                         requests=reqs[i:i + 64], tokens=64 * words,
                         created_ms=int(time.time() * 1000))
                   for i in range(0, n, 64)]
        records = [(bcodec.encode(b), b.id.encode(), MSGPACK) for b in batches]
        parts = config.endpoints["embed"].partitions
        send = lambda: _send_all(kafka, topics.batches("embed"), records,
                                 lambda i: i % parts)
        return topics, batches, records, send

    for _ in range(repeat):
        config = config_for()
        topics, batches, records, send = make(config)
        # The very records the worker writes for these batches (the fake
        # model's vectors, every stamp), made beforehand by its executor.
        answers = {rec[0]: await _worker_answers(b, rcodec)
                   for b, rec in zip(batches, records, strict=True)}
        out = {topics.results: config.service.results_partitions}
        await ensure_topics(kafka, topics.all(config))
        async with _Relay(kafka, topics.batches("embed"), lambda rec, a=answers: a[rec.value]):
            relay_s.append(await _timed(kafka, send, out, _requests_in, n))
        await delete_topics(kafka, list(topics.all(config)))

        config = config_for()
        topics, batches, records, send = make(config)
        out = {topics.results: config.service.results_partitions}
        worker = WorkerService(config, kafka, WorkerSettings(endpoint="embed", model="fake",
                                                            slots=slots, warm_up=False))
        await worker.start()
        task = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(30):
                while not worker.readiness()[0]:
                    await asyncio.sleep(0.05)
            service_s.append(await _timed(kafka, send, out, _requests_in, n))
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, 30)
            await worker.stop()
        await delete_topics(kafka, list(topics.all(config)))
    return relay_s, service_s

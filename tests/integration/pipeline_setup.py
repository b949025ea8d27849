"""What the in-process pipeline tests share: a small registry, records, a reader, waits.

Services run as asyncio tasks against the session's Tansu broker, each test
under a fresh topic prefix. Requests are written straight to
``requests.<tier>`` as admission would write them; what the services write
is read back with :class:`Reader`.

Every wait here is a condition with a bounded timeout that names what it
waited for; none measures how long something took.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer, make_producer, stop_consumer
from schemas.build import build_config
from schemas.codec import DecodeError, codec_for, format_from_headers
from schemas.config import Config
from schemas.messages import AdmittedRequest, EmbedInput, RerankInput, Result
from schemas.topics import Topics
from tests.packed import messages_in
from worker.service import WorkerService, WorkerSettings

__all__ = ["Reader", "fake_worker", "make_config", "produce", "request", "rerank_request",
           "running", "sample", "until"]

_MSGPACK = [("content-type", b"application/msgpack")]


def make_config(prefix: str, *, model: str = "fake", worker_timeout_ms: int = 1500,
                slots: int = 1, max_held: int = 10_000, rerank: Mapping[str, Any] | None = None,
                orgs: Mapping[str, str] | None = None) -> Config:
    """Two tiers (gold: acme, free: bulk), an embed and a rerank endpoint; ``rerank`` fields
    go into the rerank endpoint, ``orgs`` (name: tier) are added."""
    return build_config(
        prefix=prefix, max_held_requests=max_held, worker_slots=slots,
        worker_timeout_ms=worker_timeout_ms, heartbeat_ms=200, state_interval_ms=100,
        tier_partitions=2,
        endpoints={"embed": {"model": model, "quantum": 512, "max_batch_tokens": 512,
                             "max_batch_size": 4, "max_request_tokens": 512, "partitions": 2},
                   "rerank": {"partitions": 1, **(rerank or {})}},
        orgs={"acme": "gold", "bulk": "free", **(orgs or {})}).config


def request(i: int, org: str, texts: list[str], *, tier: str = "gold", endpoint: str = "embed",
            deadline_in_ms: int | None = None, topics: Topics) -> AdmittedRequest:
    """An admitted embed request; tokens are the texts' words, as the fake model counts them."""
    now = int(time.time() * 1000)
    return AdmittedRequest(
        id=f"req-{i}-{uuid.uuid4().hex[:6]}", org=org, endpoint=endpoint, tier=tier,
        input=EmbedInput(texts=texts), tokens=sum(len(t.split()) for t in texts) or 1,
        deadline_at_ms=None if deadline_in_ms is None else now + deadline_in_ms,
        created_ms=now, admitted_ms=now, reply_to=topics.results, reply_format="msgpack")


def rerank_request(i: int, org: str, query: str, documents: list[str], *, tier: str,
                   topics: Topics) -> AdmittedRequest:
    """An admitted rerank request; tokens are the words of the query and documents."""
    now = int(time.time() * 1000)
    tokens = sum(len(t.split()) for t in [query, *documents]) or 1
    return AdmittedRequest(
        id=f"rr-{i}-{uuid.uuid4().hex[:6]}", org=org, endpoint="rerank", tier=tier,
        input=RerankInput(query=query, documents=documents), tokens=tokens, created_ms=now,
        admitted_ms=now, reply_to=topics.results, reply_format="msgpack")


async def produce(kafka: KafkaSettings, topic_of, records) -> list:
    """Write records (AdmittedRequest, or (topic, partition, raw bytes)) and wait for acks.

    Returns each record's metadata (partition, offset), in order.
    """
    producer = make_producer(kafka)
    await producer.start()
    metas = []
    try:
        codec = codec_for(AdmittedRequest)
        for r in records:
            if isinstance(r, AdmittedRequest):
                metas.append(await producer.send_and_wait(topic_of(r), codec.encode(r),
                                                          key=r.org.encode(), headers=_MSGPACK))
            else:
                topic, partition, raw = r
                metas.append(await producer.send_and_wait(topic, raw, partition=partition,
                                                          headers=_MSGPACK))
    finally:
        await producer.stop()
    return metas


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 15.0,
                step_s: float = 0.02) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(step_s)


class Reader:
    """Reads one topic from the beginning (no group), decoding each record (each item of
    a pack, :mod:`tests.packed`).

    :meth:`until` reads until a condition on what was read holds;
    :meth:`settle` reads everything written so far and then a quiet period
    more, for checks that something did *not* happen (nothing twice).
    """

    def __init__(self, kafka: KafkaSettings, topic: str, partitions: int, typ=Result):
        self.kafka, self.topic, self.partitions = kafka, topic, partitions
        self.typ = typ
        self.items: list = []
        #: (partition, offset) of each item, in the same order.
        self.where: list[tuple[int, int]] = []
        #: The wire format of each item's record ("json", "msgpack"; None where its
        #: content-type names none this project reads), in the same order.
        self.formats: list[str | None] = []

    async def __aenter__(self):
        self.consumer = make_consumer(self.kafka, group_id=None)
        await self.consumer.start()
        self.tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)
        return self

    async def __aexit__(self, *exc):
        await stop_consumer(self.consumer)

    async def _fetch(self) -> None:
        got = await self.consumer.getmany(timeout_ms=100)
        for records in got.values():
            for rec in records:
                # A pack's items each count as one, at their record's place.
                try:
                    fmt: str | None = format_from_headers(rec.headers)
                except DecodeError:
                    fmt = None  # its items are DecodeErrors too (messages_in)
                for msg in messages_in(self.typ, rec.value, rec.headers):
                    self.items.append(msg)
                    self.where.append((rec.partition, rec.offset))
                    self.formats.append(fmt)

    async def until(self, done: Callable[[list], bool], what: str,
                    timeout_s: float = 15.0) -> list:
        """Read (at least one fetch) until ``done(items)``; fail naming ``what`` at the timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._fetch()
                while not done(self.items):
                    await self._fetch()
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} on "
                                 f"{self.topic} ({len(self.items)} records read)") from None
        return self.items

    async def at_end(self) -> bool:
        """True once every partition was fetched and read up to its high watermark."""
        for tp in self.tps:
            high = self.consumer.highwater(tp)
            if high is None or await self.consumer.position(tp) < high:
                return False
        return True

    async def settle(self, quiet_s: float = 1.0, timeout_s: float = 15.0) -> list:
        """Everything written so far (read to each partition's end), then ``quiet_s`` more.

        Call it once the writers are done (a condition, e.g. nothing held and
        every batch committed): whatever a late duplicate would add shows up
        in the quiet period, which is bounded and only ever reads.
        """
        try:
            async with asyncio.timeout(timeout_s):
                await self._fetch()
                while not await self.at_end():
                    await self._fetch()
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout_s} s reading {self.topic} "
                                 f"to its end ({len(self.items)} records read)") from None
        end = time.monotonic() + quiet_s
        while time.monotonic() < end:
            await self._fetch()
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
                slots: int | None = None, endpoint: str = "embed") -> WorkerService:
    return WorkerService(cfg, kafka, WorkerSettings(endpoint=endpoint, model=model, slots=slots,
                                                    worker_id=name))


def sample(registry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0

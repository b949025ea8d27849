"""The admission service against the embedded broker: records in, the right topics out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from plumbing.kafka import KafkaSettings, make_admin, make_consumer, make_producer
from plumbing.topics import ensure_topics, wait_for_topics
from producer.client import FairnessClient
from producer.service import AdmissionService, AdmissionSettings
from schemas.codec import codec_for, format_from_headers
from schemas.config import load_config
from schemas.messages import AdmittedRequest, DeadLetter, LaneState, Result, SchedulerState
from schemas.topics import Topics
from tests.admission_setup import registry, request_dict

pytestmark = pytest.mark.integration


def _write_config(path: Path, prefix: str, **orgs: str) -> Path:
    """The test registry under ``prefix``, with more orgs (name = tier), written to ``path``."""
    path.write_text(registry(prefix=prefix, orgs=orgs).text)
    return path


def _admission(kafka_settings: KafkaSettings, config_path: Path, **settings
               ) -> AdmissionService:
    """An admission service on ``config_path``: the fake token counter, a free metrics
    port, no config polling, and ``settings`` besides."""
    return AdmissionService(
        load_config(config_path), kafka_settings, registry=CollectorRegistry(),
        settings=AdmissionSettings(token_counter="fake", metrics_port=0, config_poll_ms=0,
                                   **settings),
        config_path=config_path,
    )


@pytest.fixture
def config_path(tmp_path: Path, topic_prefix: str) -> Path:
    return _write_config(tmp_path / "config.toml", topic_prefix)


@pytest.fixture
async def service(kafka_settings: KafkaSettings, config_path: Path
                  ) -> AsyncIterator[AdmissionService]:
    """A running admission service on this test's prefix, ready (ingress assigned)."""
    svc = _admission(kafka_settings, config_path)
    await svc.start()
    task = asyncio.create_task(svc.run())
    try:
        await _until(lambda: svc.readiness()[0], "the ingress partitions to be assigned")
        yield svc
    finally:
        svc.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)
        await svc.stop()


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    """Wait for a condition (never a fixed sleep standing in for it)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _produce(settings: KafkaSettings, topic: str, value: bytes, *, key: bytes | None = None,
                   headers: list | None = None) -> None:
    producer = make_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def from_start(settings: KafkaSettings, topic: str) -> AsyncIterator[tuple]:
    """A consumer with no group on every partition of ``topic``, at its start; and those
    partitions."""
    partitions = (await wait_for_topics(settings, {topic: 1}))[topic]
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        yield consumer, tps
    finally:
        await consumer.stop()


async def _read(settings: KafkaSettings, topic: str, n: int, timeout_s: float = 15.0) -> list:
    """The first ``n`` records of ``topic`` (all partitions), read with no group."""
    async with from_start(settings, topic) as (consumer, _):
        records: list = []
        async with asyncio.timeout(timeout_s):
            while len(records) < n:
                for batch in (await consumer.getmany(timeout_ms=100)).values():
                    records.extend(batch)
        return records


async def _send_burst(settings: KafkaSettings, topic: str, n: int) -> None:
    """``n`` records of org ``bulk`` (``bulk-0``...), then one of ``quiet`` (``quiet-0``),
    keyed by org, on one producer."""
    producer = make_producer(settings)
    await producer.start()
    try:
        sends = [await producer.send(topic, msgspec.json.encode(
            request_dict(id=f"bulk-{i}", org="bulk")), key=b"bulk") for i in range(n)]
        sends.append(await producer.send(topic, msgspec.json.encode(
            request_dict(id="quiet-0", org="quiet")), key=b"quiet"))
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


def _read_ahead(service: AdmissionService) -> float:
    """Records fetched and not yet decided, as the service's gauge shows them."""
    return service.registry.get_sample_value("sf_admission_read_ahead_records")


async def _until_committed(service: AdmissionService, n: int, timeout_s: float = 15.0) -> None:
    """Wait until the service's committed ingress offsets add up to ``n``."""
    done = 0
    try:
        async with asyncio.timeout(timeout_s):
            while (done := sum([(await service._consumer.committed(tp)) or 0
                                for tp in service._consumer.assignment()])) != n:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for the {n} ingress offsets to be "
                             f"committed: {done}") from None


def _decode_result(rec) -> Result:
    return codec_for(Result).decode(rec.value, format_from_headers(rec.headers))


# The README's example: exactly these bytes, as `kcat -P -k trial` sends them (no headers).
RAW = (b'{"id": "req-1", "org": "trial", "endpoint": "embed", '
       b'"input": {"type": "embed", "texts": ["hello world"]}}')


async def test_raw_json_is_admitted_to_its_tier_topic(service, kafka_settings, topic_prefix):
    """Plain JSON with no headers is admitted to requests.<tier> keyed by org, then committed."""
    topics = Topics(topic_prefix)
    await _produce(kafka_settings, topics.ingress, RAW, key=b"trial")
    [rec] = await _read(kafka_settings, topics.tier("free"), 1)
    assert rec.key == b"trial"
    assert dict(rec.headers)["content-type"] == b"application/msgpack"
    admitted = codec_for(AdmittedRequest).decode(rec.value)
    assert (admitted.id, admitted.tier, admitted.tokens) == ("req-1", "free", 2)
    assert admitted.reply_to == topics.results and admitted.reply_format == "json"
    # The ingress offset is committed once the admitted record was acknowledged.
    await _until(lambda: service.totals["admitted"] == 1, "the admission to be counted")
    tps = service._consumer.assignment()
    committed = {tp: await service._consumer.committed(tp) for tp in tps}
    assert sum(c or 0 for c in committed.values()) == 1


async def test_unknown_org_gets_invalid_result_on_its_reply_topic(service, kafka_settings,
                                                                  topic_prefix):
    """An unknown org is answered on its reply topic with invalid/unknown_org, in JSON."""
    topics = Topics(topic_prefix)
    reply = f"{topic_prefix}replies.client-1"
    await ensure_topics(kafka_settings, {reply: 1})  # as the client library does
    body = msgspec.json.encode({"id": "req-x", "org": "nobody", "endpoint": "embed",
                                "input": {"type": "embed", "texts": ["a"]}, "reply_to": reply})
    await _produce(kafka_settings, topics.ingress, body, key=b"nobody")
    [rec] = await _read(kafka_settings, reply, 1)
    assert rec.key == b"req-x"
    result = _decode_result(rec)
    assert (result.status, result.reason) == ("invalid", "unknown_org")
    assert "'nobody'" in result.message


async def test_garbage_is_dead_lettered_and_the_loop_goes_on(service, kafka_settings,
                                                             topic_prefix):
    """A garbage record goes to the dead letters; the next good record is still admitted."""
    topics = Topics(topic_prefix)
    await _produce(kafka_settings, topics.ingress, b"\x00\xffnot json", key=b"trial")
    await _produce(kafka_settings, topics.ingress, RAW, key=b"trial")
    [dead] = await _read(kafka_settings, topics.dead_letters, 1)
    letter = codec_for(DeadLetter).decode(dead.value)
    assert letter.payload == b"\x00\xffnot json" and letter.source_topic == topics.ingress
    assert letter.reason == "malformed"
    [ok] = await _read(kafka_settings, topics.tier("free"), 1)
    assert codec_for(AdmittedRequest).decode(ok.value).id == "req-1"


async def test_throttle_follows_scheduler_state(service, kafka_settings, topic_prefix):
    """A fresh snapshot with a deep backlog makes the service reject with throttled."""
    topics = Topics(topic_prefix)
    lane = LaneState(endpoint="embed", held_requests=10, held_cost_by_tier={},
                     held_tokens_by_tier={"enterprise": 100_000}, tokens_per_s=100.0,
                     free_slots=0, workers=1)
    state = SchedulerState(sent_ms=int(time.time() * 1000), lanes={"embed": lane},
                           held_requests=10)
    await _produce(kafka_settings, topics.scheduler_state,
                   codec_for(SchedulerState).encode(state),
                   headers=[("content-type", b"application/msgpack")])
    await _until(lambda: service.throttle.state is not None, "the snapshot to be read")
    await _produce(kafka_settings, topics.ingress, RAW, key=b"trial")
    [rec] = await _read(kafka_settings, topics.results, 1)
    result = _decode_result(rec)
    assert (result.status, result.reason) == ("rejected", "throttled")
    assert result.retry_after_ms > 0


async def test_metrics_and_health(service, kafka_settings, topic_prefix):
    """/readyz is 200 once assigned; /metrics counts admissions by endpoint and tier."""
    topics = Topics(topic_prefix)
    await _produce(kafka_settings, topics.ingress, RAW, key=b"trial")
    await _until(lambda: service.totals["admitted"] == 1, "the admission")

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(service.metrics_url + path, timeout=5) as r:
            return r.status, r.read().decode()

    status, _ = await asyncio.to_thread(get, "/readyz")
    assert status == 200
    _, text = await asyncio.to_thread(get, "/metrics")
    assert 'sf_admission_admitted_total{endpoint="embed",tier="free"} 1.0' in text
    assert "sf_admission_decision_seconds_count 1.0" in text


async def test_reload_applies_a_valid_file_and_refuses_an_invalid_one(
        service, kafka_settings, topic_prefix, config_path):
    """A reload adds a new org; a broken file is refused and the old configuration stays."""
    topics = Topics(topic_prefix)
    _write_config(config_path, topic_prefix, newco="standard")
    assert await service.reload()
    config_path.write_text("[[tiers]]\nname = 'x'\n[endpoints.e]\nkind = 'nope'\n")
    assert not await service.reload()
    assert "newco" in service.config.orgs
    body = RAW.replace(b'"trial"', b'"newco"')
    await _produce(kafka_settings, topics.ingress, body, key=b"newco")
    [rec] = await _read(kafka_settings, topics.tier("standard"), 1)
    assert codec_for(AdmittedRequest).decode(rec.value).org == "newco"


async def test_stop_finishes_and_commits(kafka_settings, topic_prefix, config_path):
    """After a stop request run() returns, and every decided record's offset is committed."""
    topics = Topics(topic_prefix)
    svc = AdmissionService(load_config(config_path), kafka_settings,
                           settings=AdmissionSettings(token_counter="fake", config_poll_ms=0))
    async with svc:
        task = asyncio.create_task(svc.run())
        for i in range(5):
            body = RAW.replace(b'"req-1"', f'"req-{i}"'.encode()).replace(b'"trial"', b'"acme"')
            await _produce(kafka_settings, topics.ingress, body, key=b"acme")
        await _until(lambda: svc.totals["admitted"] == 5, "five admissions")
        svc.request_stop()
        await asyncio.wait_for(task, 10)
    admin = make_admin(kafka_settings)
    await admin.start()
    try:
        n = load_config(config_path).service.ingress_partitions
        tps = [TopicPartition(topics.ingress, p) for p in range(n)]
        offsets = await admin.list_consumer_group_offsets(f"{topic_prefix}admission",
                                                          partitions=tps)
    finally:
        await admin.close()
    assert sum(max(0, meta.offset) for meta in offsets.values()) == 5


# -- the client library --------------------------------------------------------


async def test_client_round_trip_through_admission(service, kafka_settings, topic_prefix):
    """A client's request refused by admission comes back once, on the client's own reply topic."""
    async with FairnessClient(kafka_settings, service.config) as client:
        assert client.reply_topic.startswith(f"{topic_prefix}replies.")
        request_id = await client.submit({"org": "trial", "endpoint": "embed", "priority": 7,
                                          "input": {"type": "embed", "texts": ["a b"]}})
        result = await client.result(request_id, timeout=15)
    assert result.id == request_id
    assert (result.status, result.reason) == ("invalid", "priority_above_cap")
    assert "cap of 2" in result.message


async def test_client_delivers_each_result_once(kafka_settings, topic_prefix):
    """Redelivered results are dropped: results() yields each id once, in arrival order."""
    async with FairnessClient(kafka_settings, topic_prefix) as client:
        producer = make_producer(kafka_settings)
        await producer.start()
        try:
            for rid in ("a", "b", "a", "b", "c"):
                value = codec_for(Result).encode(Result(id=rid, status="ok"), "json")
                await producer.send_and_wait(client.reply_topic, value, key=rid.encode())
        finally:
            await producer.stop()
        got = []
        async with asyncio.timeout(15):
            async for result in client.results():
                got.append(result.id)
                if len(got) == 3:
                    break
        assert got == ["a", "b", "c"]
        await _until(lambda: client.duplicates == 2, "the copies to be dropped")
        with pytest.raises(TimeoutError, match="'a'"):
            await client.result("a", timeout=0.2)


async def test_submit_command_prints_the_result(service, kafka_settings, topic_prefix,
                                                config_path, capsys):
    """`serving-fairness submit` prints the result as JSON and exits 1 when it is not ok."""
    from app.cli import main

    argv = ["submit", "--config", str(config_path), "--org", "nobody", "--endpoint", "embed",
            "--text", "hello", "--bootstrap", kafka_settings.bootstrap, "--timeout-s", "15"]
    assert await asyncio.to_thread(main, argv) == 1
    out = capsys.readouterr().out.splitlines()
    # Service log lines share stdout in this process; the result is the indented JSON block.
    printed = json.loads("\n".join(out[out.index("{"):]))
    assert (printed["status"], printed["reason"]) == ("invalid", "unknown_org")


async def test_command_reloads_on_sighup_and_stops_on_sigterm(kafka_settings, topic_prefix,
                                                              config_path):
    """`serving-fairness admission`: SIGHUP reloads (a bad file is refused), SIGTERM exits 0."""
    import os
    import signal
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "admission", "--config", str(config_path),
        "--bootstrap", kafka_settings.bootstrap, "--kafka-session-timeout-ms", "2000",
        "--kafka-heartbeat-interval-ms", "500",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "SF_LOG_JSON": "1"},
    )

    async def event(name: str) -> dict:
        async with asyncio.timeout(30):
            while line := await proc.stderr.readline():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if entry.get("event") == name:
                        return entry
        raise AssertionError(f"the service exited before logging {name}")

    try:
        await event("admission_started")
        config_path.write_text("not = [valid")
        proc.send_signal(signal.SIGHUP)
        refused = await event("config_reload_refused")
        assert "not valid TOML" in refused["problems"][0]
        _write_config(config_path, topic_prefix, newco="standard")
        proc.send_signal(signal.SIGHUP)
        await event("config_reloaded")
        proc.send_signal(signal.SIGTERM)
        await event("admission_stopped")
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

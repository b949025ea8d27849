"""Each service as its own process: SIGTERM stops it cleanly, SIGHUP and file changes reload.

Every test starts ``python -m app.cli <service>`` against the session
broker with JSON logs to a file, sends it a little traffic, then SIGTERM,
and checks what an operator relies on: exit status 0, one totals line, and
the group's committed offsets (done work committed, held work not, so a
restart replays it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer, make_producer
from plumbing.ports import free_port
from scheduler.takeover import group_of
from schemas.build import Built, build_config
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, Batch, EmbedInput

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
_MSGPACK = [("content-type", b"application/msgpack")]


def config(prefix: str) -> Built:
    """Two tiers, acme in gold, one partition of everything: the services run as processes."""
    return build_config(prefix=prefix, heartbeat_ms=200, state_interval_ms=100, tier_partitions=1,
                        ingress_partitions=1, results_partitions=1,
                        endpoints={"embed": {"partitions": 1}}, orgs={"acme": "gold"})


class Service:
    """One service process with its JSON log file and /readyz port."""

    def __init__(self, tmp_path: Path, bootstrap: str, *args: str, log_level: str = "info"):
        self.port = free_port()
        self.log_path = tmp_path / f"{args[0]}-{uuid.uuid4().hex[:6]}.log"
        env = {**os.environ, "SF_LOG_JSON": "1", "SF_LOG_LEVEL": log_level,
               "SF_KAFKA_SESSION_TIMEOUT_MS": "2000", "SF_KAFKA_HEARTBEAT_INTERVAL_MS": "500"}
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", *args, "--bootstrap", bootstrap,
                 "--metrics-port", str(self.port)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def events(self, name: str | None = None) -> list[dict]:
        """The log's lines, each parsed as JSON (a line that is not JSON fails the test)."""
        lines = [json.loads(line) for line in self.log_path.read_text().splitlines() if line]
        return [e for e in lines if name is None or e["event"] == name]

    async def wait_event(self, name: str, count: int = 1, timeout_s: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.events(name)) < count:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.tail()}"
            assert time.monotonic() < deadline, f"no {count} x {name}: {self.tail()}"
            await asyncio.sleep(0.05)
        return found

    async def readyz(self) -> tuple[int, str]:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return 0, "not listening"
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = await reader.read()
        writer.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        return int(head.split()[1]), body.decode()

    async def wait_ready(self, timeout_s: float = 30.0, contains: str = "") -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            status, body = await self.readyz()
            if status == 200 and contains in body:
                return
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.tail()}"
            assert time.monotonic() < deadline, f"not ready: {body} {self.tail()}"
            await asyncio.sleep(0.05)

    async def terminate(self, timeout_s: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"still running {timeout_s} s after SIGTERM: {self.tail()}")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-15:])


@pytest.fixture
def config_file(tmp_path: Path, topic_prefix: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(config(topic_prefix).text)
    return path


@pytest.fixture
def services():
    started: list[Service] = []
    yield started
    for s in started:
        s.kill()


async def committed(kafka: KafkaSettings, group: str, tp: TopicPartition) -> int | None:
    """The group's committed offset of ``tp`` (None: nothing committed)."""
    consumer = make_consumer(kafka, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(tp)
    finally:
        await consumer.stop()


async def produce(kafka: KafkaSettings, topic: str, values: list[bytes], *, key: bytes,
                  headers=None) -> None:
    producer = make_producer(kafka)
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(topic, v, key=key, partition=0, headers=headers)
    finally:
        await producer.stop()


def admitted(prefix: str, i: int, *, expired: bool = False, words: int = 3) -> AdmittedRequest:
    now = int(time.time() * 1000)
    return AdmittedRequest(
        id=f"r{i}-{uuid.uuid4().hex[:6]}", org="acme", endpoint="embed", tier="gold",
        input=EmbedInput(texts=(" ".join(["word"] * words),)), tokens=words,
        deadline_at_ms=now - 1000 if expired else None, created_ms=now - 2000,
        admitted_ms=now - 2000, reply_to=f"{prefix}results", reply_format="msgpack")


async def test_admission_sigterm_commits_what_it_decided_and_logs_totals(
        kafka_settings, topic_prefix, config_file, tmp_path, services):
    """Admission on SIGTERM: exit 0, admission_stopped with the totals, ingress committed to the end."""
    svc = Service(tmp_path, kafka_settings.bootstrap, "admission", "--config", str(config_file),
                  "--token-counter", "fake", log_level="debug")
    services.append(svc)
    await svc.wait_ready()
    bodies = [json.dumps({"id": f"r{i}", "org": "acme", "endpoint": "embed",
                          "input": {"type": "embed", "texts": ["hi"]}}).encode() for i in range(5)]
    await produce(kafka_settings, f"{topic_prefix}requests", bodies, key=b"acme")
    events = await svc.wait_event("request_admitted", 5)
    assert sorted((e["request_id"], e["org"]) for e in events) == [(f"r{i}", "acme")
                                                                    for i in range(5)]
    assert await svc.terminate() == 0
    (stopped,) = svc.events("admission_stopped")
    assert stopped["totals"] == {"admitted": 5}
    tp = TopicPartition(f"{topic_prefix}requests", 0)
    assert await committed(kafka_settings, f"{topic_prefix}admission", tp) == 5


async def test_scheduler_sigterm_commits_done_requests_and_a_restart_replays_the_held(
        kafka_settings, topic_prefix, config_file, tmp_path, services):
    """Scheduler, no worker: two expired requests are answered and committed, three stay held;
    SIGHUP with a broken file is refused, a valid file change is applied, nothing held is lost;
    SIGTERM exits 0 handing the three back uncommitted; a restart holds the same three."""
    tier = TopicPartition(f"{topic_prefix}requests.gold", 0)
    codec = codec_for(AdmittedRequest)
    svc = Service(tmp_path, kafka_settings.bootstrap, "scheduler", "--config", str(config_file),
                  "--commit-interval-ms", "100")
    services.append(svc)
    await svc.wait_ready()
    # Each leadership commits to a group of its own (scheduler/takeover.py group_of).
    (acquired, *_) = svc.events("leadership_acquired")
    group = group_of(topic_prefix, acquired["epoch"])
    requests = [admitted(topic_prefix, i, expired=i < 2) for i in range(5)]
    await produce(kafka_settings, tier.topic, [codec.encode(r) for r in requests], key=b"acme",
                  headers=_MSGPACK)
    expired = await svc.wait_event("request_expired", 2)
    assert {(e["request_id"], e["org"]) for e in expired} == {(r.id, "acme") for r in requests[:2]}
    deadline = time.monotonic() + 10
    while await committed(kafka_settings, group, tier) != 2:
        assert time.monotonic() < deadline, "the expired requests' offsets were not committed"
        await asyncio.sleep(0.2)
    await svc.wait_ready(contains="3 held")

    valid = config_file.read_text()
    config_file.write_text(valid.replace('kind = "embed"', 'kind = "nope"'))
    svc.proc.send_signal(signal.SIGHUP)
    (refused, *_) = await svc.wait_event("config_reload_refused")
    assert refused["level"] == "error" and refused["problems"]
    await svc.wait_ready(contains="3 held")  # the old configuration still runs
    config_file.write_text(valid + '\n[orgs.newco]\ntier = "free"\n')
    await svc.wait_event("config_reloaded", timeout_s=15)  # by the file watch (2 s), no signal
    await svc.wait_ready(contains="3 held")

    assert await svc.terminate() == 0
    (stopped,) = svc.events("scheduler_stopped")
    assert (stopped["handed_back"], stopped["expired"], stopped["received"]) == (3, 2, 5)
    assert await committed(kafka_settings, group, tier) == 2

    again = Service(tmp_path, kafka_settings.bootstrap, "scheduler", "--config", str(config_file))
    services.append(again)
    await again.wait_ready(contains="3 held")
    assert await again.terminate() == 0
    (stopped,) = again.events("scheduler_stopped")
    assert (stopped["handed_back"], stopped["received"], stopped["expired"]) == (3, 3, 0)


async def test_worker_sigterm_finishes_the_batch_in_hand_then_commits_it(
        kafka_settings, topic_prefix, config_file, tmp_path, services):
    """A worker survives SIGHUP; stopped with a batch in hand it serves it to the end (both
    results written), commits it, says bye, exits 0 and logs worker_stopped with the totals."""
    svc = Service(tmp_path, kafka_settings.bootstrap, "worker", "--config", str(config_file),
                  "--endpoint", "embed", "--model", "fake:ms_per_token=4")
    services.append(svc)
    await svc.wait_ready(timeout_s=60)
    reqs = [admitted(topic_prefix, i, words=150) for i in range(2)]
    batch = Batch(id="b-sigterm", endpoint="embed", requests=reqs, tokens=300,
                  created_ms=int(time.time() * 1000))
    await produce(kafka_settings, f"{topic_prefix}batches.embed", [codec_for(Batch).encode(batch)],
                  key=b"b", headers=_MSGPACK)
    await svc.wait_ready(contains="1 batches in hand", timeout_s=10)
    svc.proc.send_signal(signal.SIGHUP)  # ignored, never the default action (exit)
    await svc.wait_event("reload_ignored")
    assert await svc.terminate() == 0
    events = [e["event"] for e in svc.events()]
    assert events.index("batch_served") < events.index("worker_stopped")
    (served,) = svc.events("batch_served")
    assert (served["batch_id"], served["ok"], served["committed"]) == ("b-sigterm", 2, True)
    (stopped,) = svc.events("worker_stopped")
    assert (stopped["batches"], stopped["results"]) == (1, {"ok": 2})
    tp = TopicPartition(f"{topic_prefix}batches.embed", 0)
    assert await committed(kafka_settings, f"{topic_prefix}worker.embed", tp) == 1

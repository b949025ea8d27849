"""Every gateway route under fuzzing: any body, any headers, never an unhandled error.

The gateway's own code runs whole (aiohttp, the key, the size, decoding,
each route's mapping and answer) over real HTTP on loopback; behind it a
stand-in for the pipeline's client answers each request at once with an
outcome the test draws (ok with vectors or scores shaped as asked, or
rejected, invalid, expired, failed). The properties:

* every request is answered (no hang: each has a bounded client timeout);
* never a 500 of the gateway's own (``internal_error``): a 500 comes only
  from a drawn ``failed`` outcome;
* a request without a valid key never reaches the pipeline, and gets 401;
* a body that reaches the pipeline went through its route's decoder: its
  org is the key's, never one the body or a header named.

Bodies are random JSON values, valid bodies with one field replaced by any
JSON value, and random bytes; headers are random values for the ones the
gateway reads.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import numpy as np
from hypothesis import event, given, note
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gateway.catalog import Catalog
from gateway.keys import hash_key, new_key
from gateway.metrics import GatewayMetrics
from gateway.server import GatewayServer
from gateway.service import routes
from schemas.build import build_config
from schemas.messages import EmbedInput, Request, Result
from tests.fuzz.hostile import fuzz_settings

KEY = new_key()
CONFIG = build_config(
    endpoints={"embed": {"model": "fake:dim=16", "prompts": {"search_query": ""}},
               "rerank": {"kind": "rerank", "model": "fake"}},
    orgs={"acme": {"tier": "gold", "api_keys": [hash_key(KEY)]}, "other": "gold"}).config
CATALOG = Catalog(CONFIG)
POSTS = {
    "/v1/embeddings": {"model": "embed", "input": ["a b", "c"], "encoding_format": "float",
                       "dimensions": 8, "user": "u"},
    "/v2/embed": {"model": "embed", "texts": ["a"], "input_type": "search_query",
                  "embedding_types": ["float", "int8", "ubinary", "base64"],
                  "truncate": "END", "priority": 3, "output_dimension": 8},
    "/v2/rerank": {"model": "rerank", "query": "q", "documents": ["a", "b"], "top_n": 1,
                   "priority": 999, "max_tokens_per_doc": 4},
    "/embed": {"inputs": ["a", "b"], "normalize": False, "truncate": True,
               "truncation_direction": "Left", "dimensions": 4, "prompt_name": "search_query"},
    "/rerank": {"query": "q", "texts": ["a", "b", "c"], "return_text": True, "raw_scores": True},
}
GETS = ["/v1/models", "/info", "/health", "/openapi.json"]
OUTCOMES = ["ok", "ok", "ok", "rejected", "invalid", "expired", "failed"]


class StandIn:
    """The pipeline's client, answering each request at once with the drawn outcome."""

    reply_topic = "sf.replies.gateway-fuzz"

    def __init__(self) -> None:
        self.outcome = "ok"
        self.sent: list[Request] = []

    async def submit(self, req: Request) -> str:
        self.sent.append(req)
        return req.id

    async def result(self, rid: str, timeout: float | None = None) -> Result:
        req = self.sent[-1]
        if self.outcome != "ok":
            return Result(id=rid, status=self.outcome, reason=f"fuzz_{self.outcome}",
                          message="drawn by the test - at `$.input.texts`",
                          retry_after_ms=1500 if self.outcome == "rejected" else None)
        inp = req.input
        if isinstance(inp, EmbedInput):
            n, dim = len(inp.texts), inp.dimensions or 16
            packed = {}
            for t in inp.embedding_types or ["float"]:
                width = (dim + 7) // 8 if t.endswith("binary") else dim
                dtype = {"float": "<f4", "int8": "i1", "binary": "i1"}.get(t, "u1")
                packed[t] = [np.ones(width, dtype=dtype).tobytes() for _ in range(n)]
            return Result(id=rid, status="ok", tokens=n, dimensions=dim,
                          embeddings_packed=packed)
        scores = [1.0 / (i + 1) for i in range(len(inp.documents))]
        ranking = list(range(len(scores)))[:inp.top_n or len(scores)]
        return Result(id=rid, status="ok", scores=scores, ranking=ranking, tokens=3)

    def abandon(self, rid: str) -> None:
        pass

    def fail_waiting(self, exc: BaseException) -> int:
        return 0


class Harness:
    """A gateway on loopback in a loop of its own, and a client session to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = StandIn()
        self.server = GatewayServer(
            routes(100), lambda: CATALOG, self.client, GatewayMetrics(CollectorRegistry()),
            max_body_bytes=64 * 1024, max_waiting=100, max_wait_ms=5_000, result_grace_ms=100)
        self.loop.run_until_complete(self.server.start("127.0.0.1", 0))
        self.http = self.loop.run_until_complete(self._session())

    async def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(self.server.url,
                                     timeout=aiohttp.ClientTimeout(total=10))

    def send(self, method: str, path: str, body: bytes | None,
             headers: dict[str, str]) -> tuple[int, bytes]:
        async def go():
            async with self.http.request(method, path, data=body, headers=headers) as r:
                return r.status, await r.read()
        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.http.close())
        self.loop.run_until_complete(self.server.stop())
        self.loop.close()


HARNESS: Harness | None = None


def harness() -> Harness:
    global HARNESS
    if HARNESS is None:
        HARNESS = Harness()
    return HARNESS


def teardown_module() -> None:
    if HARNESS is not None:
        HARNESS.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12)
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@st.composite
def bodies(draw, path: str) -> bytes:
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "json", "bytes"]))
    event(f"body: {kind}")
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    body: dict[str, Any] = dict(POSTS[path])
    if kind == "mutated":
        field = draw(st.sampled_from([*body, "org", "extra_field"]))
        if draw(st.booleans()) and field in body:
            del body[field]
        else:
            body[field] = draw(json_values)
    return json.dumps(body).encode()


@st.composite
def headers(draw) -> dict[str, str]:
    out = {}
    auth = draw(st.sampled_from(["key", "key", "key", "none", "garbage", "scheme"]))
    if auth == "key":
        out["Authorization"] = f"Bearer {KEY}"
    elif auth == "garbage":
        out["Authorization"] = draw(header_text)
    elif auth == "scheme":
        out["Authorization"] = f"{draw(st.sampled_from(['Basic', 'bearer', 'Token']))} {KEY}"
    for name in ("x-stainless-read-timeout", "X-Request-Timeout", "OpenAI-Organization",
                 "Content-Type"):
        if draw(st.booleans()):
            out[name] = draw(header_text | st.sampled_from(["0", "-1", "nan", "inf", "1e308",
                                                            "0.001", "acme", "other"]))
    return out


@given(path=st.sampled_from([*POSTS, *GETS]), data=st.data(), outcome=st.sampled_from(OUTCOMES))
@fuzz_settings(1000)
def test_every_route_answers_every_request_without_an_error_of_its_own(path, data, outcome):
    """Any body and headers: an answer, never internal_error, the org always the key's."""
    h = harness()
    h.client.outcome = outcome
    method = "POST" if path in POSTS else "GET"
    body = data.draw(bodies(path)) if method == "POST" else None
    hdrs = data.draw(headers())
    note(f"{method} {path} {hdrs} {body!r:.300}")
    before = len(h.client.sent)
    status, answer = h.send(method, path, body, hdrs)
    event(f"status {status}")
    assert b"internal_error" not in answer, answer
    assert status != 500 or outcome == "failed"
    # Schemes are case-insensitive (RFC 9110): "bearer KEY" proves the org too.
    valid_key = CATALOG.keys.org_of(hdrs.get("Authorization")) == "acme"
    reached = h.client.sent[before:]
    assert len(reached) <= 1
    if reached:
        assert valid_key and reached[0].org == "acme"
        assert status in {200, 400, 422, 429, 500, 504}
    if not valid_key and path not in ("/info", "/health", "/openapi.json"):
        assert status == 401, (status, answer)
    if status in (200, 400, 401, 403, 404, 413, 422, 429, 503, 504) and path != "/health":
        json.loads(answer)  # every answer of ours is JSON in the route's shape
    assert h.server.waiting == 0

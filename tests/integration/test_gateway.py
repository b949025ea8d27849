"""The gateway's own promises on the live pipeline with a fake model (named as such):
sizes, room, disconnects, deadlines and the drain.

The pipeline and the gateway run in this process (``app.stack.Stack``) on
the session broker; requests go over real HTTP (aiohttp's client). A slow
fake model (``fake:ms_per_batch=...``, one slot per worker) keeps requests
waiting where a test needs them to. Every wait is bounded and names what it
waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import pytest

from app.stack import Stack
from gateway.keys import hash_key, new_key
from plumbing.service_settings import GatewaySettings
from schemas.build import build_config

pytestmark = pytest.mark.integration

KEY = new_key()
OTHER = new_key()


def _config(prefix: str, **service):
    return build_config(
        prefix=prefix, heartbeat_ms=200, state_interval_ms=100, tier_partitions=1, **service,
        endpoints={"embed": {"partitions": 1, "max_batch_size": 1}},
        orgs={"acme": {"tier": "gold", "api_keys": [hash_key(KEY)]},
              "other": {"tier": "gold", "api_keys": [hash_key(OTHER)]}}).config


@contextlib.asynccontextmanager
async def gateway(kafka_settings, topic_prefix, *, model="fake", service=None, **settings):
    """A stack with a gateway of ``settings`` (a free port), and an HTTP session to it."""
    gw = GatewaySettings(port=0, **settings)
    async with Stack(_config(topic_prefix, **(service or {})), kafka_settings, model=model,
                     worker_slots=1,
                     gateway=gw) as stack, aiohttp.ClientSession(stack.gateway.url) as http:
        yield stack, http


def _embed(text: str = "hello world") -> dict:
    return {"model": "embed", "input": text}


def _auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def until(cond, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.02)


async def test_body_too_large_is_413_unread(kafka_settings, topic_prefix):
    """Over max_body_bytes: 413 in the route's shape, by Content-Length or while streaming."""
    async with gateway(kafka_settings, topic_prefix, max_body_bytes=4096) as (stack, http):
        big = {"model": "embed", "input": "x " * 5000}
        async with http.post("/v1/embeddings", json=big, headers=_auth()) as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == "body_too_large"

        async def chunks():
            for _ in range(10):
                yield b" " * 1024
        async with http.post("/embed", data=chunks(), headers=_auth()) as r:
            assert r.status == 413
            assert (await r.json())["error_type"] == "validation"
        async with http.post("/v1/embeddings", json=_embed(), headers=_auth()) as r:
            assert r.status == 200
        assert stack.admission.totals["admitted"] == 1


async def _post(http, key: str = KEY) -> tuple[int, dict, dict]:
    async with http.post("/v1/embeddings", json=_embed(), headers=_auth(key)) as r:
        return r.status, dict(r.headers), await r.json()


async def test_full_gateway_refuses_at_once_with_503(kafka_settings, topic_prefix):
    """With max_waiting_requests waiting, one more gets 503 and Retry-After; the others are served."""
    async with gateway(kafka_settings, topic_prefix, model="fake:ms_per_batch=600",
                       max_waiting_requests=2) as (stack, http):
        # One of each org: each within its share (half), the gateway full.
        first = [asyncio.ensure_future(_post(http, key)) for key in (KEY, OTHER)]
        await until(lambda: stack.gateway.server.waiting == 2, "two requests waiting")
        status, headers, body = await _post(http)
        assert status == 503 and body["error"]["code"] == "gateway_full"
        assert headers["Retry-After"] == "1"
        assert [s for s, _h, _b in await asyncio.gather(*first)] == [200, 200]
        assert stack.gateway.server.waiting == 0


async def test_one_org_past_its_share_gets_429_and_the_others_still_get_in(
        kafka_settings, topic_prefix):
    """An org with its share of the room waiting (half of 4) gets 429 with Retry-After for
    its next request, counted; another org's request is taken and served meanwhile."""
    async with gateway(kafka_settings, topic_prefix, model="fake:ms_per_batch=300",
                       max_waiting_requests=4) as (stack, http):
        server = stack.gateway.server
        bulk = [asyncio.ensure_future(_post(http)) for _ in range(2)]
        await until(lambda: server.waiting_by_org.get("acme") == 2, "acme's two waiting")
        status, headers, body = await _post(http)
        assert (status, body["error"]["code"], headers["Retry-After"]) == (
            429, "org_waiting_limit", "1")
        assert server.metrics.refused_org_full._value.get() == 1
        other = asyncio.ensure_future(_post(http, OTHER))
        await until(lambda: server.waiting_by_org.get("other") == 1, "the other org's waiting")
        assert (await other)[0] == 200
        assert [s for s, _h, _b in await asyncio.gather(*bulk)] == [200, 200]
        assert server.waiting == 0 and server.waiting_by_org == {}
        assert (await _post(http))[0] == 200  # its room back once its requests were answered


async def test_disconnect_ends_the_wait_and_drops_the_result(kafka_settings, topic_prefix):
    """A client that goes away frees its place; its result, when it comes, is dropped, not kept."""
    async with gateway(kafka_settings, topic_prefix,
                       model="fake:ms_per_batch=800") as (stack, http):
        server, client = stack.gateway.server, stack.gateway.client
        task = asyncio.ensure_future(http.post("/v1/embeddings", json=_embed(), headers=_auth()))
        # Sent, and its result awaited (a cancel during the send is the client's own case).
        await until(lambda: len(client._waiters) == 1, "the request sent, its result awaited")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await until(lambda: server.waiting == 0, "the wait ended by the disconnect")
        await until(lambda: client.unclaimed == 1, "the abandoned request's result dropped")
        assert client.waiting == 0 and not client._waiters and not client._ready
        async with http.post("/v1/embeddings", json=_embed(), headers=_auth()) as r:
            assert r.status == 200


async def test_client_timeout_becomes_the_deadline(kafka_settings, topic_prefix):
    """A request whose SDK timeout passes while the worker is busy is expired, not served: 504."""
    # One batch at a time (slots, one slot): the second request waits at the scheduler.
    async with gateway(kafka_settings, topic_prefix, model="fake:ms_per_batch=1500",
                       service={"flow_control": "slots"}) as (stack, http):
        busy = asyncio.ensure_future(http.post("/v1/embeddings", json=_embed("first"),
                                               headers=_auth()))
        await until(lambda: stack.scheduler.totals["dispatched"] >= 1, "the first dispatched")
        headers = {**_auth(), "x-stainless-read-timeout": "0.3"}
        async with http.post("/v1/embeddings", json=_embed("second"), headers=headers) as r:
            body = await r.json()
            assert r.status == 504, body
        (await busy).release()
        assert stack.scheduler.totals["dispatched"] == 1
        assert stack.scheduler.totals["expired"] == 1


async def test_stop_drains_waiting_requests(kafka_settings, topic_prefix):
    """A stop answers what waits (200), refuses what comes meanwhile (503), drops nothing."""
    async with gateway(kafka_settings, topic_prefix,
                       model="fake:ms_per_batch=700") as (stack, http):
        server = stack.gateway.server
        waiting = asyncio.ensure_future(http.post("/v1/embeddings", json=_embed(),
                                                  headers=_auth()))
        await until(lambda: server.waiting == 1, "a request waiting")
        stack.gateway.request_stop()
        await until(lambda: server.draining, "the drain begun")
        async with http.post("/v1/embeddings", json=_embed(), headers=_auth()) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "shutting_down"
        r = await waiting
        assert r.status == 200 and len((await r.json())["data"]) == 1


async def test_drain_cut_answers_503(kafka_settings, topic_prefix):
    """Requests still waiting when the drain time ends get 503, none is left unanswered."""
    async with gateway(kafka_settings, topic_prefix, model="fake:ms_per_batch=3000",
                       drain_s=0.2) as (stack, http):
        server = stack.gateway.server
        waits = [asyncio.ensure_future(http.post("/v1/embeddings", json=_embed(str(i)),
                                                 headers=_auth())) for i in range(2)]
        await until(lambda: server.waiting == 2, "two requests waiting")
        await stack.gateway.stop()
        statuses = []
        for w in waits:
            r = await w
            statuses.append(r.status)
            if r.status == 503:
                assert (await r.json())["error"]["code"] == "shutting_down"
        assert 503 in statuses and server.waiting == 0


async def test_org_comes_from_the_key(kafka_settings, topic_prefix):
    """The pipeline sees the key's org; a body or header naming another org is 403."""
    async with gateway(kafka_settings, topic_prefix) as (stack, http):
        async with http.post("/v1/embeddings", json=_embed(), headers=_auth(OTHER)) as r:
            assert r.status == 200
        async with http.post("/v1/embeddings", json={**_embed(), "org": "acme"},
                             headers=_auth(OTHER)) as r:
            assert r.status == 403
        async with http.post("/v2/embed", json={"model": "embed", "texts": ["x"],
                                                "input_type": "search_query"},
                             headers={**_auth(OTHER), "OpenAI-Organization": "acme"}) as r:
            assert r.status == 403
        assert stack.admission.totals["admitted"] == 1
        assert stack.gateway.client.duplicates == 0

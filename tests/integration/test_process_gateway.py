"""The processes stack with ``gateway_port``: the gateway runs beside the pipeline and stops first."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from app.processes import ProcessStack
from gateway.keys import hash_key, new_key
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import EMBEDDED_SESSION_ENV
from schemas.build import build_config

pytestmark = pytest.mark.integration


async def test_the_gateway_serves_a_key_and_drains_before_the_pipeline_stops(
        broker: EmbeddedBroker, topic_prefix: str, tmp_path: Path):
    """An org's key is served through the gateway process (200, its request id), a wrong
    key gets 401, and a stop while two requests wait answers both (the gateway drains while
    the worker still serves the second) and stops the gateway before the worker."""
    key = new_key()  # this test's throwaway key, never written anywhere
    # One batch at a time of one request, 1.5 s each: at the stop, the second
    # request still waits in the scheduler.
    built = build_config(prefix=topic_prefix, tier_partitions=1, ingress_partitions=1,
                         results_partitions=1, worker_slots=1,
                         endpoints={"embed": {"partitions": 1, "max_batch_size": 1,
                                              "model": "fake:ms_per_batch=1500"}},
                         orgs={"acme": {"tier": "gold", "api_keys": [hash_key(key)]}})
    config_path = tmp_path / "config.toml"
    config_path.write_text(built.text)
    log_path = tmp_path / "services.log"
    body = {"model": "embed", "input": ["hello"]}
    with log_path.open("a") as log:
        stack = ProcessStack(config_path, broker.bootstrap, endpoints=["embed"], log=log,
                             env=EMBEDDED_SESSION_ENV, gateway_port=0,
                             extra_args={"gateway": ["--drain-s", "20"]})
        async with stack, aiohttp.ClientSession(base_url=stack.gateway_url) as http:
            assert "gateway" in stack.procs
            async with http.post("/v1/embeddings", json=body,
                                 headers={"Authorization": f"Bearer {key}"}) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
                assert resp.headers["x-request-id"]
            assert answer["object"] == "list" and len(answer["data"]) == 1
            async with http.post("/v1/embeddings", json=body,
                                 headers={"Authorization": f"Bearer {new_key()}"}) as resp:
                assert resp.status == 401

            async def post() -> int:
                async with http.post("/v1/embeddings", json=body,
                                     headers={"Authorization": f"Bearer {key}"}) as resp:
                    return resp.status

            waiting = [asyncio.create_task(post()) for _ in range(2)]
            await asyncio.sleep(0.5)
            await stack.stop(grace_s=30)
            assert await asyncio.gather(*waiting) == [200, 200]
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    order = [e["event"] for e in events if e["event"] in ("gateway_stopped", "worker_stopped")]
    assert order == ["gateway_stopped", "worker_stopped"], order
    assert key not in log_path.read_text()

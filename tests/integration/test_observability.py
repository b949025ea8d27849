"""Observability of a live pipeline: /metrics under load, /readyz against a lost broker, JSON logs.

One in-process :class:`~app.stack.Stack` (admission, scheduler, one
fake-model worker, each with its own ``/metrics`` on a free port) serves a
small mixed load while the structlog stream is captured; the metric and
log tests read that one run. The readiness test runs a second stack on a
broker of its own, which it stops and starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from app.stack import Stack
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from plumbing.logs import configure_logging
from plumbing.topics import delete_topics, describe_topics
from producer.client import FairnessClient
from schemas.build import build_config
from schemas.config import Config

pytestmark = pytest.mark.integration

#: Orgs and what they send in the load: acme and bulk are allowlisted for the
#: org label, zed is not (it must count as "other"), nobody is unknown.
LOAD = {"acme": 8, "bulk": 20, "zed": 4}


def make_config(prefix: str) -> Config:
    """Two tiers, one partition of everything; zed's metrics are counted as "other"."""
    return build_config(
        prefix=prefix, heartbeat_ms=200, state_interval_ms=100, tier_partitions=1,
        ingress_partitions=1, results_partitions=1, metrics_org_allowlist=["acme", "bulk"],
        endpoints={"embed": {"quantum": 64, "max_batch_tokens": 64, "max_batch_size": 4,
                             "max_request_tokens": 64, "partitions": 1}},
        orgs={"acme": "gold", "bulk": "free", "zed": "free"}).config


def _kafka(bootstrap: str) -> KafkaSettings:
    return KafkaSettings(bootstrap=bootstrap, client_id="sf-tests", session_timeout_ms=2000,
                         heartbeat_interval_ms=500)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


Samples = dict[tuple[str, frozenset], float]


def scrape(url: str) -> Samples:
    """Every sample of a /metrics page, keyed by (name, labels)."""
    status, text = _get(url + "/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(samples: Samples, name: str, **labels) -> float | None:
    """Sum of the samples of ``name`` whose labels include ``labels`` (None: no such sample)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


async def _until(condition: Callable[[], Awaitable[bool]], what: str,
                 timeout_s: float = 20.0) -> None:
    """Wait for an async condition; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def ascrape(url: str) -> Samples:
    """:func:`scrape` off the event loop, which serves the /metrics being read."""
    return await asyncio.to_thread(scrape, url)


class Run:
    """What one loaded run left behind: each service's last scrape, the log lines, the ids."""

    admission: Samples
    scheduler: Samples
    worker: Samples
    sent: dict[str, str]  # request id -> org
    rejected_id: str
    lines: list[str]


@pytest.fixture(scope="module")
async def run(broker: EmbeddedBroker) -> Run:
    """Serve the load on a Stack with metrics on free ports and the logs captured as JSON."""
    stream = io.StringIO()
    configure_logging("debug", json=True, stream=stream)
    kafka = _kafka(broker.bootstrap)
    prefix = f"t{uuid.uuid4().hex[:8]}."
    config = make_config(prefix)
    out = Run()
    try:
        async with Stack(config, kafka, model="fake", metrics_port=0) as stack, \
                FairnessClient(kafka, config) as client:
            out.sent = {}
            for org, n in LOAD.items():
                for i in range(n):
                    rid = await client.submit({"org": org, "endpoint": "embed", "input": {
                        "type": "embed", "texts": [f"{org} text number {i} for the worker"]}})
                    out.sent[rid] = org
            out.rejected_id = await client.submit({"org": "nobody", "endpoint": "embed",
                                                   "input": {"type": "embed", "texts": ["x"]}})
            results = await asyncio.gather(*(client.result(r, timeout=60) for r in out.sent))
            assert {r.status for r in results} == {"ok"}
            assert (await client.result(out.rejected_id, timeout=30)).status == "invalid"
            urls = {name: s._telemetry.url for name, s in (
                ("admission", stack.admission), ("scheduler", stack.scheduler),
                ("worker", stack.workers[0]))}
            n = len(out.sent)
            # Results are counted once the broker acknowledged them, which can
            # come a moment after the client read them.
            async def worker_done() -> bool:
                return total(await ascrape(urls["worker"]), "sf_worker_results_total",
                             status="ok") == n

            async def admission_done() -> bool:
                return total(await ascrape(urls["admission"]), "sf_admission_results_total") == 1

            # The scheduler's tier lag is published by its commit loop (every 500 ms,
            # after a commit): once, at least, before the scrape is read.
            async def scheduler_lag_published() -> bool:
                return total(await ascrape(urls["scheduler"]),
                             "sf_scheduler_consumer_lag_records", tier="gold") is not None

            await _until(worker_done, "the worker's ok results")
            await _until(admission_done, "admission's result")
            await _until(scheduler_lag_published, "the scheduler's tier lag gauge")
            for name, url in urls.items():
                setattr(out, name, await ascrape(url))
        out.lines = stream.getvalue().splitlines()
        return out
    finally:
        configure_logging("info", json=False, stream=io.StringIO())
        structlog.reset_defaults()
        with contextlib.suppress(Exception):
            await delete_topics(kafka, await describe_topics(kafka, prefix))


async def test_admission_metrics_count_the_load(run: Run):
    """Admission counts every admitted request per tier, its one result by status, lag and broker up."""
    a = run.admission
    assert total(a, "sf_admission_admitted_total", tier="gold") == LOAD["acme"]
    assert total(a, "sf_admission_admitted_total", tier="free") == LOAD["bulk"] + LOAD["zed"]
    assert total(a, "sf_admission_results_total", status="invalid") == 1
    assert total(a, "sf_admission_rejected_total", reason="unknown_org") == 1
    assert total(a, "sf_admission_decision_seconds_count") == len(run.sent) + 1
    assert total(a, "sf_admission_consumer_lag_records") == 0
    assert total(a, "sf_admission_broker_reachable") == 1


async def test_scheduler_metrics_show_served_share_per_allowlisted_org(run: Run):
    """Dispatched requests and cost carry the org only when allowlisted ('other' else); batches,
    fill, DRR rounds, queue wait per tier, held gauges, lag gauges and broker up are exposed."""
    s = run.scheduler
    dispatched = "sf_scheduler_dispatched_requests_total"
    assert total(s, dispatched, org="acme", tier="gold") == LOAD["acme"]
    assert total(s, dispatched, org="bulk", tier="free") == LOAD["bulk"]
    assert total(s, dispatched, org="other", tier="free") == LOAD["zed"]
    assert total(s, dispatched, org="zed") is None
    cost = "sf_scheduler_dispatched_cost_total"
    assert total(s, cost, org="bulk") > total(s, cost, org="acme") > 0  # cost model: tokens
    assert total(s, "sf_scheduler_batches_emitted_total") >= len(run.sent) / 4
    assert total(s, "sf_scheduler_batch_fill_ratio_count") == total(
        s, "sf_scheduler_batches_emitted_total")
    assert total(s, "sf_scheduler_drr_rounds_total") > 0
    assert total(s, "sf_scheduler_queue_wait_seconds_count", tier="gold") == LOAD["acme"]
    for gauge in ("sf_scheduler_held_requests", "sf_scheduler_held_tokens",
                  "sf_scheduler_held_cost"):
        assert total(s, gauge, tier="free") is not None, gauge
    assert total(s, "sf_scheduler_consumer_lag_records", tier="gold") is not None
    assert total(s, "sf_scheduler_worker_events_lag_records") is not None
    assert total(s, "sf_scheduler_free_worker_slots", endpoint="embed") is not None
    assert total(s, "sf_scheduler_broker_reachable") == 1


async def test_worker_metrics_count_results_inference_and_latency_per_tier(run: Run):
    """The worker counts ok results, times model calls and each tier's end-to-end latency, and lag."""
    w = run.worker
    n = len(run.sent)
    assert total(w, "sf_worker_results_total", status="ok") == n
    assert total(w, "sf_worker_inference_seconds_count") > 0
    assert total(w, "sf_worker_batches_total") == total(run.scheduler,
                                                        "sf_scheduler_batches_emitted_total")
    latency = "sf_worker_request_latency_seconds_count"
    assert total(w, latency, tier="gold") == LOAD["acme"]
    assert total(w, latency, tier="free") == LOAD["bulk"] + LOAD["zed"]
    assert total(w, "sf_worker_request_latency_seconds_sum") > 0
    assert total(w, "sf_worker_consumer_lag_records", endpoint="embed") is not None
    assert total(w, "sf_worker_broker_reachable") == 1


async def test_logs_are_json_lines_with_ids_bound(run: Run):
    """Every captured line is JSON; each request's admitted and served events carry its
    request_id and org (served: its batch_id too); batches log their batch_id; every
    service logs its totals on stop."""
    events = [json.loads(line) for line in run.lines]  # raises on a non-JSON line
    by = {}
    for e in events:
        by.setdefault(e["event"], []).append(e)
    admitted = {e["request_id"]: e["org"] for e in by["request_admitted"]}
    assert admitted == run.sent
    served = {e["request_id"]: e for e in by["request_served"]}
    assert set(served) == set(run.sent)
    assert all(e["org"] == run.sent[r] and e["batch_id"] and e["logger"] == "worker"
               for r, e in served.items())
    emitted = {e["batch_id"] for e in by["batch_emitted"]}
    assert {e["batch_id"] for e in served.values()} <= emitted
    assert emitted == {e["batch_id"] for e in by["batch_served"]}
    rejected = by["request_rejected"]
    assert [(e["request_id"], e["org"], e["reason"]) for e in rejected] == [
        (run.rejected_id, "nobody", "unknown_org")]
    stopped = {e["event"]: e for e in events if e["event"].endswith("_stopped")}
    assert stopped["admission_stopped"]["totals"]["admitted"] == len(run.sent)
    assert stopped["scheduler_stopped"]["dispatched"] == len(run.sent)
    assert stopped["scheduler_stopped"]["held"] == 0
    assert stopped["worker_stopped"]["results"] == {"ok": len(run.sent)}
    # Ids are bound per outcome, never left behind on unrelated lines.
    assert not any("request_id" in e for e in by["scheduler_stopped"] + by["worker_stopped"])


async def test_readyz_turns_503_when_the_broker_stops_and_200_when_it_is_back():
    """On a broker of its own: every service's /readyz is 200, turns 503 naming the broker once
    the broker stops, and 200 again after it restarts; /healthz stays 200 throughout."""
    async with EmbeddedBroker() as own:
        kafka = _kafka(own.bootstrap)
        config = make_config(f"t{uuid.uuid4().hex[:8]}.")
        async with Stack(config, kafka, model="fake", metrics_port=0) as stack:
            urls = [s._telemetry.url for s in stack.services]

            async def statuses(path: str) -> list[tuple[int, str]]:
                return await asyncio.gather(*(asyncio.to_thread(_get, u + path) for u in urls))

            async def all_ready(code: int) -> bool:
                return all(c == code for c, _ in await statuses("/readyz"))

            assert [s for s, _ in await statuses("/readyz")] == [200] * len(urls)
            await own.astop(grace_s=0)
            await _until(lambda: all_ready(503), "every /readyz to turn 503", timeout_s=30)
            ready = await statuses("/readyz")
            assert all("broker unreachable" in body for _, body in ready), ready
            assert [s for s, _ in await statuses("/healthz")] == [200] * len(urls)
            await own.astart()
            await _until(lambda: all_ready(200), "every /readyz to be 200 again", timeout_s=60)
            assert [s for s, _ in await statuses("/healthz")] == [200] * len(urls)

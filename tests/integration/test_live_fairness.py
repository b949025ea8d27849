"""Live fairness: a burst on the real broker does not become the quiet orgs' latency.

The whole pipeline (admission, scheduler, one worker) runs on the embedded
broker with the fake model at a fixed service time per batch. One org sends
a burst of 2,400 requests at once; three quiet orgs of the same tier send a
few requests each while it is being served. Asserted as ratios, never as
milliseconds: every quiet org's p99 is below the bursting org's p50 over 5
(FIFO gives each quiet org about the burst's own latency), and every
request has its result.
"""

from __future__ import annotations

import pytest

from app.stack import Stack
from schemas.build import build_config
from schemas.config import Config
from schemas.messages import EmbedInput, Request
from traffic.replay import ReplaySettings, replay
from traffic.replay_sources import ReplayItem

pytestmark = pytest.mark.integration

BURST, QUIET, PER_QUIET = "bulk", ("q1", "q2", "q3"), 8
# 2,400 requests: ~9 s of model time, so the burst's p50 (~5 s) over 5 leaves
# the quiet orgs (~0.12 s at p99 here) a margin of several hundred ms for a
# stall of the test process itself. With 1,200 the bound was ~0.55 s, and one
# CI run on a busy machine failed at 0.62 s after a 340 ms stall of the model
# thread (its batch took 369 ms where 30 ms were asked for).
BURST_SIZE = 2400


def _config(prefix: str) -> Config:
    """One tier, small batches and a latency target no burst reaches: the scheduler decides."""
    return build_config(
        prefix=prefix, worker_slots=4, heartbeat_ms=200, state_interval_ms=100, tier_partitions=2,
        ingress_partitions=4, tiers=["standard"],
        endpoints={"embed": {"quantum": 64, "max_batch_tokens": 64, "max_batch_size": 8,
                             "max_request_tokens": 64, "latency_target_ms": 600000}},
        orgs=dict.fromkeys([BURST, *QUIET], "standard")).config


def _items() -> list[ReplayItem]:
    """The burst at 0, then each quiet org every 0.4 s while it is served."""
    def item(rid: str, org: str, ts: float) -> ReplayItem:
        return ReplayItem(ts=ts, tokens=8, request=Request(
            id=rid, org=org, endpoint="embed",
            input=EmbedInput(texts=(" ".join(f"w{rid}x{k}" for k in range(8)),))))
    out = [item(f"b{i}", BURST, 0.0) for i in range(BURST_SIZE)]
    out += [item(f"{org}-{i}", org, 0.2 + 0.4 * i) for org in QUIET for i in range(PER_QUIET)]
    return sorted(out, key=lambda it: it.ts)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, round(q / 100 * len(xs) + 0.5) - 1))]


async def _run(kafka_settings, prefix: str, policy: str):
    config = _config(prefix)
    # 30 ms a batch of 8: the burst takes ~9 s of model time.
    async with Stack(config, kafka_settings, model="fake:ms_per_batch=30", policy=policy,
                     endpoints=["embed"]):
        run = await replay(kafka_settings, config, _items(),
                           ReplaySettings(timeout_s=90, progress=False, samples=False))
    latency: dict[str, list[float]] = {}
    for o in run.outcomes:
        if o.status == "ok":
            latency.setdefault(o.org, []).append(o.completed_s - o.arrival_s)
    return run, latency


async def test_quiet_orgs_p99_is_a_fifth_of_the_bursts_p50_and_nothing_is_missing(
        kafka_settings, topic_prefix):
    """DRR live: each quiet org's p99 < the bursting org's p50 / 5; every request answered."""
    run, latency = await _run(kafka_settings, topic_prefix, "drr")
    statuses = {o.status for o in run.outcomes}
    assert statuses == {"ok"}, f"not every request came back ok: {statuses}"
    # Counted by id: each request sent has its own result, none came twice or for another.
    sent = [it.request.id for it in _items()]
    assert sorted(o.id for o in run.outcomes) == sorted(sent)
    assert all(got is not None and got[0].id == wire
               for wire, got in zip(run.wire_ids, run.results, strict=True))
    counts = {k: run.stats[k] for k in ("duplicate_results", "delivered_twice",
                                        "foreign_results", "send_failed", "missing")}
    assert counts == dict.fromkeys(counts, 0), counts
    burst_p50 = _pct(latency[BURST], 50)
    for org in QUIET:
        assert len(latency[org]) == PER_QUIET
        quiet_p99 = _pct(latency[org], 99)
        assert quiet_p99 < burst_p50 / 5, (
            f"{org}: p99 {quiet_p99:.3f} s is not below the burst's p50 {burst_p50:.3f} s / 5")

"""Adaptive cost through the running services: the worker's timings reach the scheduler's
cost model and change what an org's requests cost.

The rerank endpoint uses the adaptive cost model. The fake model pays a fixed 20 ms per
call, so an org of tiny requests (2 tokens) costs about a hundred times more per token than
an org of long ones (~200 tokens); no timing threshold is checked, only which way the
measured costs point, as ratios.
"""

from __future__ import annotations

import pytest

from scheduler.service import SchedulerService
from schemas.messages import SchedulerState
from schemas.topics import Topics
from tests.integration.pipeline_setup import (
    Reader,
    fake_worker,
    make_config,
    produce,
    rerank_request,
    running,
    until,
)

pytestmark = pytest.mark.integration

RERANK = {"cost_model": "adaptive", "quantum": 2048, "max_request_tokens": 512}
LONG = " ".join(["word"] * 50)


async def test_worker_timings_change_an_orgs_cost(kafka_settings, topic_prefix):
    """After batches of both orgs are served, the org of short requests costs more than its
    tokens and the org of long ones less; the scheduler's snapshot charges a held short
    request by that measured cost."""
    cfg = make_config(topic_prefix, rerank=RERANK, orgs={"longdocs": "gold"})
    topics = Topics.of(cfg)
    sched = SchedulerService(cfg, kafka_settings)
    lane = sched.core.lanes["rerank"]
    short = [rerank_request(i, "acme", "q", ["a"], tier="gold", topics=topics) for i in range(6)]
    long = [rerank_request(i, "longdocs", "q", [LONG] * 4, tier="gold", topics=topics)
            for i in range(6)]
    reqs = [r for pair in zip(short, long, strict=True) for r in pair]
    assert lane.cost.ratio("acme") == lane.cost.ratio("longdocs") == 1.0  # nothing measured
    async with running(sched), \
            Reader(kafka_settings, topics.results, cfg.service.results_partitions) as results:
        worker = fake_worker(cfg, kafka_settings, "w-r", endpoint="rerank",
                             model="fake:ms_per_batch=20,ms_per_token=0.01")
        async with running(worker):
            await produce(kafka_settings, lambda r: topics.tier(r.tier), reqs)
            got = await results.until(lambda items: len(items) >= len(reqs), "every result")
            assert {r.status for r in got} == {"ok"}
            await until(lambda: sched.core.held == 0
                        and not any(w.outstanding for w in sched.flow.workers.values()),
                        "every batch_done (with its timings) to reach the scheduler")
        acme, longdocs = lane.cost.ratio("acme"), lane.cost.ratio("longdocs")
        assert acme > 1 > longdocs, (acme, longdocs)
        assert acme >= 4 * longdocs, (acme, longdocs)

        # No worker now: one more short request is held, and the published backlog charges
        # it at the measured cost, not at its tokens.
        extra = rerank_request(99, "acme", "q", ["a"], tier="gold", topics=topics)
        await until(lambda: sched.core.held == 0, "the lane to be empty")
        async with Reader(kafka_settings, topics.scheduler_state, 1, SchedulerState) as states:
            # Past every snapshot so far (the reader starts at the topic's beginning): any
            # later one that holds a request holds the new one, as nothing else is held.
            seen = len(await states.settle(quiet_s=0))
            await produce(kafka_settings, lambda r: topics.tier(r.tier), [extra])
            snaps = await states.until(
                lambda items: any(s.held_requests == 1 for s in items[seen:]),
                "a snapshot holding the new request")
        lane_state = next(s for s in snaps[seen:] if s.held_requests == 1).lanes["rerank"]
        assert lane_state.held_tokens_by_tier["gold"] == extra.tokens
        assert lane_state.held_cost_by_tier["gold"] == pytest.approx(extra.tokens * acme)
        assert lane_state.held_cost_by_tier["gold"] > extra.tokens

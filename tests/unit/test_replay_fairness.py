"""The replay's sampler of the scheduler's live fairness gauges keeps the extremes."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from scheduler.fairness_metrics import FairnessMetrics
from traffic.replay_fairness import FairnessSampler


def test_the_sampler_keeps_the_largest_gap_and_wait_and_the_lowest_jain():
    """Gap over bound, longest wait and Jain (with two orgs or more) at their worst over samples."""
    registry = CollectorRegistry()
    m = FairnessMetrics(registry)
    pages = []
    for gap, wait, jain, orgs in ((100, 1.0, 0.9, 2), (700, 3.0, 0.5, 0), (50, 0.5, 0.7, 3)):
        m.gap.labels("embed", "standard").set(gap)
        m.bound.labels("embed", "standard").set(600)
        m.longest_wait.labels("embed", "standard").set(wait)
        m.jain.labels("embed", "standard").set(jain)
        m.jain_orgs.labels("embed", "standard").set(orgs)
        m.org_share.labels("embed", "standard", "bulk").set(0.9)
        pages.append(generate_latest(registry).decode())

    it = iter(pages)

    async def fetch() -> str:
        return next(it)

    async def main():
        s = FairnessSampler(fetch, every_s=0.0)
        for _ in pages:
            s.observe(await s.fetch())
        return s

    s = asyncio.run(main())
    w = s.summary()["lanes"]["embed/standard"]
    assert w["gap_cost"] == 700 and abs(w["gap_over_bound"] - 700 / 600) < 1e-6
    assert w["longest_wait_seconds"] == 3.0
    assert w["jain_min"] == 0.7  # the 0.5 came with no two orgs backlogged together
    assert "1.17x" in s.lines() and s.samples == 3

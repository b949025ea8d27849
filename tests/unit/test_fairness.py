"""The live fairness watch and its metrics on hand-made scenarios, driven the way the service drives it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from scheduler import Entry, Scheduler
from scheduler.fairness import FairnessWatch, drr_bound, jain
from scheduler.fairness_metrics import LiveFairness
from scheduler.snapshot import Backlog
from tests.clock import FakeClock
from tests.core_setup import ENDPOINT, config_for


class Driver:
    """A core, a Backlog and a watch, updated in the service's order; one batch per second."""

    def __init__(self, cfg, policy="drr", window_s=1e9):
        self.cfg = cfg
        self.core = Scheduler(cfg, policy)
        self.backlog = Backlog()
        self.watch = FairnessWatch(cfg, window_s)
        self.clock = FakeClock()
        self.n = 0

    def push(self, org: str, tokens: int = 10, count: int = 1) -> None:
        tier = self.cfg.orgs[org].tier
        for _ in range(count):
            self.n += 1
            assert self.core.push(ENDPOINT, Entry(f"r{self.n}", org, tier, tokens))
            self.backlog.add(ENDPOINT, tier, org, tokens)

    def batch(self) -> list[Entry]:
        now = self.clock.now
        self.watch.held(now, ENDPOINT, self.backlog.held_serials(ENDPOINT))
        d = self.core.next_batch(ENDPOINT, now)
        cost = self.core.lanes[ENDPOINT].cost.cost
        for e in d.batch:
            self.backlog.remove(ENDPOINT, e.tier, e.org, e.tokens)
        self.watch.served(now, ENDPOINT, [(e.tier, e.org, cost(e)) for e in d.batch],
                          self.backlog.held_serials(ENDPOINT))
        self.clock.advance(1.0)
        return d.batch

    def figures(self, tier="t0"):
        return self.watch.figures(self.clock.now)[ENDPOINT].tiers[tier]


def noisy_neighbour(policy: str) -> Driver:
    """bulk holds 100 requests; quiet sends one every 5 batches; 40 batches of 40 tokens."""
    cfg = config_for(orgs={"bulk": "t0", "quiet": "t0"}, quantum=40, max_batch_tokens=40,
                     max_request_tokens=10)
    d = Driver(cfg, policy)
    d.push("bulk", count=100)
    for i in range(40):
        if i % 5 == 0:
            d.push("quiet")
        d.batch()
    return d


def test_the_gap_stays_within_the_bound_under_drr_and_exceeds_it_under_fifo():
    """Noisy neighbour: drr's gap <= quantum + 2 x max_cost; fifo's is several times the bound."""
    drr, fifo = noisy_neighbour("drr").figures(), noisy_neighbour("fifo").figures()
    assert drr.bound == fifo.bound == 40 + 2 * 10
    assert 0 < drr.gap <= drr.bound
    assert fifo.gap > 3 * fifo.bound


def test_jain_and_waits_tell_drr_from_fifo():
    """fifo: the quiet org is backlogged, served nothing, J = 0.5; its wait spans many batches."""
    drr, fifo = noisy_neighbour("drr").figures(), noisy_neighbour("fifo").figures()
    assert fifo.jain == pytest.approx(0.5) and fifo.jain_orgs == 2
    # drr serves the quiet org in the batch after it arrives: never backlogged across a batch
    # for long, one batch's wait at most (one batch per second on this clock).
    assert drr.longest_wait_s <= 1.0
    assert fifo.longest_wait_s >= 10 * drr.longest_wait_s


def test_weights_normalise_the_gap():
    """Weights 1:3, both backlogged: served cost per weight stays close; the raw cost does not."""
    cfg = config_for(orgs={"a": ("t0", 1.0), "b": ("t0", 3.0)}, quantum=20, max_batch_tokens=20,
                     max_request_tokens=10)
    d = Driver(cfg)
    d.push("a", count=200)
    d.push("b", count=200)
    served = {"a": 0, "b": 0}
    for _ in range(60):
        for e in d.batch():
            served[e.org] += e.tokens
    f = d.figures()
    assert served["b"] == pytest.approx(3 * served["a"], rel=0.1)
    assert f.gap <= f.bound == 20 + 2 * 10
    assert f.jain > 0.99 and f.jain_orgs == 2


def test_an_org_that_emptied_between_looks_starts_a_new_backlog():
    """A new join serial (emptied, refilled) resets the org's reference: no stale gap."""
    cfg = config_for(orgs={"a": "t0", "b": "t0"}, quantum=10, max_batch_tokens=10,
                     max_request_tokens=10)
    w = FairnessWatch(cfg)
    w.held(0, ENDPOINT, {"t0": {"a": 1, "b": 2}})
    w.served(0, ENDPOINT, [("t0", "a", 10.0)], {"t0": {"a": 1, "b": 2}})
    assert w.figures(0)[ENDPOINT].tiers["t0"].gap == 10
    # b emptied and refilled (serial 3), then a is served again: the pair starts afresh.
    w.served(1, ENDPOINT, [("t0", "a", 10.0)], {"t0": {"a": 1, "b": 3}})
    w.served(2, ENDPOINT, [("t0", "a", 10.0)], {"t0": {"a": 1, "b": 3}})
    assert w.figures(2)[ENDPOINT].tiers["t0"].gap == 10
    # With the same serial throughout, the same service is one growing gap.
    w2 = FairnessWatch(cfg)
    for t in range(3):
        w2.served(t, ENDPOINT, [("t0", "a", 10.0)], {"t0": {"a": 1, "b": 2}})
    assert w2.figures(2)[ENDPOINT].tiers["t0"].gap == 20


def test_an_org_emptied_inside_a_batch_is_not_blamed_for_its_peers_later_service():
    """A pair counts a batch only if both still hold work after it."""
    cfg = config_for(orgs={"a": "t0", "b": "t0"})
    w = FairnessWatch(cfg)
    w.held(0, ENDPOINT, {"t0": {"a": 1, "b": 2}})
    w.served(0, ENDPOINT, [("t0", "b", 10.0), ("t0", "a", 90.0)], {"t0": {"a": 1}})
    assert w.figures(0)[ENDPOINT].tiers["t0"].gap == 0


def test_figures_slide_with_the_window():
    """Outside the window a gap, a finished wait and a Jain set are forgotten; running waits are not."""
    cfg = config_for(orgs={"a": "t0", "b": "t0", "c": "t0"})
    w = FairnessWatch(cfg, window_s=10)
    both = {"t0": {"a": 1, "b": 2}}
    w.held(0, ENDPOINT, both)
    w.served(1, ENDPOINT, [("t0", "a", 50.0)], both)
    f = w.figures(1)[ENDPOINT].tiers["t0"]
    assert f.gap == 50 and f.jain == pytest.approx(0.5) and f.jain_orgs == 2
    f = w.figures(20)[ENDPOINT].tiers["t0"]
    assert f.gap == 0 and f.jain == 1.0 and f.jain_orgs == 0
    assert f.longest_wait_s == 20  # b has waited since 0 and still does
    lane = w.figures(20)[ENDPOINT]
    assert lane.total == 0 and lane.served == {}


def test_tier_share_and_floor_follow_min_share():
    """A backlogged min_share tier gets about its share under a busy higher tier; the floor is below it."""
    cfg = config_for(tiers=("gold", "free"), min_share={"free": 0.2},
                     orgs={"g": "gold", "f": "free"}, quantum=10, max_batch_tokens=10,
                     max_request_tokens=10)
    d = Driver(cfg)
    d.push("g", count=300)
    d.push("f", count=300)
    for _ in range(200):
        d.batch()
    free, gold = d.figures("free"), d.figures("gold")
    assert free.share == pytest.approx(0.2, abs=0.01)
    assert free.share_floor is not None and free.share_floor < free.share
    assert gold.share_floor is None and gold.share == pytest.approx(0.8, abs=0.01)


def test_bound_scales_with_weights_below_one():
    """A tier with an org of weight 0.5 doubles the max_cost term of its bound."""
    cfg = config_for(orgs={"a": ("t0", 0.5), "b": ("t0", 2.0)}, quantum=40,
                     max_request_tokens=10)
    assert drr_bound(cfg, ENDPOINT, "t0") == 40 + 2 * 10 / 0.5
    assert jain([1, 1, 1]) == 1.0 and jain([1, 0]) == 0.5 and jain([]) == 1.0


def test_live_fairness_publishes_bounded_series_and_clears_them():
    """Gauges per (endpoint, tier); org shares only for allow-listed orgs and 'other'; reset clears."""
    cfg = config_for(orgs={"bulk": "t0", "quiet": "t0", "zed": "t0"}, quantum=40,
                     max_batch_tokens=40, max_request_tokens=10)
    cfg = type(cfg)(**{**{f: getattr(cfg, f) for f in cfg.__struct_fields__},
                       "service": type(cfg.service)(metrics_org_allowlist=["bulk"])})
    registry = CollectorRegistry()
    live = LiveFairness(registry, cfg, window_s=100)
    d = Driver(cfg, "fifo")
    for org, n in (("bulk", 30), ("quiet", 10), ("zed", 10)):
        d.push(org, count=n)
    for _ in range(5):
        now = d.clock.now
        live.held(now, ENDPOINT, d.backlog)
        b = d.core.next_batch(ENDPOINT, now).batch
        for e in b:
            d.backlog.remove(ENDPOINT, e.tier, e.org, e.tokens)
        cost = d.core.cost_of(ENDPOINT)
        live.charged(now, ENDPOINT, [(e.tier, e.org, cost(e)) for e in b], d.backlog)
        d.clock.advance(1)
    live.batch_done(ENDPOINT, 0.5)
    live.batch_done(ENDPOINT, 0.0)  # a broken report is ignored
    live.publish(d.clock.now, d.backlog)

    def value(name, **labels):
        return registry.get_sample_value(name, labels)

    lt = {"endpoint": ENDPOINT, "tier": "t0"}
    assert value("sf_scheduler_fairness_bound_cost", **lt) == 60
    assert value("sf_scheduler_fairness_gap_cost", **lt) > 60  # fifo: bulk ahead of both
    assert value("sf_scheduler_fairness_backlogged_orgs", **lt) == 3
    assert value("sf_scheduler_fairness_batch_seconds", endpoint=ENDPOINT) == 0.5
    assert value("sf_scheduler_fairness_window_seconds") == 100
    orgs = {s.labels["org"] for m in registry.collect() for s in m.samples
            if s.name == "sf_scheduler_fairness_served_share_ratio"}
    assert orgs == {"bulk"}  # fifo served 20 of bulk's 30 requests, nobody else's
    shares = [s.value for m in registry.collect() for s in m.samples
              if s.name == "sf_scheduler_fairness_served_share_ratio"]
    assert sum(shares) == pytest.approx(1.0)
    live.reset()
    assert value("sf_scheduler_fairness_gap_cost", **lt) is None


def test_the_starvation_unit_is_a_full_batch_even_when_the_first_report_is_small():
    """A batch of 2 requests (10 ms) reported first must not set the unit at 10 ms.

    max_batch_tokens 40, max_batch_size 64: a batch of 2 requests and 4 tokens
    is a tenth full by tokens, so its 10 ms counts as a full batch's 100 ms;
    a full batch's 80 ms counts as it is; a report without its size as full.
    """
    cfg = config_for(orgs={"bulk": "t0"}, quantum=40, max_batch_tokens=40, max_batch_size=64,
                     max_request_tokens=10)
    live = LiveFairness(CollectorRegistry(), cfg, window_s=100)
    live.batch_done(ENDPOINT, 0.010, requests=2, tokens=4)
    assert live.batch_s[ENDPOINT] == pytest.approx(0.100)
    live.batch_done(ENDPOINT, 0.080, requests=8, tokens=40, alpha=1.0)
    assert live.batch_s[ENDPOINT] == pytest.approx(0.080)
    live.batch_done(ENDPOINT, 0.050, requests=64, tokens=20, alpha=1.0)  # full by count
    assert live.batch_s[ENDPOINT] == pytest.approx(0.050)
    live.batch_done(ENDPOINT, 0.030, alpha=1.0)  # an older worker's report: no size
    assert live.batch_s[ENDPOINT] == pytest.approx(0.030)

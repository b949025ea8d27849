"""Tiers: strict priority between tiers, and the optional minimum share of a lower tier."""

from __future__ import annotations

from scheduler import Entry, Scheduler
from tests.clock import FakeClock
from tests.core_setup import ENDPOINT, config_for, run_until_empty

TIERS = ("gold", "silver", "free")
ORGS = {"g": "gold", "s": "silver", "f": "free"}
TWO_TIERS = ("gold", "free")
TWO_ORGS = {"g": "gold", "f": "free"}


def _push(s: Scheduler, org: str, n: int, tokens: int = 10, start: int = 0, **kw) -> None:
    for i in range(start, start + n):
        assert s.push(ENDPOINT, Entry(f"{org}{i}", org, ORGS[org], tokens, **kw))


def test_tiers_served_in_configured_order_whatever_the_arrival():
    """Requests pushed lowest tier first still leave highest tier first."""
    s = Scheduler(config_for(tiers=TIERS, orgs=ORGS, max_batch_size=3))
    for org in ("f", "s", "g"):
        _push(s, org, 3)
    batches = run_until_empty(s, 0.0)
    assert [[e.tier for e in b] for b in batches] == [["gold"] * 3, ["silver"] * 3, ["free"] * 3]


def test_lower_tier_fills_a_batch_only_after_the_higher_tier_is_empty():
    """A batch mixes tiers only at the boundary: the higher tier's last requests, then the lower's."""
    s = Scheduler(config_for(tiers=TIERS, orgs=ORGS, max_batch_size=4))
    _push(s, "f", 6)
    _push(s, "g", 6)
    tiers = [[e.tier for e in b] for b in run_until_empty(s, 0.0)]
    assert tiers == [["gold"] * 4, ["gold"] * 2 + ["free"] * 2, ["free"] * 4]


def test_higher_tier_arrival_overtakes_a_lower_backlog_in_the_next_batch():
    """A gold request pushed behind a long free backlog is in the very next batch, first."""
    clock = FakeClock()
    s = Scheduler(config_for(tiers=TIERS, orgs=ORGS, max_batch_size=2))
    _push(s, "f", 10)
    assert [e.org for e in s.next_batch(ENDPOINT, clock.now).batch] == ["f", "f"]
    clock.advance(1.0)
    _push(s, "g", 1)
    assert [e.org for e in s.next_batch(ENDPOINT, clock.now).batch] == ["g", "f"]


def test_without_min_share_a_backlogged_higher_tier_starves_the_lower():
    """With no min_share, free receives nothing while gold stays backlogged."""
    s = Scheduler(config_for(tiers=TIERS, orgs=ORGS, max_batch_size=4))
    _push(s, "f", 5)
    for i in range(50):
        _push(s, "g", 4, start=4 * i)
        assert {e.tier for e in s.next_batch(ENDPOINT, float(i)).batch} == {"gold"}


def test_min_share_gives_a_backlogged_lower_tier_its_share():
    """free with min_share 0.2 gets 20% of served cost (within one request) while gold is backlogged."""
    s = Scheduler(
        config_for(tiers=TWO_TIERS, min_share={"free": 0.2}, orgs=TWO_ORGS, max_batch_size=8)
    )
    _push(s, "g", 2000, tokens=10)
    _push(s, "f", 2000, tokens=30)
    served = {"gold": 0, "free": 0}
    for i in range(100):
        for e in s.next_batch(ENDPOINT, float(i)).batch:
            served[e.tier] += e.tokens
            total = served["gold"] + served["free"]
            # Behind its share by at most one of its requests (30 tokens), at every entry.
            assert served["free"] >= 0.2 * total - 30 - 1e-9, (served, total)
    total = served["gold"] + served["free"]
    assert abs(served["free"] / total - 0.2) < 0.02


def test_min_share_credit_is_dropped_when_the_tier_empties():
    """Credit a lower tier earned while waiting is lost when it empties: back, it waits in full again."""
    clock = FakeClock()
    s = Scheduler(
        config_for(tiers=TWO_TIERS, min_share={"free": 0.2}, orgs=TWO_ORGS, max_batch_size=1)
    )
    _push(s, "g", 1000, tokens=10)
    # Cost 100 needs 100 / (0.2 x 10) = 50 gold selections of credit.
    s.push(ENDPOINT, Entry("f-old", "f", "free", 100, deadline=5.0))
    for _ in range(40):
        assert s.next_batch(ENDPOINT, clock.now).batch[0].org == "g"
    clock.advance(5.0)
    d = s.next_batch(ENDPOINT, clock.now)
    assert [e.id for e in d.expired] == ["f-old"] and d.batch[0].org == "g"
    s.push(ENDPOINT, Entry("f-new", "f", "free", 100))
    gold_before = 0
    while s.next_batch(ENDPOINT, clock.now).batch[0].id != "f-new":
        gold_before += 1
    assert gold_before == 50


def test_a_removed_tier_name_falls_back_to_the_lowest_tier():
    """An entry whose tier the lane does not know waits in the lowest tier, behind the others."""
    s = Scheduler(config_for(tiers=TWO_TIERS, orgs=TWO_ORGS))
    s.push(ENDPOINT, Entry("x", "ghost", "platinum", 10))
    s.push(ENDPOINT, Entry("g", "g", "gold", 10))
    s.push(ENDPOINT, Entry("f", "f", "free", 10))
    assert s.stats()[ENDPOINT].held_by_tier == {"gold": 1, "free": 2}
    assert [e.id for e in s.next_batch(ENDPOINT, 0.0).batch] == ["g", "x", "f"]

"""Reconfiguration: weights, quanta, budgets and cost models change in place; held requests stay."""

from __future__ import annotations

import random

import pytest

from scheduler import Entry, Scheduler
from tests.core_setup import ENDPOINT, config_for, flat, ids, run_until_empty


def _orgs_seq(batches) -> str:
    return "".join(e.org for b in batches for e in b)


def test_a_weight_change_applies_from_the_next_turn():
    """Raising a's weight 1 -> 3 mid-run gives a three quanta per turn from its next turn."""
    s = Scheduler(config_for(quantum=100, max_batch_size=10, orgs={"a": "t0", "b": "t0"}))
    for i in range(100):
        s.push(ENDPOINT, Entry(f"a{i}", "a", "t0", 10))
        s.push(ENDPOINT, Entry(f"b{i}", "b", "t0", 10))
    assert _orgs_seq([s.next_batch(ENDPOINT, 0.0).batch]) == "a" * 10
    s.reconfigure(config_for(quantum=100, max_batch_size=10,
                             orgs={"a": ("t0", 3.0), "b": "t0"}))
    later = _orgs_seq(s.next_batch(ENDPOINT, 0.0).batch for _ in range(8))
    assert later == "b" * 10 + "a" * 30 + "b" * 10 + "a" * 30


def test_a_quantum_change_applies_from_the_next_turn():
    """Halving the quantum halves what each org gets per turn."""
    s = Scheduler(config_for(quantum=100, max_batch_size=10))
    for i in range(40):
        s.push(ENDPOINT, Entry(f"a{i}", "a", "t0", 10))
        s.push(ENDPOINT, Entry(f"b{i}", "b", "t0", 10))
    s.next_batch(ENDPOINT, 0.0)
    s.reconfigure(config_for(quantum=50, max_request_tokens=50, max_batch_size=10))
    assert _orgs_seq(s.next_batch(ENDPOINT, 0.0).batch for _ in range(3)) == (
        "b" * 5 + "a" * 5) * 3


def test_a_cost_model_change_applies():
    """Switching tokens -> requests (quantum 1) interleaves one request per turn at once."""
    s = Scheduler(config_for(cost_model="tokens", quantum=100))
    for org in "abc":
        for i in range(3):
            s.push(ENDPOINT, Entry(f"{org}{i}", org, "t0", 100))
    s.reconfigure(config_for(cost_model="requests", quantum=1))
    [batch] = run_until_empty(s, 0.0)
    assert _orgs_seq([batch]) == "abc" * 3
    assert s.stats()[ENDPOINT].rounds == 9  # one turn per request: no turn went unserved


@pytest.mark.parametrize("policy", ["drr", "fifo"])
def test_a_tier_list_change_keeps_every_held_request_in_order(policy):
    """Adding a tier rebuilds the lanes: every held request stays, ids stay held, order is kept."""
    orgs = {"g": "gold", "f": "free", "h": "free"}
    cfg = config_for(tiers=("gold", "free"), orgs=orgs, endpoints=("e", "r"))
    rng = random.Random(7)
    before, after = Scheduler(cfg, policy), Scheduler(cfg, policy)
    for i in range(60):
        org = rng.choice("gfh")
        kw = {"priority": rng.randint(0, 2), "arrival": rng.random(),
              "deadline": rng.choice([None, 50.0, 60.0])}
        ep = rng.choice(["e", "r"])
        for s in (before, after):
            assert s.push(ep, Entry(f"r{i}", org, orgs[org], rng.randint(1, 100), **kw))
    after.reconfigure(config_for(tiers=("platinum", "gold", "free"),
                                 orgs={**orgs, "p": "platinum"}, endpoints=("e", "r")))
    assert after.held == 60 and all(after.holds(f"r{i}") for i in range(60))
    assert not after.push("e", Entry("r0", "g", "gold", 1))
    for ep in ("e", "r"):
        assert after.stats()[ep].held == before.stats()[ep].held
        served_before = flat(run_until_empty(before, 0.0, ep))
        served_after = flat(run_until_empty(after, 0.0, ep))
        if policy == "fifo":
            assert ids(served_after) == ids(served_before)
        for org in orgs:  # DRR turns restart, but each org's own order is unchanged
            assert [e.id for e in served_after if e.org == org] == [
                e.id for e in served_before if e.org == org]
        assert sorted(ids(served_after)) == sorted(ids(served_before))


def test_requests_of_a_removed_tier_wait_in_the_lowest_tier():
    """Removing a tier keeps its requests; they are served with the lowest tier, after the others."""
    s = Scheduler(config_for(tiers=("gold", "silver", "free"),
                             orgs={"g": "gold", "s": "silver", "f": "free"}))
    s.push(ENDPOINT, Entry("s1", "s", "silver", 10))
    s.push(ENDPOINT, Entry("f1", "f", "free", 10))
    s.push(ENDPOINT, Entry("g1", "g", "gold", 10))
    s.reconfigure(config_for(tiers=("gold", "free"), orgs={"g": "gold", "f": "free"}))
    assert s.stats()[ENDPOINT].held_by_tier == {"gold": 1, "free": 2}
    assert ids(flat(run_until_empty(s, 0.0))) == ["g1", "s1", "f1"]


def test_adaptive_measurements_survive_a_tier_list_change():
    """A lane rebuilt for new tiers keeps what the adaptive cost model has measured."""
    s = Scheduler(config_for(cost_model="adaptive", quantum=400))
    s.feedback(ENDPOINT, [("slow", 100, 0.2), ("fast", 100, 0.05)] * 5)
    probe = Entry("p", "slow", "t0", 100)
    cost_before = s.lanes[ENDPOINT].cost.cost(probe)
    assert cost_before > 100
    s.reconfigure(config_for(cost_model="adaptive", quantum=400, tiers=("t0", "t1")))
    assert s.lanes[ENDPOINT].cost.cost(probe) == cost_before


def test_an_added_endpoint_is_usable_and_a_removed_one_drains():
    """A new endpoint gets a lane; a removed endpoint's held requests are still served."""
    s = Scheduler(config_for(endpoints=("e", "old")))
    s.push("old", Entry("o1", "a", "t0", 10))
    s.reconfigure(config_for(endpoints=("e", "new")))
    assert s.push("new", Entry("n1", "a", "t0", 10))
    assert ids(s.next_batch("new", 0.0).batch) == ["n1"]
    assert ids(s.next_batch("old", 0.0).batch) == ["o1"]


def test_a_removed_endpoint_with_held_requests_survives_a_tier_change():
    """Tiers and endpoints changing together: the removed endpoint's held requests are kept."""
    s = Scheduler(config_for(endpoints=("e", "old")))
    s.push("old", Entry("o1", "a", "t0", 10))
    s.reconfigure(config_for(endpoints=("e",), tiers=("t0", "t1")))
    assert set(s.lanes) == {"e", "old"}
    assert ids(s.next_batch("old", 0.0).batch) == ["o1"]

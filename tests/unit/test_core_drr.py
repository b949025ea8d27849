"""Deficit Round Robin across the orgs of one tier: interleaving, weights, cost models, no banking."""

from __future__ import annotations

from scheduler import Entry, Scheduler
from tests.clock import FakeClock
from tests.core_setup import ENDPOINT, config_for, flat, ids, run_until_empty, served_by


def _push_all(s: Scheduler, requests: list[tuple[str, str, int]]) -> None:
    for rid, org, tokens in requests:
        assert s.push(ENDPOINT, Entry(rid, org, "t0", tokens))


def test_requests_cost_model_interleaves_one_request_per_turn_whatever_the_size():
    """cost_model=requests with quantum 1: a, b, c take turns one request each, sizes ignored."""
    s = Scheduler(config_for(cost_model="requests", quantum=1))
    _push_all(s, [(f"a{i}", "a", 100) for i in range(3)])
    _push_all(s, [(f"b{i}", "b", 1) for i in range(3)])
    _push_all(s, [(f"c{i}", "c", 50) for i in range(2)])
    [batch] = run_until_empty(s, 0.0)
    assert ids(batch) == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2"]


def test_tokens_cost_model_serves_while_the_deficit_covers_and_carries_the_rest():
    """cost_model=tokens: a turn serves while the deficit covers; the remainder carries to the next turn."""
    s = Scheduler(config_for(cost_model="tokens", quantum=100))
    _push_all(s, [(f"a{i}", "a", 60) for i in range(1, 5)])
    _push_all(s, [(f"b{i}", "b", 30) for i in range(1, 9)])
    [batch] = run_until_empty(s, 0.0)
    # a: 100 -> a1 (40 left); b: 100 -> b1-b3 (10); a: 140 -> a2, a3 (20); b: 110 -> b4-b6;
    # a: 120 -> a4 (empty, leaves); b: 120 -> b7, b8.
    assert " ".join(ids(batch)) == "a1 b1 b2 b3 a2 a3 b4 b5 b6 a4 b7 b8"


def test_weights_scale_the_quantum():
    """Weight 2 against weight 1: each round a gets twice b's requests, in one run per turn."""
    s = Scheduler(config_for(quantum=100, orgs={"a": ("t0", 2.0), "b": ("t0", 1.0)}))
    _push_all(s, [(f"a{i}", "a", 10) for i in range(60)])
    _push_all(s, [(f"b{i}", "b", 10) for i in range(30)])
    batch = flat(run_until_empty(s, 0.0))
    assert "".join(e.org for e in batch[:60]) == ("a" * 20 + "b" * 10) * 2


def test_unconfigured_org_has_weight_one():
    """An org missing from the registry is weighed 1, like a configured org of weight 1."""
    s = Scheduler(config_for(quantum=100, orgs={"a": ("t0", 3.0)}))
    _push_all(s, [(f"a{i}", "a", 10) for i in range(60)])
    _push_all(s, [(f"x{i}", "x", 10) for i in range(60)])
    first = flat(run_until_empty(s, 0.0))[:40]
    assert served_by(first) == {"a": 300, "x": 100}


def test_adaptive_cost_serves_fewer_tokens_to_a_costlier_org():
    """cost_model=adaptive: an org twice as slow per token, fed back, gets about half b's tokens."""
    clock = FakeClock()
    s = Scheduler(config_for(cost_model="adaptive", quantum=400, max_batch_tokens=400))
    seconds_per_token = {"a": 0.002, "b": 0.001}
    for i in range(1000):
        _push_all(s, [(f"a{i}", "a", 50), (f"b{i}", "b", 50)])
    early, late = [], []
    for n in range(60):
        batch = s.next_batch(ENDPOINT, clock.now).batch
        (early if n < 2 else late).extend(batch)
        clock.advance(0.1)
        s.feedback(ENDPOINT, [(e.org, e.tokens, e.tokens * seconds_per_token[e.org])
                              for e in batch])
    assert served_by(early) == {"a": 400, "b": 400}  # no measurement yet: cost == tokens
    tokens = served_by(late)
    assert 0.45 < tokens["a"] / tokens["b"] < 0.55


def test_adaptive_cost_ignores_broken_reports():
    """Reports with no tokens, negative, NaN or infinite seconds leave the adaptive cost unchanged."""
    s = Scheduler(config_for(cost_model="adaptive", quantum=400))
    s.feedback(ENDPOINT, [("a", 100, 0.2), ("b", 100, 0.1)])
    cost = s.lanes[ENDPOINT].cost
    before = cost.cost(Entry("x", "a", "t0", 100))
    s.feedback(ENDPOINT, [("a", 0, 1.0), ("a", 100, -1.0), ("a", 100, float("nan")),
                          ("a", 100, float("inf"))])
    assert cost.cost(Entry("x", "a", "t0", 100)) == before


def test_an_org_back_from_idle_has_no_banked_credit():
    """An org that emptied rejoins at the back with a zero deficit: one quantum, then the others."""
    s = Scheduler(config_for(quantum=100))
    _push_all(s, [("a-once", "a", 10)])
    assert ids(s.next_batch(ENDPOINT, 0.0).batch) == ["a-once"]  # a leaves with 90 unspent
    _push_all(s, [(f"b{i}", "b", 100) for i in range(3)])
    _push_all(s, [(f"a{i}", "a", 10) for i in range(30)])
    order = "".join(e.org for e in flat(run_until_empty(s, 0.0)))
    assert order.startswith("b" + "a" * 10 + "b" + "a" * 10 + "b")


def test_an_org_emptied_by_expiry_loses_its_turn():
    """An org whose waiting requests all expired mid-turn, when it returns, goes behind the others."""
    clock = FakeClock()
    s = Scheduler(config_for(quantum=100, max_batch_size=1))
    s.push(ENDPOINT, Entry("a0", "a", "t0", 10, priority=1))
    s.push(ENDPOINT, Entry("a-doomed", "a", "t0", 10, deadline=2.0))
    _push_all(s, [(f"b{i}", "b", 100) for i in range(3)])
    assert ids(s.next_batch(ENDPOINT, clock.now).batch) == ["a0"]  # a's turn goes on, 90 left
    clock.advance(2.0)
    assert ids(s.expire(clock.now)) == ["a-doomed"]  # a is empty, mid-turn
    _push_all(s, [(f"a{i}", "a", 10) for i in range(1, 30)])
    order = "".join(e.org for e in flat(run_until_empty(s, clock.now)))
    assert order.startswith("b" + "a" * 10 + "b")


def test_rounds_count_turns_granted():
    """The lane's round counter counts one per turn granted to an org."""
    s = Scheduler(config_for(cost_model="requests", quantum=1))
    _push_all(s, [("a0", "a", 1), ("a1", "a", 1), ("b0", "b", 1)])
    run_until_empty(s, 0.0)
    assert s.stats()[ENDPOINT].rounds == 3

"""Batch budgets: max_batch_tokens and max_batch_size; the request that does not fit waits first."""

from __future__ import annotations

from scheduler import Entry, Scheduler
from tests.core_setup import ENDPOINT, config_for, ids, run_until_empty


def test_max_batch_size_caps_the_count():
    """No batch holds more than max_batch_size requests; all are eventually served."""
    s = Scheduler(config_for(max_batch_size=3))
    for i in range(10):
        s.push(ENDPOINT, Entry(f"r{i}", "a", "t0", 1))
    assert [len(b) for b in run_until_empty(s, 0.0)] == [3, 3, 3, 1]


def test_max_batch_tokens_caps_the_tokens():
    """No batch of two or more requests holds more than max_batch_tokens tokens."""
    s = Scheduler(config_for(max_batch_tokens=100, max_request_tokens=100))
    for i, tokens in enumerate([40, 40, 30, 70, 30, 100, 1]):
        s.push(ENDPOINT, Entry(f"r{i}", "a", "t0", tokens))
    sizes = [[e.tokens for e in b] for b in run_until_empty(s, 0.0)]
    assert sizes == [[40, 40], [30, 70], [30], [100], [1]]


def test_the_request_that_does_not_fit_closes_the_batch_and_leads_the_next():
    """A request over the remaining budget closes the batch, though a later smaller one would fit."""
    s = Scheduler(config_for(quantum=100, max_batch_tokens=100, max_request_tokens=100))
    s.push(ENDPOINT, Entry("a-big", "a", "t0", 60, priority=1))
    s.push(ENDPOINT, Entry("a-small", "a", "t0", 10))
    s.push(ENDPOINT, Entry("b-big", "b", "t0", 90))
    s.push(ENDPOINT, Entry("b-tiny", "b", "t0", 1))
    first = s.next_batch(ENDPOINT, 0.0).batch
    # a: 100 -> a-big, a-small (30 left, a empties and leaves); b-big does not fit 30 more.
    assert ids(first) == ["a-big", "a-small"]
    assert ids(s.next_batch(ENDPOINT, 0.0).batch) == ["b-big", "b-tiny"]


def test_closing_a_batch_keeps_the_turn_and_deficit_of_the_org():
    """The org whose request closed a batch keeps its turn: it still leads when the next batch opens."""
    s = Scheduler(config_for(quantum=100, max_batch_tokens=50, max_request_tokens=50))
    for i in range(4):
        s.push(ENDPOINT, Entry(f"a{i}", "a", "t0", 25))
        s.push(ENDPOINT, Entry(f"b{i}", "b", "t0", 25))
    batches = [ids(b) for b in run_until_empty(s, 0.0)]
    assert batches == [["a0", "a1"], ["a2", "a3"], ["b0", "b1"], ["b2", "b3"]]


def test_a_request_larger_than_the_budget_still_leaves_alone():
    """Work conservation: after a budget shrinks under a held request, that request goes alone."""
    s = Scheduler(config_for(max_batch_tokens=1000, max_request_tokens=1000, quantum=1000))
    s.push(ENDPOINT, Entry("huge", "a", "t0", 900))
    s.push(ENDPOINT, Entry("next", "a", "t0", 10))
    s.reconfigure(config_for(max_batch_tokens=100, max_request_tokens=100, quantum=1000))
    assert [ids(b) for b in run_until_empty(s, 0.0)] == [["huge"], ["next"]]


def test_held_tokens_follow_the_batches():
    """Lane stats count held requests and tokens per tier, and drop as batches leave."""
    s = Scheduler(config_for(tiers=("gold", "free"), orgs={"g": "gold", "f": "free"},
                             max_batch_size=2))
    for i in range(3):
        s.push(ENDPOINT, Entry(f"g{i}", "g", "gold", 10 + i))
        s.push(ENDPOINT, Entry(f"f{i}", "f", "free", 20))
    st = s.stats()[ENDPOINT]
    assert (st.held, st.held_tokens_by_tier, st.held_by_tier) == (
        6, {"gold": 33, "free": 60}, {"gold": 3, "free": 3})
    s.next_batch(ENDPOINT, 0.0)
    st = s.stats()[ENDPOINT]
    assert (st.held, st.held_tokens_by_tier) == (4, {"gold": 12, "free": 60})


def test_remove_takes_a_held_request_out_for_good():
    """A removed request is never dispatched or expired, and its id can be held again."""
    from scheduler import Entry, Scheduler
    from tests.core_setup import config_for

    s = Scheduler(config_for())
    ep = next(iter(s.lanes))
    tier = s.config.tier_names[0]
    a = Entry("a", "org-a", tier, 10, deadline=5.0)
    b = Entry("b", "org-a", tier, 10)
    assert s.push(ep, a) and s.push(ep, b)
    assert s.remove("a") is a
    assert s.remove("a") is None
    assert s.held == 1
    d = s.next_batch(ep, now=10.0)
    assert [e.id for e in d.batch] == ["b"] and d.expired == []
    assert s.lanes[ep].held == 0
    assert s.push(ep, Entry("a", "org-a", tier, 10))

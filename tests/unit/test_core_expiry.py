"""Expiry: a request past its deadline is never dispatched and is returned exactly once, promptly."""

from __future__ import annotations

from scheduler import Entry, Scheduler
from scheduler.entry import DISPATCHED, EXPIRED, HELD
from tests.clock import FakeClock
from tests.core_setup import ENDPOINT, config_for, ids


def test_deadline_at_now_expires_and_just_after_now_is_dispatched():
    """A deadline equal to ``now`` is expired; one a hair later is still served."""
    clock = FakeClock(10.0)
    s = Scheduler(config_for())
    s.push(ENDPOINT, Entry("due", "a", "t0", 10, deadline=10.0))
    s.push(ENDPOINT, Entry("live", "a", "t0", 10, deadline=10.001))
    d = s.next_batch(ENDPOINT, clock.now)
    assert ids(d.expired) == ["due"] and ids(d.batch) == ["live"]
    assert d.expired[0].state == EXPIRED and d.batch[0].state == DISPATCHED


def test_an_expired_request_is_returned_once_and_its_id_forgotten():
    """Expiry reports a request once, by whichever call finds it; then its id is free again."""
    clock = FakeClock()
    s = Scheduler(config_for(), policy="drr")
    s.push(ENDPOINT, Entry("x", "a", "t0", 10, deadline=1.0))
    s.push(ENDPOINT, Entry("y", "b", "t0", 10, deadline=1.0))
    clock.advance(1.5)
    assert ids(s.expire(clock.now)) == ["x", "y"]
    d = s.next_batch(ENDPOINT, clock.now)
    assert d.expired == [] and d.batch == []
    assert s.expire(clock.now) == [] and s.held == 0 and not s.holds("x")
    assert s.push(ENDPOINT, Entry("x", "a", "t0", 10))


def test_fifo_lane_expires_the_same_way():
    """The FIFO baseline also never dispatches an expired request and reports it once."""
    clock = FakeClock()
    s = Scheduler(config_for(), policy="fifo")
    s.push(ENDPOINT, Entry("old", "a", "t0", 10, deadline=1.0, arrival=0.0))
    s.push(ENDPOINT, Entry("new", "a", "t0", 10, arrival=0.5))
    clock.advance(2.0)
    d = s.next_batch(ENDPOINT, clock.now)
    assert ids(d.expired) == ["old"] and ids(d.batch) == ["new"]
    assert s.next_batch(ENDPOINT, clock.now) == ([], [])


def test_a_request_in_a_starved_tier_expires_on_time():
    """A free request expires at its deadline while gold keeps its tier starved of service."""
    clock = FakeClock()
    cfg = config_for(tiers=("gold", "free"), orgs={"g": "gold", "f": "free"}, max_batch_size=2)
    s = Scheduler(cfg)
    s.push(ENDPOINT, Entry("f", "f", "free", 10, deadline=3.0))
    for step in range(6):
        s.push(ENDPOINT, Entry(f"g{2 * step}", "g", "gold", 10))
        s.push(ENDPOINT, Entry(f"g{2 * step + 1}", "g", "gold", 10))
        d = s.next_batch(ENDPOINT, clock.now)
        assert {e.org for e in d.batch} == {"g"}
        assert ids(d.expired) == (["f"] if clock.now == 3.0 else [])
        clock.advance(1.0)
    assert s.stats()[ENDPOINT].held_by_tier == {"gold": 0, "free": 0}


def test_an_org_whose_requests_all_expired_leaves_no_trace():
    """Expiry empties an org: the lane's counts drop and the other orgs are served normally."""
    clock = FakeClock()
    s = Scheduler(config_for(quantum=100))
    for i in range(5):
        s.push(ENDPOINT, Entry(f"a{i}", "a", "t0", 10, deadline=1.0))
        s.push(ENDPOINT, Entry(f"b{i}", "b", "t0", 10))
    clock.advance(1.0)
    d = s.next_batch(ENDPOINT, clock.now)
    assert sorted(ids(d.expired)) == [f"a{i}" for i in range(5)]
    assert ids(d.batch) == [f"b{i}" for i in range(5)]
    assert s.stats()[ENDPOINT].held == 0 and s.lanes[ENDPOINT].tiers[0].orgs == {}


def test_next_deadline_is_the_earliest_deadline_still_held():
    """next_deadline: None when nothing with a deadline is held; else the earliest held one, any lane."""
    cfg = config_for(endpoints=("e", "f"), max_batch_size=1)
    s = Scheduler(cfg)
    assert s.next_deadline() is None
    s.push("e", Entry("none", "a", "t0", 10))
    assert s.next_deadline() is None
    s.push("e", Entry("e5", "a", "t0", 10, deadline=5.0))
    s.push("f", Entry("f3", "a", "t0", 10, deadline=3.0))
    s.push("f", Entry("f7", "a", "t0", 10, deadline=7.0))
    assert s.next_deadline() == 3.0
    assert ids(s.next_batch("f", 0.0).batch) == ["f3"]  # dispatched: no longer a deadline
    assert s.next_deadline() == 5.0
    assert ids(s.expire(5.0)) == ["e5"]
    assert s.next_deadline() == 7.0
    assert [e.state for e in s.next_batch("f", 5.0).batch] == [DISPATCHED]
    assert s.next_deadline() is None and s.holds("none")
    assert s.lanes["e"].next_deadline() is None


def test_entry_states_move_held_to_one_final_state():
    """A pushed entry is HELD; it ends DISPATCHED or EXPIRED, never both."""
    clock = FakeClock()
    s = Scheduler(config_for(max_batch_size=1))
    a = Entry("a", "a", "t0", 10, deadline=1.0)
    b = Entry("b", "b", "t0", 10, deadline=1.0)
    s.push(ENDPOINT, a)
    s.push(ENDPOINT, b)
    assert (a.state, b.state) == (HELD, HELD)
    assert s.next_batch(ENDPOINT, clock.now).batch == [a]
    clock.advance(1.0)
    assert s.next_batch(ENDPOINT, clock.now).expired == [b]
    assert (a.state, b.state) == (DISPATCHED, EXPIRED)

"""Request ids: an id is held at most once, so a replayed record cannot leave twice."""

from __future__ import annotations

import pytest

from scheduler import Entry, Scheduler
from tests.core_setup import ENDPOINT, config_for, ids, run_until_empty


@pytest.mark.parametrize("policy", ["drr", "fifo"])
def test_a_held_id_is_refused(policy):
    """Pushing an id already held returns False and changes nothing; the first copy leaves once."""
    s = Scheduler(config_for(), policy=policy)
    assert s.push(ENDPOINT, Entry("r1", "a", "t0", 10))
    assert not s.push(ENDPOINT, Entry("r1", "b", "t0", 50))
    assert s.held == 1 and s.stats()[ENDPOINT].held == 1
    [batch] = run_until_empty(s, 0.0)
    assert [(e.id, e.org) for e in batch] == [("r1", "a")]


def test_an_id_is_held_across_endpoints_once():
    """The same id cannot wait on two endpoints at once."""
    s = Scheduler(config_for(endpoints=("e", "f")))
    assert s.push("e", Entry("r1", "a", "t0", 10))
    assert not s.push("f", Entry("r1", "a", "t0", 10))
    assert s.stats()["f"].held == 0


def test_an_id_may_come_back_after_it_left():
    """Once dispatched, an id is no longer held and may be pushed again (a new request)."""
    s = Scheduler(config_for())
    s.push(ENDPOINT, Entry("r1", "a", "t0", 10))
    assert ids(s.next_batch(ENDPOINT, 0.0).batch) == ["r1"] and not s.holds("r1")
    assert s.push(ENDPOINT, Entry("r1", "a", "t0", 10)) and s.holds("r1")


def test_unknown_endpoint_raises_without_holding_the_id():
    """A push to an endpoint the configuration lacks raises KeyError and holds nothing."""
    s = Scheduler(config_for())
    with pytest.raises(KeyError):
        s.push("nope", Entry("r1", "a", "t0", 10))
    assert s.held == 0 and s.push(ENDPOINT, Entry("r1", "a", "t0", 10))

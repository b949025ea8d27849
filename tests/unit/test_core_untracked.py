"""What the core holds per request is invisible to the cyclic garbage collector.

A scheduler holds up to ``max_held_requests``; every collection of the
oldest generation walks each tracked object, and walked each held request's
Entry and the tuples placing it in the lane's heaps: 117 ms for one full
collection at 100,000 held, every GPU of the fleet idle meanwhile
(``scheduler/entry.py``, ``docs/benchmarks.md``). These check the property
itself, not a time.
"""

from __future__ import annotations

import gc

import pytest

from scheduler import Entry, Scheduler
from tests.core_setup import ENDPOINT, config_for, run_until_empty

HELD = 2_000


def test_an_entry_is_not_tracked():
    """An Entry, with or without a deadline and payload, is not a collector object."""
    for e in (Entry("r1", "a", "t0", 10), Entry("r2", "a", "t0", 10, priority=3, deadline=5.0,
                                                arrival=1.0, payload={"a": [1]})):
        assert not gc.is_tracked(e)


@pytest.mark.parametrize("deadline", [None, 1e9], ids=["no_deadline", "deadline"])
def test_held_requests_add_no_tracked_objects(deadline):
    """Holding ``HELD`` requests (of 10 orgs) leaves the collector's tracked objects where
    they were, once a collection has untracked the tuples that hold only untracked ones."""
    s = Scheduler(config_for())
    entries = [Entry(f"r{i}", f"org{i % 10}", "t0", 10, deadline=deadline)
               for i in range(HELD)]
    gc.collect()
    before = len(gc.get_objects())
    for e in entries:
        assert s.push(ENDPOINT, e)
    gc.collect()
    grown = len(gc.get_objects()) - before
    # The lanes' own lists and dicts grow a little; one tracked object per request is HELD.
    assert grown < HELD // 20, f"{grown} tracked objects more for {HELD} held requests"
    served = [e.id for b in run_until_empty(s, 0.0) for e in b]
    assert sorted(served) == sorted(e.id for e in entries)  # every one, once


def test_entries_are_equal_only_to_themselves():
    """Two entries with the same fields are two requests (a set, a dict, ``==``)."""
    a, b = Entry("r1", "a", "t0", 10), Entry("r1", "a", "t0", 10)
    assert a != b and [a].index(a) == 0 and len({a, b}) == 2 and {a: 1}[a] == 1

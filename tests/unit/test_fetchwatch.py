"""A partition behind its end whose fetches all come back empty is named once, and again when it moves."""

from __future__ import annotations

import pytest

from plumbing.fetchwatch import FetchWatch, Stall


def test_a_partition_starved_past_the_limit_is_reported_once():
    w = FetchWatch(after_s=10)
    assert w.observe(["p0"], [], now=0.0) == ([], [])
    assert w.observe(["p0"], [], now=9.9) == ([], [])
    began, ended = w.observe(["p0"], [], now=10.0)
    assert began == [Stall("p0", 10.0)] and ended == []
    assert w.observe(["p0"], [], now=30.0) == ([], []), "reported again in the same episode"


def test_records_end_a_stall_and_say_how_long_it_lasted():
    w = FetchWatch(after_s=10)
    w.observe(["p0"], [], now=0.0)
    w.observe(["p0"], [], now=12.0)
    assert w.observe([], ["p0"], now=15.0) == ([], [Stall("p0", 15.0)])
    # A new episode starts its own count.
    assert w.observe(["p0"], [], now=16.0) == ([], [])
    assert w.observe(["p0"], [], now=26.0)[0] == [Stall("p0", 10.0)]


def test_a_short_starvation_is_not_a_stall():
    w = FetchWatch(after_s=10)
    w.observe(["p0"], [], now=0.0)
    assert w.observe([], ["p0"], now=5.0) == ([], []), "an unreported episode has no end to report"
    assert w.observe(["p0"], [], now=12.0) == ([], []), "the count did not restart"


def test_partitions_are_counted_apart_and_a_paused_one_is_forgotten():
    w = FetchWatch(after_s=10)
    w.observe(["p0"], [], now=0.0)
    w.observe(["p1"], [], now=5.0)
    began, _ = w.observe(["p0", "p1"], [], now=10.0)
    assert began == [Stall("p0", 10.0)]
    w.forget("p1")
    assert w.observe(["p1"], [], now=14.0) == ([], [])
    assert w.observe(["p1"], [], now=24.0)[0] == [Stall("p1", 10.0)]


def test_the_limit_must_be_positive():
    with pytest.raises(ValueError, match="after_s"):
        FetchWatch(after_s=0)

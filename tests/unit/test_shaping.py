"""Admission's shaping (producer.shaping): an org's records no faster than a set rate,
the others not held up by it, nothing lost or reordered."""

from collections import namedtuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.readahead import ReadAhead
from producer.shaping import Shaper

Rec = namedtuple("Rec", "key value")


def _records(org: str, n: int, start: int = 0) -> list[Rec]:
    return [Rec(None if org == "-" else org.encode(), f"{org}-{i}") for i in range(start, start + n)]


def test_a_burst_of_the_allowance_then_the_rate():
    """Burst 3 at 10/s: three at once, the fourth 0.1 s later, not before."""
    shaper = Shaper(10.0, 3)
    assert [shaper.take("bulk", 0.0) for _ in range(4)] == [True, True, True, False]
    assert shaper.due_in("bulk", 0.0) == pytest.approx(0.1)
    assert not shaper.take("bulk", 0.09)
    assert shaper.take("bulk", 0.1001)
    assert shaper.take("other", 0.0)  # another key's allowance is its own


@given(st.floats(0.5, 1000), st.integers(1, 50),
       st.lists(st.floats(0, 0.5), min_size=1, max_size=200))
def test_never_more_than_the_allowance_and_the_rate_over_the_time(per_s, burst, steps):
    """However the attempts are spaced: records taken <= burst + rate x elapsed."""
    shaper = Shaper(per_s, burst)
    now, taken = 0.0, 0
    for dt in steps:
        now += dt
        taken += shaper.take("k", now)
    assert taken <= burst + per_s * now + 1e-6


@given(st.floats(0.5, 1000), st.integers(1, 50), st.floats(0, 10))
def test_due_in_is_when_the_next_record_may_go(per_s, burst, after):
    """Spent to the last record, a key is ready again exactly due_in later."""
    shaper = Shaper(per_s, burst)
    while shaper.take("k", after):
        pass
    wait = shaper.due_in("k", after)
    assert wait > 0
    assert not shaper.ready("k", after + wait * 0.99)
    assert shaper.ready("k", after + wait * 1.0001)


def test_prune_drops_only_the_buckets_that_refilled():
    shaper = Shaper(10.0, 2)
    shaper.take("a", 0.0)
    shaper.take("b", 0.0)
    shaper.take("b", 0.15)
    assert shaper.prune(0.2) == 1  # a refilled at 0.1; b holds 1.5 at 0.2
    assert len(shaper) == 1


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="records/s"):
        Shaper(0, 10)
    with pytest.raises(ValueError, match="burst"):
        Shaper(10, 0)


def test_a_shaped_burst_waits_and_the_quiet_org_on_its_partition_does_not():
    """Past its allowance the burst is passed over; the quiet org's records all go now."""
    ahead = ReadAhead()
    ahead.add(0, [*_records("bulk", 1000), *_records("quiet", 3)])
    shaper = Shaper(100.0, 5)
    step = [rec.value for _, rec, _ in ahead.take(100, shaper=shaper, now=0.0)]
    assert step == ["bulk-0", "quiet-0", "bulk-1", "quiet-1", "bulk-2", "quiet-2", "bulk-3",
                    "bulk-4"]
    assert ahead.take(100, shaper=shaper, now=0.0) == []
    assert ahead.due_in(shaper, 0.0) == pytest.approx(0.01)
    # 0.05 s later: five more of the burst, in order.
    assert [rec.value for _, rec, _ in ahead.take(100, shaper=shaper, now=0.05)] == [
        f"bulk-{i}" for i in range(5, 10)]
    assert len(ahead) == 990


def test_unkeyed_records_are_not_shaped_and_nothing_held_is_due_at_none():
    ahead = ReadAhead()
    shaper = Shaper(1.0, 1)
    assert ahead.due_in(shaper, 0.0) is None
    ahead.add(0, _records("-", 4))
    assert len(ahead.take(10, shaper=shaper, now=0.0)) == 4


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("abc-"), st.integers(0, 30)),
                max_size=10), st.integers(1, 40), st.integers(1, 5))
def test_shaped_every_record_once_and_each_group_in_order(adds, step, burst):
    """Shaping delays, never loses or reorders: drained as time passes, each record once."""
    ahead = ReadAhead()
    shaper = Shaper(50.0, burst)
    added, out = [], []
    counters: dict[tuple[int, str], int] = {}
    for partition, org, n in adds:
        start = counters.get((partition, org), 0)
        recs = [Rec(None if org == "-" else org.encode(), (partition, org, i))
                for i in range(start, start + n)]
        counters[(partition, org)] = start + n
        ahead.add(partition, recs)
        added += [(partition, r) for r in recs]
    now = 0.0
    for _ in range(10_000):
        if not len(ahead):
            break
        got = ahead.take(step, shaper=shaper, now=now)
        out += [(p, r) for p, r, _ in got]
        now += ahead.due_in(shaper, now) or 0.0
    assert sorted(out, key=repr) == sorted(added, key=repr)
    for group in counters:
        mine = [r.value[2] for p, r in out if (p, r.value[1]) == group]
        assert mine == sorted(mine)

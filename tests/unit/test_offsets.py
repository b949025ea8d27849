"""OffsetTracker: commit only up to the oldest held offset."""

from hypothesis import given
from hypothesis import strategies as st

from plumbing.offsets import OffsetTracker

TP = ("t", 0)


def test_nothing_consumed_has_no_committable_offset():
    """A partition never read has nothing to commit."""
    assert OffsetTracker().committable(TP) is None


def test_committable_is_oldest_held_then_next():
    """Held offsets pin the commit; releasing them out of order moves it only past the oldest."""
    t = OffsetTracker()
    for off in range(5):
        t.hold(TP, off)
    t.consumed(TP, 5)  # an invalid record: read, not held
    assert t.committable(TP) == 0
    t.release(TP, 2)
    t.release(TP, 0)
    assert t.committable(TP) == 1
    t.release(TP, 1)
    assert t.committable(TP) == 3
    t.release(TP, 3)
    t.release(TP, 4)
    assert t.committable(TP) == 6


def test_to_commit_reports_only_moves():
    """An offset acknowledged once is not offered again until it moves."""
    t = OffsetTracker()
    t.consumed(TP, 0)
    assert t.to_commit() == {TP: 1}
    t.committed({TP: 1})
    assert t.to_commit() == {}
    t.hold(TP, 1)
    assert t.to_commit() == {}
    t.release(TP, 1)
    assert t.to_commit() == {TP: 2}


def test_forget_drops_partition():
    """A revoked partition has nothing to commit here any more."""
    t = OffsetTracker()
    t.hold(TP, 3)
    t.forget(TP)
    assert t.committable(TP) is None and t.to_commit() == {}


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=200))
def test_matches_naive_model(ops):
    """Against a set: committable == min(held) or max(consumed) + 1."""
    t = OffsetTracker()
    held: set[int] = set()
    top = None
    nxt = 0
    for is_hold, k in ops:
        if is_hold:
            off = nxt
            nxt += 1
            t.hold(TP, off)
            held.add(off)
            top = off
        elif held:
            off = sorted(held)[k % len(held)]
            held.discard(off)
            t.release(TP, off)
        want = min(held) if held else (None if top is None else top + 1)
        assert t.committable(TP) == want

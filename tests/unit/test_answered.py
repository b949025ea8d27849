"""A worker's memory of answered request ids: the window and the bound."""

from __future__ import annotations

import pytest

from worker.answered import AnsweredIds


def test_an_answered_id_is_known_within_the_window_only():
    """Seen until window_s after it was answered, not after."""
    a = AnsweredIds(10.0, 100)
    a.add(["r1"], 0.0)
    assert a.seen("r1", 10.0)
    assert not a.seen("r1", 10.01)
    assert not a.seen("r2", 1.0)


def test_the_oldest_ids_go_first_past_the_bound():
    """At most max_ids are kept; the oldest answered is dropped first."""
    a = AnsweredIds(100.0, 2)
    a.add(["r1", "r2"], 0.0)
    a.add(["r3"], 1.0)
    assert len(a) == 2 and not a.seen("r1", 1.0) and a.seen("r3", 1.0)


def test_a_zero_window_remembers_nothing():
    """answered_window_s = 0 turns the check off."""
    a = AnsweredIds(0.0, 100)
    a.add(["r1"], 0.0)
    assert not a.seen("r1", 0.0) and len(a) == 0


def test_negative_limits_are_refused():
    """A negative window or bound is a clear error."""
    with pytest.raises(ValueError, match="must be >= 0"):
        AnsweredIds(-1, 10)

"""When a worker returns a batch's credit: a round trip before its last call ends, or at once."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.credit_return import FACTOR, MARGIN_S, release_delay_s, release_step


def test_the_lead_is_one_round_trip_and_5_ms():
    """The defaults the docs and benches report; the examples below are worked with them."""
    assert (FACTOR, MARGIN_S) == (1.0, 0.005)


def test_a_long_last_call_returns_its_credit_a_lead_before_its_end():
    """150 ms call, 20 ms round trip: lead 20 + 5 = 25 ms, so credit at 125 ms."""
    assert release_delay_s(0.150, 20.0) == pytest.approx(0.125)


def test_a_call_the_lead_covers_returns_its_credit_at_once():
    """A GPU batch of 15 ms against a 10 ms round trip: at the call's start, as before."""
    assert release_delay_s(0.015, 10.0) == 0.0


@pytest.mark.parametrize("expect_s, round_trip_ms", [
    (None, 20.0), (0.150, None), (0.0, 20.0), (-1.0, 20.0), (0.150, -5.0),
    (0.150, math.inf), (math.nan, 20.0), (0.150, math.nan),
])
def test_an_unknown_or_impossible_figure_returns_the_credit_at_once(expect_s, round_trip_ms):
    """No estimate, no wait: nothing is held back on a guess."""
    assert release_delay_s(expect_s, round_trip_ms) == 0.0


def test_a_delay_too_short_for_a_timer_is_no_delay():
    """A few ms is not worth a timer: the credit goes at once."""
    assert release_delay_s(0.029, 20.0) == 0.0  # 4 ms
    assert release_delay_s(0.031, 20.0) == pytest.approx(0.006)


@given(expect_s=st.floats(min_value=0, max_value=10, allow_nan=False),
       round_trip_ms=st.floats(min_value=0, max_value=10_000, allow_nan=False))
def test_the_credit_goes_back_before_the_call_ends_with_the_lead_to_spare(expect_s, round_trip_ms):
    """Never after the call's expected end less the lead; never before its start."""
    delay = release_delay_s(expect_s, round_trip_ms)
    assert delay >= 0
    assert delay == 0 or delay <= expect_s - (FACTOR * round_trip_ms / 1000 + MARGIN_S) + 1e-9


def test_a_gpu_batch_of_two_short_calls_is_due_at_its_first():
    """Two 9 ms calls against a lead of 8 + 5 = 13 ms: the second alone would leave
    the next batch 9 ms to cover an 8 ms round trip, so the credit is due at the first."""
    assert release_step([0.009, 0.009], 8.0) == (0, pytest.approx(0.009))


def test_a_cpu_batch_of_long_calls_is_due_at_its_last():
    """Four 75 ms calls against a lead of 25 ms: at the last, with nothing after it."""
    assert release_step([0.075] * 4, 20.0) == (3, 0.0)


def test_due_at_the_first_call_after_which_less_than_the_lead_is_left():
    """Lead 25 ms: after call 1, 10 + 10 = 20 ms are left; after call 0, 30 ms."""
    assert release_step([0.010, 0.010, 0.010, 0.010], 20.0) == (1, pytest.approx(0.020))


@pytest.mark.parametrize("expects, round_trip_ms", [
    ([0.009, 0.009], None), ([0.009, 0.009], math.nan), ([0.009, None], 8.0),
    ([0.009, math.nan], 8.0), ([0.009, -0.001], 8.0),
])
def test_an_unknown_figure_leaves_the_credit_at_the_last_call(expects, round_trip_ms):
    """No estimate of what is left: the credit is due where it always was."""
    assert release_step(expects, round_trip_ms) == (1, 0.0)


def test_only_the_calls_after_the_due_one_need_an_estimate():
    """Call 0's time is not known: the credit can still be due at it, not before call 1."""
    assert release_step([None, 0.009, 0.009], 15.0) == (0, pytest.approx(0.018))
    assert release_step([0.009, None, 0.009, 0.009], 15.0) == (1, pytest.approx(0.018))


def test_a_batch_of_no_calls_is_due_at_none_past_its_end():
    assert release_step([], 8.0) == (0, 0.0)


@given(expects=st.lists(st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
                        min_size=1, max_size=12),
       round_trip_ms=st.floats(min_value=0, max_value=1_000, allow_nan=False))
def test_the_calls_after_the_due_one_take_less_than_the_lead_and_one_more_would_not(
        expects, round_trip_ms):
    """The lead covers what is left after the due call, and no earlier call qualifies."""
    due, after = release_step(expects, round_trip_ms)
    lead = FACTOR * round_trip_ms / 1000 + MARGIN_S
    assert 0 <= due <= len(expects) - 1
    assert after == pytest.approx(sum(expects[due + 1:]))
    assert after < lead
    if due > 0:
        e = expects[due]
        assert e is None or after + e >= lead

"""When a worker returns a batch's credit: a round trip before its last call ends, or at once."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.credit_return import release_delay_s


def test_a_long_last_call_returns_its_credit_a_lead_before_its_end():
    """150 ms call, 20 ms round trip: lead 1.5 x 20 + 10 = 40 ms, so credit at 110 ms."""
    assert release_delay_s(0.150, 20.0) == pytest.approx(0.110)


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
    assert release_delay_s(0.044, 20.0) == 0.0  # 4 ms
    assert release_delay_s(0.046, 20.0) == pytest.approx(0.006)


@given(expect_s=st.floats(min_value=0, max_value=10, allow_nan=False),
       round_trip_ms=st.floats(min_value=0, max_value=10_000, allow_nan=False))
def test_the_credit_goes_back_before_the_call_ends_with_the_lead_to_spare(expect_s, round_trip_ms):
    """Never after the call's expected end less the lead; never before its start."""
    delay = release_delay_s(expect_s, round_trip_ms)
    assert delay >= 0
    assert delay == 0 or delay <= expect_s - (1.5 * round_trip_ms / 1000 + 0.010) + 1e-9

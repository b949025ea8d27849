"""traffic.percentile: one definition, nearest rank, for every figure printed."""

from __future__ import annotations

import math

from traffic import stages
from traffic.percentile import percentile


def test_nearest_rank_is_a_value_measured():
    """The q-th percentile is the value of rank ceil(q/100 * n), never a mix of two."""
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]  # unsorted on purpose
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 99) == 5.0
    assert percentile(xs, 100) == 5.0
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 20) == 1.0  # exactly 1 of 5: rank 1
    assert percentile(xs, 21) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_an_exact_rank_is_not_rounded_to_even():
    """q/100 * n whole: that rank, never the next (Python's round(5.5) is 6, round(4.5) 4)."""
    ten = [float(i) for i in range(1, 11)]
    assert percentile(ten, 50) == 5.0
    assert percentile(ten, 30) == 3.0
    hundred = [float(i) for i in range(1, 101)]
    assert percentile(hundred, 99) == 99.0
    assert percentile(hundred, 97) == 97.0


def test_a_miss_is_infinite_and_stays_so():
    """An infinite latency at the rank is the figure; beyond it, it is not (no nan either)."""
    xs = [1.0] * 98 + [math.inf, math.inf]
    assert percentile(xs, 99) == math.inf
    assert percentile(xs, 98) == 1.0
    assert percentile(xs, 100) == math.inf


def test_the_stages_use_the_same_helper():
    """traffic.stages' percentile_ms is the one helper, not a second definition."""
    assert stages.percentile_ms is percentile

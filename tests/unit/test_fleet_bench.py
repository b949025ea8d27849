"""``bench/fleet.py``'s figures from a stub GPU's calls: busy time and the waits between.

``busy`` is the bench's answer (how many GPUs one scheduler feeds) and the
waits say where the rest went; both come from each stub GPU's list of
(start, end) calls, clipped to the measured window.
"""

from __future__ import annotations

import math

from bench.fleet import _Gpu

CALLS = [(0.0, 1.0), (1.5, 2.0), (2.0, 3.0), (3.25, 4.0)]


def gpu() -> _Gpu:
    g = _Gpu("gpu-0", [0])
    g.calls = list(CALLS)
    return g


def test_busy_counts_the_calls_within_the_window():
    g = gpu()
    assert math.isclose(g.busy_s(0.0, 4.0), 3.25)
    assert math.isclose(g.busy_s(0.5, 3.5), 0.5 + 0.5 + 1.0 + 0.25)
    assert g.busy_s(4.0, 5.0) == 0.0


def test_the_waits_are_the_idle_time_busy_leaves():
    """Waits after ``since``, a wait that straddles it counted from it; with busy they
    fill the window from the first call to the last."""
    g = gpu()
    assert [round(d, 6) for d in g.gaps(0.0)] == [0.5, 0.25]
    assert [round(d, 6) for d in g.gaps(1.2)] == [0.3, 0.25]
    assert [round(d, 6) for d in g.gaps(3.1)] == [0.15]
    for since in (0.0, 1.2, 3.1):
        assert math.isclose(g.busy_s(since, 4.0) + sum(g.gaps(since)), 4.0 - since)

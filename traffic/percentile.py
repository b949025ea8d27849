"""The one percentile every report, bench and the demo print: nearest rank.

The ``q``-th percentile of ``n`` values is the smallest value that at least
``q`` per cent of them are at or below: the value of rank ``ceil(q / 100 * n)``
in ascending order (rank 1 for ``q = 0``). It is always one of the values
measured, never a mix of two: a request that never came back counts as an
infinite latency, and a p99 that reaches one is infinite, not a number
between it and the last request that did.

Figures of the report, the replay and the simulator were interpolated
linearly before (commit history): each such figure is now one of the two
values it was interpolated between.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (``q`` in 0..100) of ``values`` by nearest rank; None for none.

    ``values`` need not be sorted. ``q = 50`` of ``[1, 2, 3, 4]`` is 2;
    ``q = 99`` of 100 values is the 99th smallest; ``q = 100`` is the largest.
    """
    ordered = sorted(values)
    if not ordered:
        return None
    rank = math.ceil(q * len(ordered) / 100)
    return ordered[min(max(rank, 1), len(ordered)) - 1]

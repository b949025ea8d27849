"""Many observations of one histogram child in one step.

``Histogram.observe`` scans its buckets in Python and takes a lock twice per
value: on the paths that time every request of a batch (the scheduler's
queue wait, the worker's latency) it was ~0.85 us a request, a few percent
of a service's CPU. :func:`observe_all` counts a batch's values per bucket
first (a binary search each) and adds each bucket's count once.

It writes to the child's bucket and sum values, the attributes
``observe`` itself writes (prometheus-client 0.26); a child without them
(another client version) is observed value by value, as before.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from math import isnan
from typing import Any

__all__ = ["observe_all"]


def observe_all(child: Any, values: Iterable[float]) -> None:
    """``child.observe(v)`` for each of ``values``: the same buckets, count and sum."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            child.observe(v)
        return
    counts = [0] * len(bounds)
    added = 0.0
    for v in values:
        # The first bound >= v: observe's "v <= bound" (the last bound is +Inf).
        # A NaN falls in no bucket there; here it is left out of the buckets alike.
        if not isnan(v):
            counts[bisect_left(bounds, v)] += 1
        added += v
    child._raise_if_not_observable()
    total.inc(added)
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)

"""Metric children resolved once per label set, not once per event.

``Counter.labels(a, b)`` validates its arguments and takes a lock on every
call; on a path that counts every request that was a visible share of a
service's CPU time. Label sets here are bounded by the configuration (see
each service's metrics module), so a plain dictionary of children is a
bounded cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["cached_labels"]


def cached_labels(metric: Any) -> Callable[..., Any]:
    """``metric.labels`` memoised per tuple of label values."""
    children: dict[tuple[str, ...], Any] = {}

    def child(*values: str) -> Any:
        c = children.get(values)
        if c is None:
            c = children[values] = metric.labels(*values)
        return c

    return child

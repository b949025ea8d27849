"""The scheduler's record of one held request."""

from __future__ import annotations

from typing import Any

__all__ = ["DISPATCHED", "EXPIRED", "HELD", "NO_DEADLINE", "REMOVED", "Entry"]

#: REMOVED: taken back by the service (its partition moved to another owner).
HELD, DISPATCHED, EXPIRED, REMOVED = 0, 1, 2, 3
#: Sort key of a request without a deadline: after every real deadline.
NO_DEADLINE = float("inf")


class Entry:
    """One held request: what the core needs to order, cost and batch it.

    Fixed at creation: everything but ``state`` and ``endpoint``. ``state`` is
    changed by the core alone (held -> dispatched, expired or removed, exactly
    once); ``endpoint`` is the lane the core holds it on (set by its push). ``payload`` is
    opaque to the core: the service keeps its :class:`AdmittedRequest` there,
    the simulator its trace record.

    ``deadline`` and ``arrival`` are on the caller's clock, the same clock as
    every ``now`` passed to the core (seconds).
    """

    __slots__ = (
        "arrival",
        "deadline",
        "endpoint",
        "id",
        "org",
        "payload",
        "priority",
        "seq",
        "state",
        "tier",
        "tokens",
    )

    def __init__(self, id: str, org: str, tier: str, tokens: int, *, priority: int = 0,
                 deadline: float | None = None, arrival: float = 0.0, payload: Any = None):
        self.id = id
        self.org = org
        self.tier = tier
        self.tokens = tokens
        self.priority = priority
        self.deadline = NO_DEADLINE if deadline is None else deadline
        self.arrival = arrival
        self.seq = 0  # set by the lane: arrival order, the final tie-breaker
        self.payload = payload
        self.state = HELD
        self.endpoint = ""  # set by the core when it holds the entry

    def __repr__(self) -> str:
        return (f"Entry({self.id!r}, org={self.org!r}, tier={self.tier!r}, tokens={self.tokens}, "
                f"priority={self.priority}, deadline={self.deadline})")

"""The scheduler's record of one held request."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["DISPATCHED", "EXPIRED", "HELD", "NO_DEADLINE", "REMOVED", "Entry"]

#: REMOVED: taken back by the service (its partition moved to another owner).
HELD, DISPATCHED, EXPIRED, REMOVED = 0, 1, 2, 3
#: Sort key of a request without a deadline: after every real deadline.
NO_DEADLINE = float("inf")


class Entry(msgspec.Struct, gc=False, eq=False):
    """One held request: what the core needs to order, cost and batch it.

    Fixed at creation: everything but ``state``, ``seq`` and ``endpoint``.
    ``state`` is changed by the core alone (held -> dispatched, expired or
    removed, exactly once); ``endpoint`` is the lane the core holds it on (set
    by its push); ``seq`` its arrival order there, the final tie-breaker (set
    by the lane). ``payload`` is opaque to the core: the service keeps its
    :class:`AdmittedRequest` there, the simulator its trace record.

    ``deadline`` and ``arrival`` are on the caller's clock, the same clock as
    every ``now`` passed to the core (seconds); no deadline is
    :data:`NO_DEADLINE` (``None`` is taken for it too, as it always was).

    Not tracked by the cyclic garbage collector (``gc=False``; equal only to
    itself, hashed by identity, as a plain object): a scheduler holds up to
    ``max_held_requests`` of these, and every collection of the oldest
    generation walked each of them and the tuples that place it in the
    lane's heaps, which are untracked too once they hold nothing tracked.
    ``bench/fleet.py`` measured the pauses that made: 30-93 ms, every GPU of
    the fleet idle meanwhile (``docs/benchmarks.md``). Safe because an
    Entry is never part of a reference cycle: nothing it holds refers back
    to it (its payload is a request or a trace record).
    """

    id: str
    org: str
    tier: str
    tokens: int
    priority: int = 0
    deadline: float = NO_DEADLINE
    arrival: float = 0.0
    payload: Any = None
    seq: int = 0
    state: int = HELD
    endpoint: str = ""

    def __post_init__(self) -> None:
        if self.deadline is None:  # the untyped callers' form of no deadline
            self.deadline = NO_DEADLINE

    def __repr__(self) -> str:
        return (f"Entry({self.id!r}, org={self.org!r}, tier={self.tier!r}, tokens={self.tokens}, "
                f"priority={self.priority}, deadline={self.deadline})")

"""A clock that moves only when told (kubernetes' ``eventclock.Fake``, minus the waiting).

The scheduler core never reads time: every call takes ``now``. Tests keep
one of these and pass ``clock.now``, so a deadline passes exactly when the
test says it does, and never because the machine was slow.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """Seconds on a private timeline; ``now`` changes only through :meth:`advance`."""

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    @property
    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never back) and return the new time."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self._now += seconds
        return self._now

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now})"

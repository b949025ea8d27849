"""Admission's shaping: one org's records decided no faster than a set rate; the rest wait.

Why. Admission decides a burst as fast as the broker hands it over, and
the scheduler takes it in as fast as admission writes it: thousands of
records relayed in a second or two, long before a worker can serve them.
Where the broker and the services share a few cores, those seconds of
full CPU are where every other org's records wait in the Kafka hops:
``bench/isolation.py`` found 27 of 33 quiet requests over their bound sent
in a burst's first second (``docs/benchmarks.md``). Shaping spreads that
work over the burst's service time instead: an org's records beyond its
allowance stay in admission's read-ahead (:mod:`producer.readahead`) and
are decided at the set rate. The throttle *polices* (refuses what could
not be served in time); this *shapes* (delays what would be served later
anyway).

What it costs, so it is off unless set (``AdmissionSettings.shape_org_per_s``):

* the rate caps what one org gets through one admission instance: set it
  above what the fleet can serve for one org, or it becomes that org's
  throughput;
* an org's records keep their order, so its request to another endpoint
  waits behind its own shaped backlog;
* records waiting here are not committed (offsets are committed in log
  order), so an admission crash replays more of the partition (the
  scheduler drops an id it still holds, the client a result it already
  handed over);
* a FIFO scheduler (the baseline the demo compares with) sees the burst
  already spread.

Shaping stops while the read-ahead is half full, so a burst larger than it
can hold is decided at full speed again instead of blocking the fetches
every other org's records wait for.

Pure: no clock (times are seconds passed in), no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["Shaper"]

#: A record's worth of allowance, less float rounding: a bucket refilled for
#: exactly :meth:`Shaper.due_in` seconds must be ready, or a loop waiting that
#: long would find it short by 1e-16 and wait again for nothing.
_ONE = 1.0 - 1e-9


class Shaper:
    """A token bucket per key: ``burst`` records at once, then ``per_s`` a second.

    A key never seen, or idle long enough, has a full bucket. Buckets that
    have refilled are dropped when :meth:`prune` runs, so memory follows
    the keys active in the last ``burst / per_s`` seconds.
    """

    def __init__(self, per_s: float, burst: int):
        if not per_s > 0:
            raise ValueError(f"shaping rate must be > 0 records/s, not {per_s!r}")
        if burst < 1:
            raise ValueError(f"shaping burst must be >= 1 record, not {burst!r}")
        self.per_s = float(per_s)
        self.burst = float(burst)
        #: key -> (tokens, when they were counted)
        self._buckets: dict[Hashable, tuple[float, float]] = {}

    def _tokens(self, key: Hashable, now: float) -> float:
        got = self._buckets.get(key)
        if got is None:
            return self.burst
        tokens, at = got
        return min(self.burst, tokens + max(0.0, now - at) * self.per_s)

    def ready(self, key: Hashable, now: float) -> bool:
        """Whether ``key`` may have a record decided at ``now``."""
        return self._tokens(key, now) >= _ONE

    def take(self, key: Hashable, now: float) -> bool:
        """Spend one record of ``key``'s allowance; False (nothing spent) if it has none."""
        tokens = self._tokens(key, now)
        if tokens < _ONE:
            return False
        self._buckets[key] = (max(0.0, tokens - 1.0), now)
        return True

    def due_in(self, key: Hashable, now: float) -> float:
        """Seconds until ``key`` may have a record decided (0: now)."""
        tokens = self._tokens(key, now)
        return 0.0 if tokens >= _ONE else (1.0 - tokens) / self.per_s

    def prune(self, now: float) -> int:
        """Drop the buckets that have refilled (they equal an unseen key's); how many."""
        full = [k for k in self._buckets if self._tokens(k, now) >= self.burst]
        for k in full:
            del self._buckets[k]
        return len(full)

    def __len__(self) -> int:
        return len(self._buckets)

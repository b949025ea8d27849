"""Rate limits per org and endpoint, over several windows, in requests and tokens.

Pure: no I/O, no clock of its own (every call takes ``now_ms``), no logging.

The algorithm
-------------

Each limit ``L units per W`` (a :class:`schemas.config.Window` gives a
request limit, a token limit, or both) is a GCRA cell, written in its meter
form: a bucket holds the units *used* and drains at ``L / W`` units per
millisecond. A request of cost ``n`` (1 for a request limit, its token count
for a token limit) fits when ``used(now) + n <= L``. This is exactly GCRA's
"theoretical arrival time" test (``TAT - now`` is ``used / rate``), so a full
window of ``L`` may arrive in one burst and the long-run rate is ``L / W``;
the meter form is kept because it survives a limit change on reload (the
units used stay, the drain rate changes) where a TAT would need rescaling.

Several windows apply at once (say 600 per minute *and* 10,000 per day). A
request is admitted only when every window allows it, and only then is every
window charged: a refused request costs nothing, so a client that backs off
as told is not punished for asking. ``retry_after_ms`` is the earliest
moment all windows allow it: buckets only drain with time, so each window's
own wait is a threshold and the answer is the largest of them. A request
that no window could ever hold (cost above ``L``; a limit of 0) is refused
with ``retry_after_ms = None``: retrying cannot help.

Memory
------

State exists only for (org, endpoint) keys that were charged, and only while
some bucket of the key is not empty: an empty bucket is the same as no
state. :meth:`RateLimiter.sweep` (run by the limiter itself every
``sweep_interval_ms`` of the clock) drops keys whose buckets have all
drained, so memory follows the orgs active in the last window, not every org
ever seen. Unknown orgs never reach the limiter (admission refuses them
first), so keys are also bounded by the registry.

Reload
------

:meth:`RateLimiter.update` installs a new configuration. A bucket is kept
when its window still exists for that org and endpoint, identified by its
length and unit (``60 s, tokens``), whatever its new limit; buckets of
windows, orgs or endpoints that are gone are dropped.

Who owns what: the limiter is owned by one admission instance, which sees
every request of the orgs whose ingress partitions it holds (requests are
keyed by org), so per-instance state is the whole truth for those orgs.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from schemas.config import Config, Window

__all__ = ["Decision", "RateLimiter", "Unit", "WindowKey"]

Unit = Literal["requests", "tokens"]
#: A window's identity across reloads: its length in seconds and its unit.
WindowKey = tuple[float, Unit]


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The limiter's answer for one request: a value, never an exception.

    When refused, ``window_s``, ``unit`` and ``limit`` name the window that
    is furthest from allowing it (the one ``retry_after_ms`` waits for), so
    the refusal message can say which limit was hit.
    """

    allowed: bool
    #: Milliseconds until every window allows this request; None when allowed
    #: or when no amount of waiting helps.
    retry_after_ms: int | None = None
    window_s: float | None = None
    unit: Unit | None = None
    limit: int | None = None
    #: True when the request's cost exceeds a window's whole limit.
    never: bool = False


ALLOWED = Decision(allowed=True)


class _Bucket:
    """Units used in one window, as of ``at_ms``; drains at ``rate_per_ms``."""

    __slots__ = ("at_ms", "used")

    def __init__(self) -> None:
        self.used = 0.0
        self.at_ms = 0.0

    def level(self, now_ms: float, rate_per_ms: float) -> float:
        # A clock that steps back must not refill or overfill a bucket.
        elapsed = max(0.0, now_ms - self.at_ms)
        return max(0.0, self.used - elapsed * rate_per_ms)


def _cells(windows: list[Window]) -> list[tuple[WindowKey, int, float]]:
    """(key, limit, drain rate per ms) for every limit of ``windows``.

    Two windows with the same length and unit would share a key; the tighter
    one is what binds, so only it is kept.
    """
    cells: dict[WindowKey, int] = {}
    for w in windows:
        given: tuple[tuple[Unit, int | None], ...] = (("requests", w.requests), ("tokens", w.tokens))
        for unit, limit in given:
            if limit is None:
                continue
            key = (float(w.window_s), unit)
            cells[key] = min(limit, cells.get(key, limit))
    return [(key, limit, limit / (key[0] * 1000.0)) for key, limit in cells.items()]


class RateLimiter:
    """GCRA limits per (org, endpoint, window), in requests and tokens.

    ``config`` is replaced only through :meth:`update`. The per-key bucket
    tables are private and mutated only by :meth:`acquire` and
    :meth:`sweep`.
    """

    def __init__(self, config: Config, *, sweep_interval_ms: float = 10_000.0):
        self.config = config
        #: How often, in clock milliseconds, drained keys are dropped.
        self.sweep_interval_ms = sweep_interval_ms
        self._state: dict[tuple[str, str], dict[WindowKey, _Bucket]] = {}
        self._cells: dict[tuple[str, str], list[tuple[WindowKey, int, float]]] = {}
        self._next_sweep_ms: float | None = None

    # -- queries ---------------------------------------------------------

    def check(self, org: str, endpoint: str, tokens: int, now_ms: float) -> Decision:
        """Would a request of ``tokens`` tokens be allowed now? Charges nothing.

        ``org`` and ``endpoint`` must exist in the configuration (admission
        checks both before asking).
        """
        cells = self._cells_for(org, endpoint)
        if not cells:
            return ALLOWED
        buckets = self._state.get((org, endpoint), {})
        worst: Decision | None = None
        worst_wait = -1.0
        for key, limit, rate in cells:
            cost = 1 if key[1] == "requests" else tokens
            if cost > limit:
                return Decision(allowed=False, window_s=key[0], unit=key[1], limit=limit, never=True)
            bucket = buckets.get(key)
            used = bucket.level(now_ms, rate) if bucket is not None else 0.0
            excess = used + cost - limit
            if excess <= 1e-9:
                continue
            wait = excess / rate
            if wait > worst_wait:
                worst_wait = wait
                worst = Decision(
                    allowed=False,
                    retry_after_ms=max(1, math.ceil(wait)),
                    window_s=key[0],
                    unit=key[1],
                    limit=limit,
                )
        return worst or ALLOWED

    def acquire(self, org: str, endpoint: str, tokens: int, now_ms: float) -> Decision:
        """Like :meth:`check`, and when allowed, charge every window of the key."""
        self._maybe_sweep(now_ms)
        decision = self.check(org, endpoint, tokens, now_ms)
        if not decision.allowed:
            return decision
        cells = self._cells_for(org, endpoint)
        if not cells:
            return decision
        buckets = self._state.setdefault((org, endpoint), {})
        for key, _limit, rate in cells:
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = _Bucket()
            cost = 1 if key[1] == "requests" else tokens
            bucket.used = bucket.level(now_ms, rate) + cost
            bucket.at_ms = max(bucket.at_ms, now_ms)
        return decision

    @property
    def keys(self) -> int:
        """(org, endpoint) pairs holding state: what the memory bound is about."""
        return len(self._state)

    # -- maintenance -----------------------------------------------------

    def sweep(self, now_ms: float) -> int:
        """Drop keys whose every bucket has drained; returns how many were dropped."""
        dropped = 0
        for pair in list(self._state):
            cells = {key: rate for key, _limit, rate in self._cells_for(*pair)}
            buckets = self._state[pair]
            for key in [k for k, b in buckets.items() if k not in cells
                        or b.level(now_ms, cells[k]) <= 0.0]:
                del buckets[key]
            if not buckets:
                del self._state[pair]
                dropped += 1
        self._next_sweep_ms = now_ms + self.sweep_interval_ms
        return dropped

    def update(self, config: Config) -> None:
        """Install a new configuration, keeping buckets whose window still exists."""
        self.config = config
        self._cells.clear()
        for pair in list(self._state):
            org, endpoint = pair
            if org not in config.orgs or endpoint not in config.endpoints:
                del self._state[pair]
                continue
            keep = {key for key, _limit, _rate in self._cells_for(org, endpoint)}
            buckets = self._state[pair]
            for key in [k for k in buckets if k not in keep]:
                del buckets[key]
            if not buckets:
                del self._state[pair]

    def _maybe_sweep(self, now_ms: float) -> None:
        if self._next_sweep_ms is None:
            self._next_sweep_ms = now_ms + self.sweep_interval_ms
        elif now_ms >= self._next_sweep_ms:
            self.sweep(now_ms)

    def _cells_for(self, org: str, endpoint: str) -> list[tuple[WindowKey, int, float]]:
        pair = (org, endpoint)
        cells = self._cells.get(pair)
        if cells is None:
            if org not in self.config.orgs or endpoint not in self.config.endpoints:
                return []
            cells = self._cells[pair] = _cells(self.config.windows_for(org, endpoint))
        return cells

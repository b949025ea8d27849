"""Cost models: what one request costs against an org's DRR deficit.

* ``requests``: every request costs 1; the quantum counts requests.
* ``tokens``: a request costs its token count; the quantum is a token budget.
* ``adaptive``: tokens times the org's measured serving cost per token,
  relative to the endpoint's. Workers report how long each request took;
  both the org's and the endpoint's seconds-per-token are exponential moving
  averages of those reports. An org whose requests are costlier per token
  (longer sequences, heavier padding) is charged more, in token-equivalents,
  so the quantum keeps its meaning. The ratio is clamped (see
  ``ADAPTIVE_RATIO_BOUNDS``) so the largest cost stays known and every DRR
  turn can still fit any request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeGuard

from scheduler.entry import Entry
from schemas.config import ADAPTIVE_RATIO_BOUNDS, CostModel

__all__ = ["AdaptiveCost", "Cost", "RequestCost", "TokenCost", "make_cost"]


class Cost(Protocol):
    def cost(self, e: Entry) -> float: ...

    def observe(self, samples: Iterable[tuple[str, int, float]]) -> None:
        """Feed back measured ``(org, tokens, seconds)`` of served requests."""


class RequestCost:
    def cost(self, e: Entry) -> float:
        return 1.0

    def observe(self, samples: Iterable[tuple[str, int, float]]) -> None:
        pass


class TokenCost:
    def cost(self, e: Entry) -> float:
        return float(e.tokens)

    def observe(self, samples: Iterable[tuple[str, int, float]]) -> None:
        pass


class AdaptiveCost:
    """Tokens times the org's EMA of seconds per token over the endpoint's EMA."""

    def __init__(self, alpha: float = 0.2, bounds: tuple[float, float] = ADAPTIVE_RATIO_BOUNDS):
        self.alpha = alpha
        self.lo, self.hi = bounds
        self.lane_spt: float | None = None
        self.org_spt: dict[str, float] = {}

    def ratio(self, org: str) -> float:
        o = self.org_spt.get(org)
        if o is None or not self.lane_spt:
            return 1.0
        return min(self.hi, max(self.lo, o / self.lane_spt))

    def cost(self, e: Entry) -> float:
        return e.tokens * self.ratio(e.org)

    def state(self) -> tuple[float | None, dict[str, float]]:
        """What was measured: the endpoint's and each org's seconds per token (a copy)."""
        return self.lane_spt, dict(self.org_spt)

    def restore(self, lane_spt: float | None, org_spt: dict[str, float]) -> None:
        """Continue from measurements taken elsewhere (a previous leader's :meth:`state`).

        Values that are not finite and positive are dropped, as a broken
        report would be: they must not poison the averages.
        """
        def ok(x: object) -> TypeGuard[float]:
            return isinstance(x, (int, float)) and 0.0 < x < float("inf")

        self.lane_spt = float(lane_spt) if ok(lane_spt) else None
        self.org_spt = {org: float(v) for org, v in org_spt.items() if ok(v)}

    def observe(self, samples: Iterable[tuple[str, int, float]]) -> None:
        a = self.alpha
        for org, tokens, seconds in samples:
            if tokens <= 0 or not (seconds >= 0.0) or seconds == float("inf"):
                continue  # a broken report must not poison the average
            spt = seconds / tokens
            self.lane_spt = spt if self.lane_spt is None else (1 - a) * self.lane_spt + a * spt
            prev = self.org_spt.get(org)
            self.org_spt[org] = spt if prev is None else (1 - a) * prev + a * spt


def make_cost(model: CostModel, alpha: float = 0.2) -> Cost:
    if model == "requests":
        return RequestCost()
    if model == "tokens":
        return TokenCost()
    return AdaptiveCost(alpha)

"""Fairness as it happens: the DRR bound, Jain's index, waits and shares, live.

The core promises (see the package docstring) that two orgs of one tier that
stay backlogged never drift further apart than ``quantum + 2 x max_cost`` in
weight-normalised served cost, and the property tests check it on generated
runs. :class:`FairnessWatch` checks it on the run an operator actually has:
it is told what each batch served (the cost the core charged) and who holds
work, and reports, per endpoint lane and tier, over a sliding window of
``window_s`` seconds:

* **gap**: the largest difference of weight-normalised served cost between
  two orgs that stayed backlogged together, next to the **bound** the core
  guarantees;
* **Jain's index** over backlogged orgs, with the simulator's definition;
* the **longest wait**: the longest time an org with work went without any
  service;
* the tier's **share** of the lane's served cost while it was backlogged,
  next to the **floor** its ``min_share`` guarantees;
* each org's **served** cost (the exporter turns it into shares of
  allow-listed orgs).

Pure: the standard library and ``schemas`` only; time is an argument, never
read. The service feeds it from its dispatch loop and exports the figures
as metrics (:mod:`scheduler.fairness_metrics`); tests feed it from the core
directly.

Definitions
-----------

*Backlogged* is the property tests' notion: an org is backlogged in a tier
while the scheduler holds at least one of its requests there. Its backlog
*period* runs from when the watch first sees it holding work to the moment
it holds none. The caller passes each holding org with a *join serial* that
changes whenever its backlog emptied and refilled
(:meth:`scheduler.snapshot.Backlog.held_serials`), so an emptying between
two observations is never taken for one long backlog: DRR resets an org's
deficit when it empties, and the bound is stated per period.

*Gap* of orgs i and j of one tier, both backlogged since s (the later of the
two starts the watch saw): ``|S_i / w_i - S_j / w_j|``, S the cost served
since s, as the core charged it, w the org's weight. It is measured after
every batch after which both still hold work (one that emptied inside the
batch stopped competing part-way through it); the figure is the largest gap
of any pair reached within the window. A pair's reference point s is fixed
for as long as both stay backlogged, so the figure compares what they got
over their whole common backlog, not since the window's start.

*Bound*: ``quantum + 2 x max_cost / min(1, smallest weight of the tier)``:
the package's bound, where weights below 1 scale the largest request's
normalised cost. It holds for any interval of a common backlog, not only
from a common start: while both stay in the ring their turns alternate, so
their turn grants differ by at most one, and an org's deficit is below
``max_cost`` between its turns and below ``quantum x weight + max_cost``
within one. Under ``fifo`` nothing keeps the gap down: an org behind a burst
falls behind by the whole burst.

*Jain's index* (the simulator's definition, over the window): after each
batch, the orgs of the tier still holding work form a set S; for each
distinct S of two or more orgs, over the window's batches with exactly that
set, ``x_i = served cost / weight`` and J(S) = ``(sum x)^2 / (n sum x^2)``.
The figure is J of the set that was served the most; with no such set it
is 1.0 (no two orgs waited together: nothing was shared unfairly) and
``jain_orgs`` is 0.

*Longest wait*: for each org, the time from the start of its backlog or its
last service (whichever is later) to its next service, to the moment it
left, or to now. The figure is the longest one that ended within the window
or is still running.

*Tier share*: over the window's batches after which the tier still held work,
the tier's served cost over the lane's. A tier with ``min_share`` s is
guaranteed about s of it; its *floor* is ``s - periods x slack / total``,
where ``slack = (tiers with a min_share + sum of min_shares + 1) x
max_cost`` is the property tests' slack plus the credit a period may start
with, counted once per backlog period of the tier in the window (the
credit is dropped when the tier empties, so each period pays it anew).

Limits: a pair's gap is measured at batch boundaries (inside a batch the
core is not observed); a reconfiguration that changes weights or quanta
applies from the next batch, and gaps built up under the old ones are not
re-based; at most :data:`MAX_PAIRED_ORGS` orgs per tier are paired (memory
is quadratic in them), later ones count everywhere else and in ``unpaired``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.config import Config

__all__ = [
    "MAX_PAIRED_ORGS",
    "FairnessWatch",
    "LaneFigures",
    "TierFigures",
    "drr_bound",
    "jain",
    "min_share_slack",
]

#: Orgs of one tier whose pairwise gaps are followed at once (memory grows as its square).
MAX_PAIRED_ORGS = 256

#: tier -> org -> join serial: who holds work on one endpoint.
Held = Mapping[str, Mapping[str, int]]


def jain(xs: Iterable[float]) -> float:
    """Jain's index ``(sum x)^2 / (n sum x^2)``; 1.0 for no values or all zeros."""
    xs = list(xs)
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq else 1.0


def drr_bound(config: Config, endpoint: str, tier: str) -> float:
    """``quantum + 2 x max_cost / min(1, w_min)`` for ``tier``'s orgs on ``endpoint``."""
    ep = config.endpoints[endpoint]
    w_min = min([1.0, *(o.weight for o in config.orgs.values() if o.tier == tier)])
    return ep.quantum + 2.0 * config.max_request_cost(endpoint) / w_min


def min_share_slack(config: Config, endpoint: str) -> float:
    """Cost one backlog period of a min_share tier may fall short of its share by."""
    shares = [t.min_share for t in config.tiers if t.min_share > 0]
    return (len(shares) + sum(shares) + 1) * config.max_request_cost(endpoint)


@dataclass(frozen=True)
class TierFigures:
    """One (endpoint, tier) over the window; costs in the lane's units."""

    endpoint: str
    tier: str
    #: Largest gap of a backlogged pair reached in the window (0: none).
    gap: float
    bound: float
    #: Jain's index of the most-served set of backlogged orgs (1.0 with none).
    jain: float
    #: Orgs in that set (0: no two orgs were backlogged together).
    jain_orgs: int
    #: Orgs holding work now.
    backlogged: int
    longest_wait_s: float
    #: The tier's share of served cost while it was backlogged (None: it never was).
    share: float | None
    #: The share its min_share guarantees over the same batches (None: no min_share).
    share_floor: float | None
    #: Backlogged orgs beyond MAX_PAIRED_ORGS, not in any pair.
    unpaired: int


@dataclass(frozen=True)
class LaneFigures:
    """One endpoint over the window."""

    endpoint: str
    tiers: dict[str, TierFigures]
    #: Served cost per (tier, org) within the window.
    served: dict[tuple[str, str], float]
    #: All served cost of the lane within the window.
    total: float


class _WindowMax:
    """Largest value pushed within the last ``window_s`` (a monotone deque)."""

    __slots__ = ("items", "window_s")

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.items: deque[tuple[float, float]] = deque()

    def push(self, now: float, value: float) -> None:
        items = self.items
        while items and items[-1][1] <= value:
            items.pop()
        items.append((now, value))

    def value(self, now: float) -> float:
        items = self.items
        while items and items[0][0] < now - self.window_s:
            items.popleft()
        return items[0][1] if items else 0.0


class _Org:
    """One org's current backlog period in one tier."""

    __slots__ = ("name", "ref", "serial", "v", "waiting_since", "weight")

    def __init__(self, name: str, serial: int, now: float, weight: float):
        self.name = name
        self.serial = serial
        self.waiting_since = now
        #: Weight-normalised cost served since the period started.
        self.v = 0.0
        self.weight = weight
        #: For each org already backlogged when this one joined: its ``v`` then.
        #: None: this org is beyond MAX_PAIRED_ORGS and in no pair.
        self.ref: dict[str, float] | None = {}


class _TierWatch:
    __slots__ = ("bound", "gaps", "groups", "jain_log", "min_share", "name", "orgs", "periods",
                 "waits")

    def __init__(self, name: str, bound: float, min_share: float, window_s: float):
        self.name = name
        self.bound = bound
        self.min_share = min_share
        self.orgs: dict[str, _Org] = {}
        self.gaps = _WindowMax(window_s)
        self.waits = _WindowMax(window_s)
        #: (time, set of backlogged orgs, served cost per org of the set) per batch
        self.jain_log: deque[tuple[float, frozenset[str], dict[str, float]]] = deque()
        #: set -> [batches, served cost per org]: the running sums of jain_log
        self.groups: dict[frozenset[str], list[Any]] = {}
        #: start times of this tier's backlog periods within the window (any org holding)
        self.periods: deque[float] = deque()

    # -- membership ------------------------------------------------------------

    def join(self, now: float, org: str, serial: int, weight: float) -> None:
        o = _Org(org, serial, now, weight)
        paired = [p for p in self.orgs.values() if p.ref is not None]
        if len(paired) >= MAX_PAIRED_ORGS:
            o.ref = None
        else:
            o.ref = {p.name: p.v for p in paired}
        if not self.orgs:
            self.periods.append(now)
        self.orgs[org] = o

    def leave(self, now: float, org: str) -> None:
        o = self.orgs.pop(org)
        self.waits.push(now, now - o.waiting_since)
        if o.ref is not None:
            for p in self.orgs.values():
                if p.ref is not None:
                    p.ref.pop(org, None)

    def sync(self, now: float, held: Mapping[str, int],
             weight_of: Callable[[str], float]) -> None:
        """Follow who holds work: leave, rejoin (serial changed) or join."""
        for org in [o for o, st in self.orgs.items() if held.get(o) != st.serial]:
            self.leave(now, org)
        for org, serial in held.items():
            if org not in self.orgs:
                self.join(now, org, serial, weight_of(org))

    # -- service ---------------------------------------------------------------

    def serve(self, now: float, costs: Mapping[str, float], after: Mapping[str, int]) -> None:
        """Charge one batch's cost per org (of orgs backlogged before it) and measure gaps.

        ``after``: who still holds work after the batch. A pair counts the
        batch only if both still do: an org that emptied inside the batch
        stopped competing part-way through it, and what its peer got after
        that moment is no unfairness (the core is observed between batches,
        not within one).
        """
        served = [self.orgs[org] for org in costs if org in self.orgs]
        for o in served:
            o.v += costs[o.name] / o.weight
            self.waits.push(now, now - o.waiting_since)
            o.waiting_since = now
        worst = 0.0
        orgs = self.orgs
        for x in served:
            if x.ref is None or after.get(x.name) != x.serial:
                continue
            for y in orgs.values():
                if y is x or y.ref is None or after.get(y.name) != y.serial:
                    continue
                if y.name in x.ref:  # x joined later: the pair starts at x's join
                    ahead = x.v - (y.v - x.ref[y.name])
                elif x.name in y.ref:  # y joined later
                    ahead = (x.v - y.ref[x.name]) - y.v
                else:
                    continue
                worst = max(worst, ahead)
        if served:
            self.gaps.push(now, worst)

    def note_batch(self, now: float, costs: Mapping[str, float]) -> None:
        """After a batch: the set backlogged across it, for Jain's index."""
        if len(self.orgs) < 2:
            return
        key = frozenset(self.orgs)
        got = {org: costs.get(org, 0.0) for org in key}
        self.jain_log.append((now, key, got))
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = [0, dict.fromkeys(key, 0.0)]
        g[0] += 1
        for org, c in got.items():
            g[1][org] += c

    def expire(self, horizon: float) -> None:
        log = self.jain_log
        while log and log[0][0] < horizon:
            _, key, got = log.popleft()
            g = self.groups[key]
            g[0] -= 1
            if g[0] <= 0:
                del self.groups[key]
            else:
                for org, c in got.items():
                    g[1][org] -= c
        periods = self.periods
        while periods and periods[0] < horizon:
            periods.popleft()

    def jain(self, weight_of: Callable[[str], float]) -> tuple[float, int]:
        if not self.groups:
            return 1.0, 0
        key, (_, served) = max(self.groups.items(),
                               key=lambda kv: (sum(kv[1][1].values()), sorted(kv[0])))
        return jain(served[o] / weight_of(o) for o in key), len(key)

    def longest_wait(self, now: float) -> float:
        running = max((now - o.waiting_since for o in self.orgs.values()), default=0.0)
        return max(running, self.waits.value(now))


class _LaneWatch:
    __slots__ = ("endpoint", "log", "org_served", "slack", "tier_cost", "tier_total", "tiers",
                 "total")

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.tiers: dict[str, _TierWatch] = {}
        #: (time, served cost per (tier, org), total, tiers backlogged after the batch)
        self.log: deque[tuple[float, dict[tuple[str, str], float], float, frozenset[str],
                              dict[str, float]]] = deque()
        self.org_served: dict[tuple[str, str], float] = {}
        self.total = 0.0
        #: per tier, over batches after which it held work: its cost, and all cost
        self.tier_cost: dict[str, float] = {}
        self.tier_total: dict[str, float] = {}
        self.slack = 0.0

    def expire(self, horizon: float) -> None:
        log = self.log
        while log and log[0][0] < horizon:
            _, per_org, total, busy, per_tier = log.popleft()
            self.total -= total
            for key, c in per_org.items():
                left = self.org_served[key] - c
                if left <= 1e-9:
                    del self.org_served[key]
                else:
                    self.org_served[key] = left
            for tier in busy:
                self.tier_cost[tier] -= per_tier.get(tier, 0.0)
                self.tier_total[tier] -= total
        for t in self.tiers.values():
            t.expire(horizon)
        if not log:
            self.total = 0.0
            self.org_served.clear()
            self.tier_cost = dict.fromkeys(self.tier_cost, 0.0)
            self.tier_total = dict.fromkeys(self.tier_total, 0.0)


class FairnessWatch:
    """Per endpoint and tier, what the core served and who waited, over a sliding window.

    Call :meth:`held` before the core assembles a batch (and whenever the
    caller likes, e.g. before publishing), :meth:`served` right after it
    with what it charged and who still holds work, and :meth:`figures` to
    read. ``window_s`` and the configuration may change (:meth:`configure`);
    everything else is the watch's own.
    """

    def __init__(self, config: Config, window_s: float = 60.0):
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self.config = config
        self.lanes: dict[str, _LaneWatch] = {}
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Follow a new configuration: weights, bounds and min_shares apply from now on."""
        self.config = config
        for endpoint in config.endpoints:
            lane = self.lanes.get(endpoint) or self.lanes.setdefault(endpoint,
                                                                     _LaneWatch(endpoint))
            lane.slack = min_share_slack(config, endpoint)
            for t in config.tiers:
                tw = lane.tiers.get(t.name)
                bound = drr_bound(config, endpoint, t.name)
                if tw is None:
                    lane.tiers[t.name] = _TierWatch(t.name, bound, t.min_share, self.window_s)
                else:
                    tw.bound, tw.min_share = bound, t.min_share
            for tw in lane.tiers.values():
                for o in tw.orgs.values():
                    o.weight = self._weight(o.name)

    def reset(self) -> None:
        """Forget everything seen (a scheduler that stopped leading)."""
        self.lanes = {}
        self.configure(self.config)

    def _weight(self, org: str) -> float:
        o = self.config.orgs.get(org)
        return o.weight if o is not None else 1.0

    def _lane(self, endpoint: str) -> _LaneWatch:
        lane = self.lanes.get(endpoint)
        if lane is None:
            lane = self.lanes[endpoint] = _LaneWatch(endpoint)
            lane.slack = (min_share_slack(self.config, endpoint)
                          if endpoint in self.config.endpoints else 0.0)
        return lane

    def _tier(self, lane: _LaneWatch, tier: str) -> _TierWatch:
        tw = lane.tiers.get(tier)
        if tw is None:
            bound = (drr_bound(self.config, lane.endpoint, tier)
                     if lane.endpoint in self.config.endpoints else float("inf"))
            tw = lane.tiers[tier] = _TierWatch(tier, bound, 0.0, self.window_s)
        return tw

    def held(self, now: float, endpoint: str, held: Held) -> None:
        """Who holds work on ``endpoint`` now: tier -> {org: join serial}."""
        lane = self._lane(endpoint)
        for name in set(lane.tiers) | set(held):
            self._tier(lane, name).sync(now, held.get(name, {}), self._weight)

    def served(self, now: float, endpoint: str, charges: Iterable[tuple[str, str, float]],
               held: Held) -> None:
        """One batch: ``(tier, org, cost)`` of each request, then who holds work after it.

        Costs are what the core charged (read right after it assembled the
        batch, before any feedback); ``held`` as for :meth:`held`.
        """
        lane = self._lane(endpoint)
        per_tier: dict[str, dict[str, float]] = {}
        per_org: dict[tuple[str, str], float] = {}
        total = 0.0
        for tier, org, cost in charges:
            t = per_tier.setdefault(tier, {})
            t[org] = t.get(org, 0.0) + cost
            per_org[(tier, org)] = per_org.get((tier, org), 0.0) + cost
            total += cost
        for tier, costs in per_tier.items():
            self._tier(lane, tier).serve(now, costs, held.get(tier, {}))
        self.held(now, endpoint, held)
        for name, tw in lane.tiers.items():
            tw.note_batch(now, per_tier.get(name, {}))
        busy = frozenset(name for name, tw in lane.tiers.items() if tw.orgs)
        tier_costs = {tier: sum(c.values()) for tier, c in per_tier.items()}
        lane.log.append((now, per_org, total, busy, tier_costs))
        lane.total += total
        for key, c in per_org.items():
            lane.org_served[key] = lane.org_served.get(key, 0.0) + c
        for tier in busy:
            lane.tier_cost[tier] = lane.tier_cost.get(tier, 0.0) + tier_costs.get(tier, 0.0)
            lane.tier_total[tier] = lane.tier_total.get(tier, 0.0) + total
        lane.expire(now - self.window_s)

    def figures(self, now: float) -> dict[str, LaneFigures]:
        """Every lane's figures over ``[now - window_s, now]``."""
        out: dict[str, LaneFigures] = {}
        horizon = now - self.window_s
        for endpoint, lane in self.lanes.items():
            lane.expire(horizon)
            tiers = {}
            for name, tw in lane.tiers.items():
                j, n = tw.jain(self._weight)
                tier_total = lane.tier_total.get(name, 0.0)
                share = (lane.tier_cost.get(name, 0.0) / tier_total) if tier_total > 0 else None
                floor = None
                if tw.min_share > 0 and share is not None:
                    # Periods that began in the window, and the one running at its start.
                    periods = len(tw.periods) + 1
                    floor = tw.min_share - periods * lane.slack / tier_total
                tiers[name] = TierFigures(
                    endpoint=endpoint, tier=name, gap=tw.gaps.value(now), bound=tw.bound,
                    jain=j, jain_orgs=n, backlogged=len(tw.orgs),
                    longest_wait_s=tw.longest_wait(now), share=share, share_floor=floor,
                    unpaired=sum(1 for o in tw.orgs.values() if o.ref is None))
            out[endpoint] = LaneFigures(endpoint, tiers, dict(lane.org_served), lane.total)
        return out

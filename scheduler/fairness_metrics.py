"""The live fairness figures as Prometheus metrics, and the service's side of the watch.

:class:`LiveFairness` is what the scheduler service holds: a
:class:`~scheduler.fairness.FairnessWatch` fed from the dispatch loop (who
holds work, from :class:`~scheduler.snapshot.Backlog`, before and after
every batch; what the batch charged) and published as gauges with every
state snapshot. Only a leader publishes; :meth:`LiveFairness.reset` clears
every series when it stops leading, so a standby exports none and a
deposed leader's last figures do not linger.

Metrics (``sf_scheduler_fairness_<thing>_<unit>``; labels ``endpoint`` and
``tier`` come from the configuration, ``org`` is an allow-listed org or
``other``, as for :class:`scheduler.metrics.SchedulerMetrics`):

=============================================  =================================================
``..._gap_cost{endpoint,tier}``                largest weight-normalised served-cost difference
                                               of two orgs backlogged together, in the window
``..._bound_cost{endpoint,tier}``              the bound the core guarantees for it
``..._jain_ratio{endpoint,tier}``              Jain's index over backlogged orgs (1: no two waited)
``..._jain_orgs{endpoint,tier}``               orgs in that index's set (0: none)
``..._backlogged_orgs{endpoint,tier}``         orgs holding work now
``..._longest_wait_seconds{endpoint,tier}``    longest time an org with work went without service
``..._tier_share_ratio{endpoint,tier}``        the tier's share of served cost while backlogged
``..._tier_share_floor_ratio{endpoint,tier}``  the share its ``min_share`` guarantees (min_share
                                               tiers only)
``..._served_share_ratio{endpoint,tier,org}``  an org's share of the lane's served cost
``..._batch_seconds{endpoint}``                model time of one full batch, a moving average of
                                               the workers' reports, each scaled by how full its
                                               batch was (the starvation alert's unit)
``..._window_seconds``                         the window every figure covers
=============================================  =================================================

Costs are in the lane's cost units (requests, tokens, or token-equivalents
for ``adaptive``); the definitions are in :mod:`scheduler.fairness`.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge

from scheduler.fairness import FairnessWatch, LaneFigures
from scheduler.snapshot import Backlog
from schemas.config import Config

__all__ = ["FairnessMetrics", "LiveFairness"]

_OTHER_ORG = "other"


class FairnessMetrics:
    """The gauges of the live fairness figures, on a registry passed in."""

    def __init__(self, registry: CollectorRegistry):
        p = "sf_scheduler_fairness"
        r = registry
        lt = ["endpoint", "tier"]
        self.gap = Gauge(f"{p}_gap_cost",
                         "Largest difference of weight-normalised served cost between two orgs "
                         "backlogged together, reached in the window (lane cost units)", lt,
                         registry=r)
        self.bound = Gauge(f"{p}_bound_cost",
                           "The gap DRR guarantees: quantum + 2 x largest request cost / "
                           "min(1, smallest weight) (lane cost units)", lt, registry=r)
        self.jain = Gauge(f"{p}_jain_ratio",
                          "Jain's index over backlogged orgs, of the set served most in the "
                          "window (1 when no two orgs waited together)", lt, registry=r)
        self.jain_orgs = Gauge(f"{p}_jain_orgs",
                               "Orgs in the set Jain's index is taken over (0: no two orgs "
                               "waited together)", lt, registry=r)
        self.backlogged = Gauge(f"{p}_backlogged_orgs", "Orgs holding work now", lt,
                                registry=r)
        self.longest_wait = Gauge(f"{p}_longest_wait_seconds",
                                  "Longest time an org with work went without any service, "
                                  "ended in the window or still running", lt, registry=r)
        self.tier_share = Gauge(f"{p}_tier_share_ratio",
                                "The tier's share of the lane's served cost over the window's "
                                "batches after which it still held work", lt, registry=r)
        self.tier_floor = Gauge(f"{p}_tier_share_floor_ratio",
                                "The share min_share guarantees over the same batches (tiers "
                                "with a min_share)", lt, registry=r)
        self.org_share = Gauge(f"{p}_served_share_ratio",
                               "An org's share of the lane's served cost in the window "
                               "(allow-listed orgs, else 'other')", [*lt, "org"], registry=r)
        self.batch_seconds = Gauge(f"{p}_batch_seconds",
                                   "Measured time of one full batch on the endpoint's workers "
                                   "(each report scaled by how full its batch was)",
                                   ["endpoint"], registry=r)
        self.window = Gauge(f"{p}_window_seconds", "The window the fairness figures cover",
                            registry=r)

    def clear(self) -> None:
        for g in (self.gap, self.bound, self.jain, self.jain_orgs, self.backlogged,
                  self.longest_wait, self.tier_share, self.tier_floor, self.org_share,
                  self.batch_seconds):
            g.clear()


class LiveFairness:
    """A FairnessWatch fed by the scheduler service and published as :class:`FairnessMetrics`."""

    def __init__(self, registry: CollectorRegistry, config: Config,
                 window_s: float | None = None):
        self.window_s = window_s if window_s is not None else config.service.fairness_window_s
        self.watch = FairnessWatch(config, self.window_s)
        self.metrics = FairnessMetrics(registry)
        self.org_allowlist: frozenset[str] = frozenset()
        #: endpoint -> moving average of a full batch's model time (s), from batch_done
        #: events (:meth:`batch_done`)
        self.batch_s: dict[str, float] = {}
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Follow a (re)loaded configuration."""
        self.watch.configure(config)
        self.org_allowlist = frozenset(config.service.metrics_org_allowlist)
        #: endpoint -> (max_batch_tokens, max_batch_size): what a full batch is.
        self._limits = {name: (max(1, ep.max_batch_tokens), max(1, ep.max_batch_size))
                        for name, ep in config.endpoints.items()}

    def held(self, now: float, endpoint: str, backlog: Backlog) -> None:
        """Before a batch is assembled: who holds work on ``endpoint``."""
        self.watch.held(now, endpoint, backlog.held_serials(endpoint))

    def charged(self, now: float, endpoint: str, charges: Iterable[tuple[str, str, float]],
                backlog: Backlog) -> None:
        """Right after a batch was assembled (before any await): what it charged,
        ``(tier, org, cost)`` (an org once or once per request), and who waits."""
        self.watch.served(now, endpoint, charges, backlog.held_serials(endpoint))

    def batch_done(self, endpoint: str, seconds: float, *, requests: int = 0, tokens: int = 0,
                   alpha: float = 0.2) -> None:
        """A worker reported a batch of ``requests`` and ``tokens`` served in ``seconds`` of
        model time: a moving average of what a *full* batch takes.

        The starvation alert counts a wait in batch times, the batches of
        other orgs a backlogged org waits behind, and under a backlog those
        are full. A smaller batch's time is scaled up by how full it was (the
        larger of its share of ``max_batch_tokens`` and of
        ``max_batch_size``): a batch of 2 requests reported first once put
        the unit at a 2-request batch's 10 ms and the alert's threshold at
        100 ms, and the alert went pending for a free org behind a
        gold one's first full batch (a CI run of
        ``tests/integration/test_prometheus_live.py``). Scaled, a small
        batch's fixed cost makes the unit larger, not smaller: the alert
        errs towards silence for waits of a few batches, and still fires for
        an org left waiting. Unlike the throttle's measure
        (:class:`scheduler.snapshot.ServiceRate`, batches over half the
        budget only), every report counts: an endpoint whose batches are
        never half full still gets a unit. A report without its size (an
        older worker) counts as a full batch.
        """
        if not (seconds > 0.0) or seconds == float("inf"):
            return
        limits = self._limits.get(endpoint)
        if limits is not None and (requests > 0 or tokens > 0):
            fill = max(tokens / limits[0], requests / limits[1])
            if 0.0 < fill < 1.0:
                seconds /= fill
        prev = self.batch_s.get(endpoint)
        self.batch_s[endpoint] = seconds if prev is None else (1 - alpha) * prev + alpha * seconds

    def reset(self) -> None:
        """Not leading any more: forget, and export nothing."""
        self.watch.reset()
        self.metrics.clear()

    def publish(self, now: float, backlog: Backlog) -> dict[str, LaneFigures]:
        """Sync every lane, compute the figures, set the gauges; returns the figures."""
        for endpoint in list(self.watch.lanes):
            self.held(now, endpoint, backlog)
        figures = self.watch.figures(now)
        m = self.metrics
        m.window.set(self.window_s)
        m.tier_floor.clear()  # a tier without a defined floor must not keep an old one
        m.tier_share.clear()
        m.org_share.clear()
        for endpoint, lane in figures.items():
            for tier, f in lane.tiers.items():
                m.gap.labels(endpoint, tier).set(f.gap)
                m.bound.labels(endpoint, tier).set(f.bound)
                m.jain.labels(endpoint, tier).set(f.jain)
                m.jain_orgs.labels(endpoint, tier).set(f.jain_orgs)
                m.backlogged.labels(endpoint, tier).set(f.backlogged)
                m.longest_wait.labels(endpoint, tier).set(f.longest_wait_s)
                if f.share is not None:
                    m.tier_share.labels(endpoint, tier).set(f.share)
                if f.share_floor is not None:
                    m.tier_floor.labels(endpoint, tier).set(f.share_floor)
            if lane.total > 0:
                shares: dict[tuple[str, str], float] = {}
                for (tier, org), c in lane.served.items():
                    key = (tier, org if org in self.org_allowlist else _OTHER_ORG)
                    shares[key] = shares.get(key, 0.0) + c / lane.total
                for (tier, org), share in shares.items():
                    m.org_share.labels(endpoint, tier, org).set(share)
        for endpoint, seconds in self.batch_s.items():
            m.batch_seconds.labels(endpoint).set(seconds)
        return figures

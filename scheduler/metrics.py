"""The scheduler service's Prometheus metrics, on a registry passed in.

Names follow ``sf_scheduler_<thing>_<unit>``. Labels are bounded: endpoint
and tier come from the configuration, ``reason`` and ``status`` from fixed
sets of codes. An ``org`` label exists only on the dispatched counters, and
its values are the orgs of ``service.metrics_org_allowlist`` plus ``other``
for every org not listed (:meth:`SchedulerMetrics.org_label`), so the
series count is bounded by the configuration, never by traffic. Per-org
backlog of every org goes to the ``scheduler-state`` topic instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from plumbing.labels import cached_labels
from schemas.config import Config

__all__ = ["SchedulerMetrics"]

_WAIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_FILL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class SchedulerMetrics:
    """Every metric of one scheduler service."""

    #: The ``org`` label of an org outside ``service.metrics_org_allowlist``.
    OTHER_ORG = "other"

    def __init__(self, registry: CollectorRegistry, config: Config | None = None):
        p = "sf_scheduler"
        self.org_allowlist: frozenset[str] = frozenset()
        if config is not None:
            self.configure(config)
        r = registry
        self.received = Counter(f"{p}_requests_received_total",
                                "Admitted requests read from the tier topics", ["tier"], registry=r)
        self.duplicates = Counter(f"{p}_requests_duplicate_total",
                                  "Requests ignored because their id was already held "
                                  "(replays)", ["tier"], registry=r)
        self.held_requests = Gauge(f"{p}_held_requests", "Requests held in memory",
                                   ["endpoint", "tier"], registry=r)
        self.held_tokens = Gauge(f"{p}_held_tokens", "Tokens of the requests held in memory",
                                 ["endpoint", "tier"], registry=r)
        self.held_cost = Gauge(f"{p}_held_cost",
                               "Cost of the requests held in memory, in the endpoint's cost units "
                               "(requests, tokens, or tokens x the org's measured ratio)",
                               ["endpoint", "tier"], registry=r)
        self.dispatched_requests = Counter(
            f"{p}_dispatched_requests_total",
            "Requests in acknowledged batches, by org (allowlisted orgs, else 'other')",
            ["endpoint", "tier", "org"], registry=r)
        self.dispatched_cost = Counter(
            f"{p}_dispatched_cost_total",
            "Cost of the requests in acknowledged batches, in the endpoint's cost units: "
            "each org's served share", ["endpoint", "tier", "org"], registry=r)
        self.results = Counter(f"{p}_results_total",
                               "Results the scheduler wrote and the broker acknowledged "
                               "(expired, invalid), by status", ["status"], registry=r)
        self.events_lag = Gauge(f"{p}_worker_events_lag_records",
                                "Worker events not yet read (highwater - position)", registry=r)
        self.broker_reachable = Gauge(f"{p}_broker_reachable",
                                      "1 while the broker answers the readiness probe", registry=r)
        self.reloads = Counter(f"{p}_config_reloads_total",
                               "Configuration reloads, applied or refused", ["result"], registry=r)
        self.drr_rounds = Counter(f"{p}_drr_rounds_total", "DRR turns granted to orgs",
                                  ["endpoint"], registry=r)
        self.batches = Counter(f"{p}_batches_emitted_total",
                               "Batches written to a worker slot and acknowledged",
                               ["endpoint"], registry=r)
        self.batch_requests = Histogram(f"{p}_batch_requests", "Requests per emitted batch",
                                        ["endpoint"], buckets=_SIZE_BUCKETS, registry=r)
        self.batch_fill = Histogram(f"{p}_batch_fill_ratio",
                                    "Batch tokens over the endpoint's max_batch_tokens",
                                    ["endpoint"], buckets=_FILL_BUCKETS, registry=r)
        self.queue_wait = Histogram(f"{p}_queue_wait_seconds",
                                    "Admission to dispatch (batch acknowledged)", ["tier"],
                                    buckets=_WAIT_BUCKETS_S, registry=r)
        self.free_slots = Gauge(f"{p}_free_worker_slots", "Free worker slots", ["endpoint"],
                                registry=r)
        self.workers = Gauge(f"{p}_workers", "Live workers", ["endpoint"], registry=r)
        self.flow_round_trip = Gauge(
            f"{p}_flow_round_trip_seconds",
            "Measured round trip to the endpoint's workers without their own time (mean over "
            "workers; flow control keeps this much work at each, see docs/protocol.md)",
            ["endpoint"], registry=r)
        self.flow_batch = Gauge(
            f"{p}_flow_full_batch_seconds",
            "Estimated service time of a full batch at the endpoint's workers (mean)",
            ["endpoint"], registry=r)
        self.flow_outstanding = Gauge(
            f"{p}_flow_outstanding_batches",
            "Batches sent to the endpoint's workers whose credit is not returned yet",
            ["endpoint"], registry=r)
        self.expired = Counter(f"{p}_expired_total", "Requests whose deadline passed while held",
                               ["endpoint", "tier"], registry=r)
        self.lag = Gauge(f"{p}_consumer_lag_records",
                         "Records of a tier topic not yet read (highwater - position)", ["tier"],
                         registry=r)
        self.failures = Counter(f"{p}_failures_total",
                                "Records and sends that failed, by reason", ["reason"], registry=r)
        self.workers_lost = Counter(f"{p}_workers_lost_total",
                                    "Workers dropped (timeout or bye)", ["endpoint", "reason"],
                                    registry=r)
        self.paused = Gauge(f"{p}_intake_paused",
                            "1 while tier consumers are paused (max_held_requests reached)",
                            registry=r)

        # Children of the per-request metrics, resolved once per label set.
        self.received_counter = cached_labels(self.received)
        self.queue_wait_histogram = cached_labels(self.queue_wait)
        self._dispatched_requests = cached_labels(self.dispatched_requests)
        self._dispatched_cost = cached_labels(self.dispatched_cost)

    def configure(self, config: Config) -> None:
        """Follow a (re)loaded configuration: the org allowlist may change."""
        self.org_allowlist = frozenset(config.service.metrics_org_allowlist)

    def org_label(self, org: str) -> str:
        """``org`` if it is allowlisted, else ``other``: the label set stays bounded."""
        return org if org in self.org_allowlist else self.OTHER_ORG

    def dispatched_charges(self, endpoint: str,
                           charges: Iterable[tuple[str, str, int, float]]) -> None:
        """Count an acknowledged batch's requests and cost per (tier, org label), from
        what it charged each org: ``(tier, org, requests, cost)``."""
        sums: dict[tuple[str, str], tuple[int, float]] = {}
        for tier, org, n, c in charges:
            key = (tier, self.org_label(org))
            was_n, was_c = sums.get(key, (0, 0.0))
            sums[key] = (was_n + n, was_c + c)
        for (tier, label), (n, c) in sums.items():
            self._dispatched_requests(endpoint, tier, label).inc(n)
            self._dispatched_cost(endpoint, tier, label).inc(c)

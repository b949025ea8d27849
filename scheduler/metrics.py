"""The scheduler service's Prometheus metrics, on a registry passed in.

Names follow ``sf_scheduler_<thing>_<unit>``. Labels are bounded: endpoint
and tier come from the configuration, ``reason`` from a fixed set of codes;
no org or request id is ever a label (per-org backlog goes to the
``scheduler-state`` topic instead).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["SchedulerMetrics"]

_WAIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_FILL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class SchedulerMetrics:
    """Every metric of one scheduler service."""

    def __init__(self, registry: CollectorRegistry):
        p = "sf_scheduler"
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

"""Admission's metrics (the log sampler it uses lives in :mod:`plumbing.logs`).

Every metric lives on a registry passed in (never the global default), so
several services in one process stay apart. Label values are bounded:
endpoints and tiers come from the registry (names a request made up become
``unknown``), reasons are the fixed codes of :mod:`producer.admission`, and
partitions are the ingress topic's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from plumbing.labels import cached_labels
from plumbing.logs import LogSampler

__all__ = ["AdmissionMetrics", "LogSampler"]

# Decisions take tens of microseconds; token counting of a long text, a
# millisecond or more.
_DECISION_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
)


class AdmissionMetrics:
    """The ``sf_admission_*`` metrics of one admission service."""

    def __init__(self, registry: CollectorRegistry):
        self.admitted = Counter(
            "sf_admission_admitted_total", "Requests admitted, by endpoint and tier.",
            ["endpoint", "tier"], registry=registry,
        )
        self.rejected = Counter(
            "sf_admission_rejected_total",
            "Requests answered at admission (invalid, expired or rejected), by reason.",
            ["endpoint", "tier", "reason"], registry=registry,
        )
        self.dead_letters = Counter(
            "sf_admission_dead_letters_total", "Ingress records sent to the dead-letter topic.",
            ["reason"], registry=registry,
        )
        self.decision_seconds = Histogram(
            "sf_admission_decision_seconds",
            "Time to decode and decide one ingress record (token counting included).",
            buckets=_DECISION_BUCKETS, registry=registry,
        )
        self.lag = Gauge(
            "sf_admission_consumer_lag_records",
            "Ingress records not yet decided, per partition (highwater - next offset).",
            ["partition"], registry=registry,
        )
        self.read_ahead = Gauge(
            "sf_admission_read_ahead_records",
            "Ingress records fetched and not yet decided: read ahead, paced (their org's "
            "backlog at the scheduler is pace_backlog_s or more), and with shaping on "
            "(shape_org_per_s), waiting for their org's allowance.",
            registry=registry,
        )
        self.backlog_written = Counter(
            "sf_admission_backlog_written_total",
            "Ingress records written to the backlog topic (their org had "
            "backlog_after_records read ahead with backlog_from_records read ahead in all, or "
            "records in the backlog already), once "
            "the broker has them.", registry=registry,
        )
        self.backlog_read = Counter(
            "sf_admission_backlog_read_total",
            "Records read back from the backlog topic into the read-ahead.", registry=registry,
        )
        self.backlog_lag = Gauge(
            "sf_admission_backlog_lag_records",
            "Backlog records (each holding several requests) not yet read back and decided, "
            "over this instance's backlog partitions: what bursts wait in Kafka.",
            registry=registry,
        )
        self.state_age = Gauge(
            "sf_admission_scheduler_state_age_seconds",
            "Age of the latest scheduler snapshot (NaN before the first); beyond the "
            "staleness limit the throttle is off.",
            registry=registry,
        )
        self.state_errors = Counter(
            "sf_admission_scheduler_state_errors_total",
            "Scheduler snapshots that could not be decoded.", registry=registry,
        )
        self.send_failures = Counter(
            "sf_admission_send_failures_total",
            "Failed writes (each attempt), by what was written.", ["kind"], registry=registry,
        )
        # At 0 from the start: a dashboard panel of failures that never happened
        # shows a flat 0, not "no data" (which a misspelt name also gives).
        for kind in ("admitted", "result", "dead_letter", "backlog"):
            self.send_failures.labels(kind)
        self.results = Counter(
            "sf_admission_results_total",
            "Results written by admission and acknowledged (rejected, invalid, failed), by status.",
            ["status"], registry=registry,
        )
        self.broker_reachable = Gauge(
            "sf_admission_broker_reachable",
            "1 while the broker answers the readiness probe, 0 once it stopped answering.",
            registry=registry,
        )
        self.reloads = Counter(
            "sf_admission_config_reloads_total", "Configuration reloads, applied or refused.",
            ["result"], registry=registry,
        )
        # Children of the per-request counters, resolved once per label set.
        self.admitted_counter = cached_labels(self.admitted)
        self.rejected_counter = cached_labels(self.rejected)
        self.result_counter = cached_labels(self.results)
        self.lag_gauge = cached_labels(self.lag)

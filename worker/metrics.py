"""The worker service's Prometheus metrics, on a registry passed in.

Names follow ``sf_worker_<thing>_<unit>``; labels are the endpoint, the
tier (from the configuration: the worker reads it from each
``AdmittedRequest``, and a tier it does not know is counted as ``unknown``)
and fixed codes (status, reason), never an org or a request id.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["WorkerMetrics"]

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: End to end: milliseconds on an idle system, minutes behind a burst.
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_RATIO = (1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 5.0)


class WorkerMetrics:
    """Every metric of one worker service."""

    def __init__(self, registry: CollectorRegistry):
        p = "sf_worker"
        r = registry
        self.batches = Counter(f"{p}_batches_total", "Batches served", ["endpoint"], registry=r)
        self.results = Counter(f"{p}_results_total",
                               "Results written and acknowledged by the broker, by status",
                               ["endpoint", "status"], registry=r)
        self.latency = Histogram(f"{p}_request_latency_seconds",
                                 "End to end per tier: from admission (admitted_ms) to the "
                                 "request's ok result acknowledged by the broker",
                                 ["endpoint", "tier"], buckets=_LATENCY, registry=r)
        self.lag = Gauge(f"{p}_consumer_lag_records",
                         "Batches on this worker's partitions not yet taken (highwater - position)",
                         ["endpoint"], registry=r)
        self.broker_reachable = Gauge(f"{p}_broker_reachable",
                                      "1 while the broker answers the readiness probe", registry=r)
        self.inference = Histogram(f"{p}_inference_seconds", "Model time per micro-batch",
                                   ["endpoint"], buckets=_SECONDS, registry=r)
        self.batch_seconds = Histogram(f"{p}_batch_seconds",
                                       "From taking a batch to its last result acknowledged",
                                       ["endpoint"], buckets=_SECONDS, registry=r)
        self.tokens_per_s = Gauge(f"{p}_tokens_per_second",
                                  "Real tokens per second of model time, last micro-batch",
                                  ["endpoint"], registry=r)
        self.padding = Histogram(f"{p}_padding_ratio",
                                 "Padded tokens computed over real tokens, per micro-batch",
                                 ["endpoint"], buckets=_RATIO, registry=r)
        self.call_tokens = Gauge(f"{p}_call_tokens",
                                 "What one model call's fixed cost is worth in padded tokens, as "
                                 "the micro-batch planner uses it (0: each call filled to its "
                                 "budget)", ["endpoint"], registry=r)
        self.joined_calls = Counter(f"{p}_joined_calls_total",
                                    "Model calls an express batch's first call shared with the "
                                    "call waiting next (one call for two)", ["endpoint"],
                                    registry=r)
        self.in_hand = Gauge(f"{p}_batches_in_hand", "Batches taken and not yet finished",
                             ["endpoint"], registry=r)
        self.failures = Counter(f"{p}_failures_total", "Records and sends that failed, by reason",
                                ["endpoint", "reason"], registry=r)
        self.duplicates = Counter(f"{p}_duplicate_requests_total",
                                  "Requests of a batch not run because this worker had answered "
                                  "the same id within answered_window_s", ["endpoint"],
                                  registry=r)

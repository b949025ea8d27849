"""The gateway's metrics, on a registry passed in.

Labels are bounded and say nothing secret: the route's name (a fixed set)
and the HTTP status. No key, no org from a body, no request id is ever a
label; an unauthenticated request is one count, whatever it sent.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from plumbing.labels import cached_labels

__all__ = ["GatewayMetrics"]

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    """The ``sf_gateway_*`` metrics of one gateway."""

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "sf_gateway_requests_total",
            "HTTP requests answered, by route and status (499: the client went away first).",
            ["route", "code"], registry=registry,
        )
        self.seconds = Histogram(
            "sf_gateway_request_seconds", "Time from a request's arrival to its answer, by route.",
            ["route"], buckets=_SECONDS, registry=registry,
        )
        self.waiting = Gauge(
            "sf_gateway_waiting_requests",
            "Requests sent to the pipeline and waiting for their result.", registry=registry,
        )
        self.unauthenticated = Counter(
            "sf_gateway_unauthenticated_total",
            "Requests refused with 401 (no key, a malformed, unknown or revoked one).",
            registry=registry,
        )
        self.refused_full = Counter(
            "sf_gateway_full_total",
            "Requests refused with 503 because max_waiting_requests were waiting.",
            registry=registry,
        )
        self.refused_org_full = Counter(
            "sf_gateway_org_full_total",
            "Requests refused with 429 because their org had its share of "
            "max_waiting_requests waiting (org_waiting_share).",
            registry=registry,
        )
        self.keys = Gauge(
            "sf_gateway_api_keys", "API key hashes in the running configuration.",
            registry=registry,
        )
        self.reloads = Counter(
            "sf_gateway_config_reloads_total", "Configuration reloads, by result.",
            ["result"], registry=registry,
        )
        self.broker_up = Gauge(
            "sf_gateway_broker_up", "1 while the broker answers the gateway's metadata probes.",
            registry=registry,
        )
        for result in ("applied", "refused"):
            self.reloads.labels(result)
        self._requests = cached_labels(self.requests)
        self._seconds = cached_labels(self.seconds)

    def answered(self, route: str, code: int, seconds: float) -> None:
        self._requests(route, str(code)).inc()
        self._seconds(route).observe(seconds)

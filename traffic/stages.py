"""Where a request's time went, stage by stage, from the stamps its result carries.

Each service stamps the request as it passes (``docs/protocol.md``); the
client adds when the result reached it. The stages, in order:

==================  =====================================  ==========================
stage               from -> to                             what it is
==================  =====================================  ==========================
``to admission``    ``created_ms`` -> ``fetched_ms``       the ingress append, and
                                                           admission's next fetch
``admission``       ``fetched_ms`` -> ``admitted_ms``      waiting in admission's
                                                           read-ahead, the decision
``tier topic``      ``admitted_ms`` -> ``received_ms``     the tier-topic append and
                                                           the scheduler's fetch
``scheduler queue`` ``received_ms`` -> ``dispatched_ms``   held in the scheduler: the
                                                           fair wait for credit
``batch topic``     ``dispatched_ms`` -> ``taken_ms``      the batch append and the
                                                           worker's fetch
``worker queue``    ``taken_ms`` -> ``started_ms``         the worker's batches ahead
                                                           and its own batch's earlier
                                                           micro-batches
``inference``       ``started_ms`` -> ``completed_ms``     its micro-batch(es)
``delivery``        ``completed_ms`` -> received           the result's append and
                                                           the client's fetch
==================  =====================================  ==========================

A result without a stamp (from a service older than the stamp) leaves that
stage and its neighbour out for that request, rather than guessing. Clocks:
each difference is between two machines' clocks where the services run
apart; on one machine (the demo, the benches) they agree.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from schemas.messages import Result

__all__ = ["STAGES", "percentile_ms", "span_times", "stage_line", "stage_times"]

#: (stage, stamp it starts at, stamp it ends at); "received" is the client's time.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("to admission", "created_ms", "fetched_ms"),
    ("admission", "fetched_ms", "admitted_ms"),
    ("tier topic", "admitted_ms", "received_ms"),
    ("scheduler queue", "received_ms", "dispatched_ms"),
    ("batch topic", "dispatched_ms", "taken_ms"),
    ("worker queue", "taken_ms", "started_ms"),
    ("inference", "started_ms", "completed_ms"),
    ("delivery", "completed_ms", "received"),
)


def stage_times(results: Iterable[tuple[Result, float]]) -> dict[str, list[float]]:
    """Milliseconds of each stage, per ``(result, received epoch ms)`` of ``ok`` results."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
    for result, received_ms in results:
        if result.status != "ok":
            continue
        for name, start, end in STAGES:
            a = getattr(result, start)
            b = received_ms if end == "received" else getattr(result, end)
            if a is not None and b is not None:
                out[name].append(max(0.0, float(b) - float(a)))
    return out


def span_times(results: Iterable[tuple[Result, float]], start: str, end: str) -> list[float]:
    """Milliseconds from stamp ``start`` to stamp ``end`` ("received": the client) of ok results."""
    out = []
    for result, received_ms in results:
        a = getattr(result, start)
        b = received_ms if end == "received" else getattr(result, end)
        if result.status == "ok" and a is not None and b is not None:
            out.append(max(0.0, float(b) - float(a)))
    return out


def percentile_ms(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank), None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def stage_line(times: dict[str, list[float]], *, label: str = "time per stage") -> str:
    """``label (p50 / p99 ms): to admission 5 / 9, admission 1 / 3, ...``."""
    parts = []
    for name, values in times.items():
        if values:
            p50, p99 = percentile_ms(values, 50), percentile_ms(values, 99)
            parts.append(f"{name} {p50:,.0f} / {p99:,.0f}")
    return f"{label} (p50 / p99 ms): " + ", ".join(parts)

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

from collections.abc import Iterable

from schemas.messages import Result
from traffic.percentile import percentile

__all__ = ["HOPS", "STAGES", "excess_by_stage", "excess_line", "percentile_ms", "request_stages",
           "span_times", "stage_line", "stage_times", "usual_stage_ms"]

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


#: The stages that are a Kafka append and a consumer's fetch; the others are
#: waits and work inside a service.
HOPS = frozenset({"to admission", "tier topic", "batch topic", "delivery"})


def request_stages(result: Result, received_ms: float) -> dict[str, float]:
    """One result's milliseconds per stage; a stage missing either stamp is left out."""
    out = {}
    for name, start, end in STAGES:
        a = getattr(result, start)
        b = received_ms if end == "received" else getattr(result, end)
        if a is not None and b is not None:
            out[name] = max(0.0, float(b) - float(a))
    return out


def stage_times(results: Iterable[tuple[Result, float]]) -> dict[str, list[float]]:
    """Milliseconds of each stage, per ``(result, received epoch ms)`` of ``ok`` results."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
    for result, received_ms in results:
        if result.status == "ok":
            for name, ms in request_stages(result, received_ms).items():
                out[name].append(ms)
    return out


def usual_stage_ms(results: Iterable[tuple[Result, float]]) -> dict[str, float]:
    """Each stage's p50 over ``(result, received epoch ms)`` of ``ok`` results: the usual
    times :func:`excess_by_stage` measures against (a stage with no sample left out)."""
    return {name: p for name, v in stage_times(results).items()
            if (p := percentile_ms(v, 50)) is not None}


def excess_by_stage(late: Iterable[dict[str, float]],
                    typical: dict[str, float]) -> dict[str, float]:
    """Where late requests' time went: per stage, the milliseconds beyond ``typical``, summed.

    ``late``: per request, its :func:`request_stages`; ``typical``: each
    stage's usual time (e.g. its p50 with no load). A stage at or below its
    usual time adds nothing; a stage with no usual time counts whole. So
    the stage with the largest sum is where the requests over a bound lost
    the most, whatever they spent in the stages that behaved.
    """
    out = {name: 0.0 for name, _, _ in STAGES}
    for stages in late:
        for name, ms in stages.items():
            out[name] += max(0.0, ms - typical.get(name, 0.0))
    return out


def excess_line(excess: dict[str, float], n: int, *, label: str) -> str:
    """``label: 7 requests over it; ...: tier topic 412 ms (38 %), ...; a request: hops 60 ms, ...``.

    The last part is the mean per request, split between the Kafka hops
    (:data:`HOPS`) and the waits and work inside the services.
    """
    total = sum(excess.values())
    if not n or total <= 0:
        return f"{label}: {n} requests over it"
    parts = [f"{name} {ms:,.0f} ms ({100 * ms / total:.0f} %)"
             for name, ms in excess.items() if ms > 0]
    hops = sum(ms for name, ms in excess.items() if name in HOPS)
    return (f"{label}: {n} requests over it; their time beyond the unloaded p50: "
            + ", ".join(parts)
            + f"; a request: Kafka hops {hops / n:,.0f} ms, in the services "
              f"{(total - hops) / n:,.0f} ms")


def span_times(results: Iterable[tuple[Result, float]], start: str, end: str) -> list[float]:
    """Milliseconds from stamp ``start`` to stamp ``end`` ("received": the client) of ok results."""
    out = []
    for result, received_ms in results:
        a = getattr(result, start)
        b = received_ms if end == "received" else getattr(result, end)
        if result.status == "ok" and a is not None and b is not None:
            out.append(max(0.0, float(b) - float(a)))
    return out


#: :func:`traffic.percentile.percentile` under the name this module's callers use.
percentile_ms = percentile


def stage_line(times: dict[str, list[float]], *, label: str = "time per stage") -> str:
    """``label (p50 / p99 ms): to admission 5 / 9, admission 1 / 3, ...``."""
    parts = []
    for name, values in times.items():
        if values:
            p50, p99 = percentile_ms(values, 50), percentile_ms(values, 99)
            parts.append(f"{name} {p50:,.0f} / {p99:,.0f}")
    return f"{label} (p50 / p99 ms): " + ", ".join(parts)

"""What a replay's results say: one outcome per request, stage times, batch-time fit, Jain.

Pure functions over the results :mod:`traffic.replay` collected, so they
are tested without a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from schemas.config import Config
from schemas.messages import Result
from traffic.replay_sources import (
    ReplayItem,
)
from traffic.report import (
    Outcome,
    percentile,
)

__all__ = ["fit_batch_time", "late_requests", "live_jain", "outcomes_of", "peak_per_s",
           "results_ms", "sent_after", "sent_line", "stage_table"]

_STAGES = (("admission", "admitted_s", "arrival_s"), ("scheduler", "dispatched_s", "admitted_s"),
           ("batch", "completed_s", "dispatched_s"))


class _ItemFields(TypedDict):
    """The fields :func:`outcomes_of` gives every item's :class:`Outcome`, whatever became of it."""

    id: str
    org: str
    tier: str
    endpoint: str
    arrival_s: float


def stage_table(runs: dict[str, Sequence[Outcome]], *, max_orgs: int = 12) -> str:
    """p50 ms of each stage of an ok request's life, per org, for each labelled run.

    Stages: *admission* (sent -> admitted: the ingress topic and admission),
    *scheduler* (admitted -> put in a batch: held, waiting for its turn and a
    free slot), *batch* (batch -> done: the batch topic, the worker's queue
    and the model). The simulator admits instantly, so its admission is 0.
    """
    per: dict[str, dict[str, dict[str, list[float]]]] = {}
    counts: dict[str, int] = {}
    for label, outcomes in runs.items():
        for o in outcomes:
            counts[o.org] = counts.get(o.org, 0) + (label == next(iter(runs)))
            if o.status != "ok":
                continue
            row = per.setdefault(o.org, {}).setdefault(label, {n: [] for n, _, _ in _STAGES})
            for name, end, start in _STAGES:
                a, b = getattr(o, end), getattr(o, start)
                if a is not None and b is not None:
                    row[name].append(a - b)
    labels = list(runs)
    header = ["org"] + [f"{n} {lab}" for n, _, _ in _STAGES for lab in labels]
    lines = ["| " + " | ".join(header) + " |", "|:--|" + "--:|" * (len(header) - 1)]
    for org in sorted(per, key=lambda o: (-counts.get(o, 0), o))[:max_orgs]:
        cells = [org]
        for name, _, _ in _STAGES:
            for lab in labels:
                xs = sorted(per[org].get(lab, {}).get(name, []))
                v = percentile(xs, 50)
                cells.append("-" if v is None else f"{v * 1000:,.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def results_ms(results: Iterable[tuple[Result, float] | None]) -> list[tuple[Result, float]]:
    """A replay's results that came back, each with the epoch millisecond it was received.

    The replay keeps epoch seconds; :mod:`traffic.stages` takes milliseconds.
    One place converts, so no caller compares seconds with milliseconds.
    """
    return [(got[0], got[1] * 1000) for got in results if got is not None]


def late_requests(outcomes: Sequence[Outcome], results: Sequence[tuple[Result, float] | None],
                  bounds_ms: Mapping[str, float | None]) -> list[tuple[Result, float]]:
    """Each ok request that took longer than its org's bound, sent to done: its result,
    with the epoch millisecond it was received (as :func:`results_ms`).

    ``outcomes`` and ``results`` are a replay's, item by item (a result with
    the epoch second it was received, or None); an org without a bound in
    ``bounds_ms`` has no late request.
    """
    late = []
    for o, got in zip(outcomes, results, strict=True):
        bound = bounds_ms.get(o.org)
        if (got is not None and bound is not None and o.status == "ok"
                and o.completed_s is not None and (o.completed_s - o.arrival_s) * 1000 > bound):
            late.append(got)
    return results_ms(late)


def sent_after(late: Iterable[tuple[Result, float]], began_s: float | None) -> list[float]:
    """When each request was created, in seconds after ``began_s`` (a burst's first
    request, epoch seconds), in order; empty without ``began_s``."""
    if began_s is None:
        return []
    return sorted(round(r.created_ms / 1000 - began_s, 2) for r, _ in late
                  if r.created_ms is not None)


def sent_line(after_s: Sequence[float]) -> str:
    """:func:`sent_after`'s figures in words, to follow an over-the-bound line: under a
    burst's arrival (its records taken in, decided and forwarded at once) a quiet
    request pays more than under its draining."""
    if not after_s:
        return ""
    first = sum(a < 1.0 for a in after_s)
    return (f"; sent {min(after_s):.2f} to {max(after_s):.2f} s after the burst's first "
            f"request, {first} of {len(after_s)} within its first second")


def fit_batch_time(results: Iterable[Result]) -> dict[str, float] | None:
    """The workers' batch time as ``overhead_ms + ms_per_token x tokens``, fitted to the run.

    Each ok result carries its share of its micro-batches' model time
    (``inference_ms``); summed per batch they give the batch's model time.
    Least squares over the batches; through the origin if the intercept
    comes out negative. None without two batches of different sizes.
    """
    per_batch: dict[str, list[float]] = {}
    for r in results:
        if r.status == "ok" and r.batch_id and r.inference_ms is not None and r.tokens:
            b = per_batch.setdefault(r.batch_id, [0.0, 0.0])
            b[0] += r.tokens
            b[1] += r.inference_ms
    pts = list(per_batch.values())
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    intercept = my - slope * mx
    if intercept < 0 or slope <= 0:
        slope, intercept = sum(y for _, y in pts) / sum(x for x, _ in pts), 0.0
    return {"batches": n, "overhead_ms": round(intercept, 4), "ms_per_token": round(slope, 6)}


def peak_per_s(times: Sequence[float]) -> int:
    """Most of the (sorted) ``times`` within any one second."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def outcomes_of(config: Config, items: Sequence[ReplayItem],
              got: Sequence[tuple[Result, float] | None], sent_at: Sequence[float | None],
              send_error: dict[int, str], wall0: float) -> list[Outcome]:
    """One :class:`Outcome` per item, in item order, times from ``wall0``."""

    def rel(ms: int | None) -> float | None:
        return None if ms is None else round(ms / 1000.0 - wall0, 6)

    batch_tokens: dict[str, int] = {}
    for g in got:
        if g is not None and g[0].status == "ok" and g[0].batch_id:
            batch_tokens[g[0].batch_id] = batch_tokens.get(g[0].batch_id, 0) + (g[0].tokens or 0)
    out = []
    for i, item in enumerate(items):
        req = item.request
        org = config.orgs.get(req.org)
        ep = config.endpoints.get(req.endpoint)
        at = sent_at[i]
        sent = at if at is not None else wall0
        base: _ItemFields = {"id": req.id, "org": req.org, "tier": org.tier if org else "",
                             "endpoint": req.endpoint, "arrival_s": round(sent - wall0, 6)}
        if i in send_error:
            # Never sent: the in-flight bound waited for a result that did not come.
            why = "replay_not_sent" if at is None else "replay_send_failed"
            out.append(Outcome(**base, status="failed", reason=why,
                               tokens=item.tokens, completed_s=base["arrival_s"]))
            continue
        back = got[i]
        if back is None:
            out.append(Outcome(**base, status="missing", reason="no_result_within_timeout",
                               tokens=item.tokens))
            continue
        res, received = back
        done_ms = res.completed_ms if res.completed_ms is not None else int(received * 1000)
        # Another host's clock may be off: never before the send, never after receipt.
        done_ms = min(max(done_ms, int(sent * 1000)), int(received * 1000))
        out.append(Outcome(
            **base, status=res.status, reason=res.reason, tokens=res.tokens or item.tokens,
            admitted_s=rel(res.admitted_ms), dispatched_s=rel(res.dispatched_ms),
            completed_s=rel(done_ms), batch_id=res.batch_id,
            batch_tokens=batch_tokens.get(res.batch_id) if res.batch_id else None,
            batch_budget=ep.max_batch_tokens if ep and res.batch_id else None,
            express=res.express))
    return out


def live_jain(outcomes: Sequence[Outcome], config: Config, *, hop_s: float = 0.1,
              min_batches: int = 3) -> tuple[float | None, list[dict]]:
    """Jain's index over backlogged orgs, estimated from a live run's outcomes.

    The simulator's definition (:mod:`traffic.simulate`) needs the
    scheduler's queues; a replay only has each request's admission and
    dispatch times. So an org counts as backlogged across a batch when one
    of its requests was admitted at least ``hop_s`` before the batch was
    dispatched and left (in a later batch, or expired) after it. ``hop_s``
    stands for the trip from admission to the scheduler (tens of ms): a
    request still on its way cannot be chosen, and counting it would blame
    the scheduler for batches it assembled before the request existed for
    it; under load the hop is longer, so a set seen across fewer than
    ``min_batches`` batches is not counted. An express batch
    (``Outcome.express``) takes its requests out of the held counts but is
    not counted, as in the simulator: it shares nothing out among the
    backlogged orgs. Cost is tokens. Returns the index of the set with the
    most served tokens and the ten largest sets, as the simulator reports
    them.
    """
    from traffic.simulate import JainGroup, count_backlogged

    events: list[tuple[float, int, str, Any]] = []
    batches: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.admitted_s is None:
            continue
        if o.status == "ok" and o.batch_id and o.dispatched_s is not None:
            events.append((min(o.admitted_s + hop_s, o.dispatched_s), 0, o.id, o))
            batches.setdefault(o.batch_id, []).append(o)
        elif o.status == "expired" and o.completed_s is not None:
            events.append((min(o.admitted_s + hop_s, o.completed_s), 0, o.id, o))
            events.append((o.completed_s, 1, o.id, o))
    for bid, members in batches.items():
        # Each member has its dispatch time: only those dispatched join a batch above.
        first = min(m.dispatched_s for m in members if m.dispatched_s is not None)
        events.append((first, 2, bid, members))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    held: dict[tuple[str, str], dict[str, int]] = {}
    groups: dict[tuple[str, str, frozenset[str]], JainGroup] = {}

    def change(o: Outcome, d: int) -> None:
        counts = held.setdefault((o.endpoint, o.tier), {})
        counts[o.org] = counts.get(o.org, 0) + d
        if counts[o.org] <= 0:
            del counts[o.org]

    for _, kind, _, what in events:
        if kind == 0:
            change(what, +1)
        elif kind == 1:
            change(what, -1)
        else:
            served: dict[tuple[str, str], float] = {}
            for m in what:
                change(m, -1)
                served[(m.tier, m.org)] = served.get((m.tier, m.org), 0.0) + m.tokens
            if not what[0].express:
                count_backlogged(groups, held, what[0].endpoint, served, config)
    ranked = [g for g in sorted(groups.values(), key=lambda g: -sum(g.served.values()))
              if g.batches >= min_batches]
    return (round(ranked[0].index, 6) if ranked else None), [g.to_json() for g in ranked[:10]]

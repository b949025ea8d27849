"""Fit the simulator's model of the pipeline to what a live run recorded.

``serving-fairness simulate --calibrate SOURCE`` reads the results of a live
run, fits, per endpoint, how long the workers take and the fixed delays
around the scheduler, prints the fitted parameters with their error, and
simulates with them (a :class:`CalibratedPipeline` plugged into
:func:`traffic.simulate.simulate`). ``SOURCE`` is a replay report folder
(its ``results.jsonl``; ``outcomes.jsonl`` where an older report has none) or
``topic:NAME``, results read from a topic of a running deployment.

What a result tells (:class:`~schemas.messages.Result`): the send time
(``created_ms``), when admission let it in (``admitted_ms``) and when the
scheduler read it (``received_ms``), when its batch left the scheduler
(``dispatched_ms``) and reached its worker (``taken_ms``), when its
micro-batch started (``started_ms``) and was done (``completed_ms``:
workers publish each micro-batch as soon as it is done), its share of the
model time (``inference_ms``), its batch and worker. Results of older
workers lack the stamps after ``admitted_ms`` but one; the fit then infers
what they would have said (see below).

The model, per endpoint
-----------------------

* **Worker.** A batch runs in micro-batches, cut as the worker cuts them
  (:func:`worker.microbatch.plan_microbatches`, in the scheduler's run order,
  :func:`scheduler.batch_order.run_order`): where a call more costs less than
  the padding it saves, a call worth ``micro_overhead_ms /
  ms_per_padded_token`` padded tokens, as a worker learns it since
  2026-12-07, when the fit had the workers' start stamps; filled to the
  budget call by call, as older workers cut, when it had not (a run of a
  stamped worker from before 2026-12-07 is simulated with the newer cut:
  its fit's batch error shows it). Micro-batch j takes
  ``micro_overhead_ms + ms_per_padded_token x padded_j`` (padded: its texts
  times its longest one), with ``micro_gap_ms`` between two (publishing the
  first's results); the batch as a whole adds ``batch_overhead_ms`` before
  its first micro-batch (decode, the previous batch's commit and report).
  A request is done when its micro-batch is.
* **Delays** (fixed): *admission*, from the send until the scheduler holds
  the request, plus admission's rate for requests that queue behind their
  own org's earlier ones (an org's requests share an ingress partition,
  decided in order); *delivery*, from the scheduler choosing a batch until
  its worker reads it; *feedback*, from a batch done until the scheduler
  sees its slot free.

How each is fitted
------------------

With the stamps, each part is measured: a micro-batch is the results that
share a ``started_ms``; their durations are fitted against padded tokens
by least squares (the mean, slow batches included: they set the
throughput), the gaps between micro-batches and the time from a batch's
start of work (the later of its ``taken_ms`` and the end of the worker's
previous batch) to its first micro-batch are averaged, and delivery is the
median of ``taken_ms - dispatched_ms``.

Without them, batches are followed per worker in the order they finished. A
batch is *busy* when it was dispatched before the worker finished the
previous one (it waited in the worker), so it started the moment the
previous one ended: its micro-batches (cut as the worker cuts them, in
completion order) give durations end to end, fitted the same way, and the
time from the previous batch's end to its first micro-batch, less that
micro-batch's fitted time, gives the batch overhead. A batch dispatched to
an idle worker (not its first, which pays the warm-up) gives delivery: its
first micro-batch's end less the dispatch, the batch overhead and the
micro-batch's time; without one, delivery is taken to be the feedback hop
(both are one Kafka hop).

Either way: a batch dispatched while the scheduler held work gives
feedback: its dispatch less the latest end on its worker before it. An org
that sent faster than it was admitted queued behind itself, and the largest
such org gives admission's rate; the median time from send to the
scheduler (``received_ms``, else ``admitted_ms``) of every other org's
requests is admission's fixed delay. Each figure is printed with how many
samples it rests on and their median absolute deviation; the worker model
also with the busy batches' mean predicted and measured duration and the
median error.

Limits: per-text lengths are not in a result (each text of a request counts
as tokens / texts); without ``inference_ms`` or busy batches a part falls
back to the simulator's defaults, and says so.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from scheduler.batch_order import run_order
from scheduler.entry import Entry
from schemas.config import Config
from schemas.messages import Result
from worker.call_cost import worth
from worker.microbatch import plan_microbatches

__all__ = [
    "CalibratedPipeline",
    "Calibration",
    "EndpointFit",
    "Observation",
    "calibrate",
    "fit",
    "format_fit",
    "observations_from_report",
    "observations_from_results",
    "read_results_topic",
]

#: The worker's defaults (``serving-fairness worker --microbatch-size/--microbatch-tokens``).
MICROBATCH_SIZE = 32
MICROBATCH_TOKENS = 4096


class Observation(msgspec.Struct, kw_only=True, frozen=True):
    """One ok request as a live run recorded it; times in epoch ms."""

    org: str
    endpoint: str
    tokens: int
    texts: int = 1
    sent_ms: float
    admitted_ms: float
    dispatched_ms: float
    completed_ms: float
    batch_id: str
    worker: str = ""
    inference_ms: float | None = None
    #: Newer stamps (None in older results): read by the scheduler, taken by the
    #: worker, its micro-batch started.
    received_ms: float | None = None
    taken_ms: float | None = None
    started_ms: float | None = None


def observations_from_results(results: Iterable[Result]) -> list[Observation]:
    """The ok results that carry every time stamp, as observations."""
    out = []
    for r in results:
        if (r.status != "ok" or not r.batch_id or r.tokens is None or r.created_ms is None
                or r.admitted_ms is None or r.dispatched_ms is None or r.completed_ms is None):
            continue
        out.append(Observation(
            org=r.org, endpoint=r.endpoint, tokens=r.tokens,
            texts=len(r.truncated) if r.truncated else 1, sent_ms=r.created_ms,
            admitted_ms=r.admitted_ms, dispatched_ms=r.dispatched_ms,
            completed_ms=r.completed_ms, batch_id=r.batch_id, worker=r.worker or "",
            inference_ms=r.inference_ms, received_ms=getattr(r, "received_ms", None),
            taken_ms=getattr(r, "taken_ms", None), started_ms=getattr(r, "started_ms", None)))
    return out


def observations_from_report(folder: str | Path) -> list[Observation]:
    """A replay report: ``results.jsonl`` (one Result per line), else ``outcomes.jsonl``.

    Outcomes carry no model time and no worker (one worker per endpoint is
    assumed) and their times are relative: fine for a fit, which uses
    differences only.
    """
    folder = Path(folder)
    results = folder / "results.jsonl"
    if results.is_file():
        dec = msgspec.json.Decoder(Result)
        with results.open("rb") as f:
            return observations_from_results(dec.decode(line) for line in f if line.strip())
    outcomes = folder / "outcomes.jsonl"
    if not outcomes.is_file():
        raise FileNotFoundError(f"{folder}: neither results.jsonl nor outcomes.jsonl")
    out = []
    with outcomes.open() as f:
        for line in f:
            o = json.loads(line)
            if o.get("status") != "ok" or None in (o.get("admitted_s"), o.get("dispatched_s"),
                                                   o.get("completed_s"), o.get("batch_id")):
                continue
            out.append(Observation(
                org=o["org"], endpoint=o.get("endpoint", ""), tokens=o.get("tokens", 0),
                sent_ms=o["arrival_s"] * 1000, admitted_ms=o["admitted_s"] * 1000,
                dispatched_ms=o["dispatched_s"] * 1000, completed_ms=o["completed_s"] * 1000,
                batch_id=o["batch_id"]))
    return out


async def read_results_topic(kafka, topic: str, *, since_ms: int | None = None,
                             until_ms: int | None = None) -> list[Result]:
    """The results a topic holds, up to each partition's high watermark at the first fetch.

    ``since_ms``/``until_ms`` keep the results whose ``completed_ms`` falls within.
    """
    from aiokafka.structs import TopicPartition

    from plumbing.kafka import make_consumer, stop_consumer
    from schemas.codec import DecodeError, codec_for

    codec = codec_for(Result)
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            raise ValueError(f"topic {topic!r} not found")
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends: dict[TopicPartition, int] = {}
        out: list[Result] = []
        idle = 0
        while idle < 4:  # four empty fetches in a row (2 s): nothing more to read
            batches = await consumer.getmany(timeout_ms=500)
            idle = 0 if batches else idle + 1
            for tp, records in batches.items():
                ends.setdefault(tp, consumer.highwater(tp) or 0)
                for rec in records:
                    if rec.offset >= ends[tp]:
                        continue
                    try:
                        r = codec.decode_record(rec.value, rec.headers)
                    except DecodeError:
                        continue
                    c = r.completed_ms
                    if c is not None and ((since_ms is not None and c < since_ms)
                                          or (until_ms is not None and c > until_ms)):
                        continue
                    out.append(r)
            if len(ends) == len(tps):
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                    break
        return out
    finally:
        await stop_consumer(consumer)


def calibrate(source: str, *, kafka=None, microbatch_size: int = MICROBATCH_SIZE,
              microbatch_tokens: int = MICROBATCH_TOKENS,
              flow_control: str = "slots") -> Calibration:
    """Read ``source`` (a report folder, or ``topic:NAME`` with ``kafka`` settings) and fit."""
    if source.startswith("topic:"):
        import asyncio

        topic = source.removeprefix("topic:")
        if kafka is None or kafka.bootstrap is None:
            raise ValueError(f"{source}: reading a topic needs --bootstrap")
        obs = observations_from_results(asyncio.run(read_results_topic(kafka, topic)))
    else:
        obs = observations_from_report(source)
    if not obs:
        raise ValueError(f"{source}: no ok result with its time stamps to fit")
    return fit(obs, microbatch_size=microbatch_size, microbatch_tokens=microbatch_tokens,
               flow_control=flow_control, source=source)


# -- the fit -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A fitted value, the samples it rests on, and their median absolute deviation."""

    value: float
    samples: int
    mad: float = 0.0
    note: str = ""

    def __str__(self) -> str:
        text = f"{self.value:,.3f}" if abs(self.value) < 10 else f"{self.value:,.1f}"
        if self.samples:
            text += f" (n={self.samples}, MAD {self.mad:,.2f})"
        if self.note:
            text += f" [{self.note}]"
        return text


@dataclass(frozen=True)
class EndpointFit:
    """The fitted model of one endpoint."""

    endpoint: str
    batches: int
    busy_batches: int
    batch_overhead_ms: Figure
    micro_overhead_ms: Figure
    ms_per_padded_token: Figure
    #: Between two micro-batches of a batch (publishing the first's results).
    micro_gap_ms: Figure
    admission_ms: Figure
    admission_rate_rps: Figure
    delivery_ms: Figure
    feedback_ms: Figure
    #: Busy batches: mean predicted and measured duration, and the median absolute error (ms).
    batch_predicted_ms: float
    batch_measured_ms: float
    batch_error_ms: float
    microbatch_size: int
    microbatch_tokens: int
    #: Mean measured duration of the busy batches in the first and second half of the run.
    batch_halves_ms: tuple[float, float] = (0.0, 0.0)
    #: Fitted from the workers' start stamps (else from when micro-batches ended).
    stamped: bool = False
    #: Batches a worker held (0: not measured), and whether a batch's slot came
    #: back when its last micro-batch started (credit flow control) or when done.
    slots: Figure = field(default_factory=lambda: Figure(0, 0))
    release_at_last_micro: bool = False
    #: What each worker's first batch took beyond the model (its warm-up), and how many
    #: workers there were.
    warm_up_ms: Figure = field(default_factory=lambda: Figure(0.0, 0))
    workers: int = 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"endpoint": self.endpoint, "batches": self.batches,
                               "busy_batches": self.busy_batches,
                               "batch_predicted_ms": round(self.batch_predicted_ms, 3),
                               "batch_measured_ms": round(self.batch_measured_ms, 3),
                               "batch_error_ms": round(self.batch_error_ms, 3),
                               "batch_halves_ms": [round(x, 3) for x in self.batch_halves_ms],
                               "microbatch_size": self.microbatch_size,
                               "microbatch_tokens": self.microbatch_tokens,
                               "stamped": self.stamped,
                               "release_at_last_micro": self.release_at_last_micro}
        for name in ("batch_overhead_ms", "micro_overhead_ms", "ms_per_padded_token",
                     "micro_gap_ms", "slots", "warm_up_ms",
                     "admission_ms", "admission_rate_rps", "delivery_ms", "feedback_ms"):
            f: Figure = getattr(self, name)
            out[name] = {"value": round(f.value, 6), "samples": f.samples,
                         "mad": round(f.mad, 6), **({"note": f.note} if f.note else {})}
        return out


@dataclass(frozen=True)
class Calibration:
    endpoints: dict[str, EndpointFit]
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source,
                "endpoints": {k: v.to_json() for k, v in self.endpoints.items()}}


def _median(xs: Sequence[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    m = statistics.median(xs)
    return m, statistics.median(abs(x - m) for x in xs)


def _mean_figure(xs: Sequence[float]) -> Figure:
    """The mean of ``xs`` (>= 0), with the median absolute deviation as its spread."""
    if not xs:
        return Figure(0.0, 0, 0.0, "no samples: 0")
    m = statistics.fmean(xs)
    note = ""
    if m < 0:
        m, note = 0.0, "clamped"
    return Figure(m, len(xs), _median(xs)[1], note)


def _figure(xs: Sequence[float], *, floor: float | None = 0.0, note: str = "") -> Figure:
    if not xs:
        return Figure(0.0, 0, 0.0, note or "no samples: 0")
    m, mad = _median(xs)
    if floor is not None and m < floor:
        m, note = floor, note or "clamped"
    return Figure(m, len(xs), mad, note)


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Intercept and slope of y ~ a + b x by least squares: the mean behaviour.

    Least squares and not a median: a live run's slow batches (a neighbour on
    the CPU, a broker stall) are part of what the pipeline does, and the mean
    batch time is what sets its throughput and how long a request waits for
    the batch ahead of it. If every x is the same (one micro-batch shape) the
    two cannot be told apart and all the time is charged per token; a
    negative intercept is refitted through the origin.
    """
    if not points:
        return None
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    try:
        fit = statistics.linear_regression(xs, ys)
    except statistics.StatisticsError:  # one point, or every x the same
        pass
    else:
        if fit.intercept >= 0 and fit.slope > 0:
            return fit.intercept, fit.slope
    try:
        slope = statistics.linear_regression(xs, ys, proportional=True).slope
    except statistics.StatisticsError:  # one point, or every x 0
        slope = ys[0] / xs[0] if len(xs) == 1 and xs[0] else 0.0
    return 0.0, slope


@dataclass
class _Micro:
    #: When it started (the worker's ``started_ms``; None in older results) and ended.
    start: float | None
    end: float
    padded: int

    @property
    def stamped_start(self) -> float:
        """``start``, where every micro-batch is stamped (the callers check it first)."""
        assert self.start is not None, "a micro-batch without a start stamp"
        return self.start


@dataclass
class _Batch:
    id: str
    worker: str
    dispatched: float
    #: When the worker read it (``taken_ms``; None in older results).
    taken: float | None
    micro: list[_Micro] = field(default_factory=list)

    @property
    def first_end(self) -> float:
        return self.micro[0].end

    @property
    def end(self) -> float:
        return self.micro[-1].end


def _lengths(obs: Observation) -> list[int]:
    n = max(1, obs.texts)
    each = max(1, round(obs.tokens / n))
    return [each] * n


def _padded(members: Sequence[Observation]) -> int:
    lengths = [length for o in members for length in _lengths(o)]
    return len(lengths) * max(lengths)


def _batches(obs: Sequence[Observation], size: int, budget: int) -> list[_Batch]:
    by_id: dict[str, list[Observation]] = {}
    for o in obs:
        by_id.setdefault(o.batch_id, []).append(o)
    out = []
    for bid, members in by_id.items():
        members.sort(key=lambda o: o.completed_ms)
        taken = [o.taken_ms for o in members if o.taken_ms is not None]
        b = _Batch(bid, members[0].worker, min(o.dispatched_ms for o in members),
                   min(taken) if taken else None)
        if all(o.started_ms is not None for o in members):
            # Stamped: a micro-batch is the results that share its start.
            groups: dict[float, list[Observation]] = {}
            for o in members:
                if o.started_ms is not None:  # every one, checked above
                    groups.setdefault(o.started_ms, []).append(o)
            for start in sorted(groups):
                g = groups[start]
                b.micro.append(_Micro(start, max(o.completed_ms for o in g), _padded(g)))
        else:
            # Cut as the worker cuts it; results came back in completion order, so
            # micro-batch j is the next len(plan[j]) texts in that order.
            lengths, owner = [], []
            for k, o in enumerate(members):
                for length in _lengths(o):
                    lengths.append(length)
                    owner.append(k)
            plan = plan_microbatches(lengths, max_padded_tokens=budget, max_size=size,
                                     order="given")
            pos = 0
            for group in plan:
                texts = range(pos, pos + len(group))
                pos += len(group)
                mine = [members[k] for k in sorted({owner[t] for t in texts})]
                b.micro.append(_Micro(None, max(o.completed_ms for o in mine),
                                      len(group) * max(lengths[t] for t in texts)))
        out.append(b)
    return out


def fit(observations: Sequence[Observation], *, microbatch_size: int = MICROBATCH_SIZE,
        microbatch_tokens: int = MICROBATCH_TOKENS, flow_control: str = "slots",
        source: str = "") -> Calibration:
    """Fit every endpoint the observations cover (see the module docstring).

    ``flow_control`` is the live pipeline's (``service.flow_control``): with
    ``credit`` a worker gives a batch's slot back when its last micro-batch
    starts, with ``slots`` when the batch is done.
    """
    by_ep: dict[str, list[Observation]] = {}
    for o in observations:
        by_ep.setdefault(o.endpoint, []).append(o)
    fits = {ep: _fit_endpoint(ep, obs, microbatch_size, microbatch_tokens,
                              flow_control == "credit")
            for ep, obs in sorted(by_ep.items())}
    return Calibration(fits, source)


def _fit_endpoint(endpoint: str, obs: Sequence[Observation], size: int,
                  budget: int, credit: bool = False) -> EndpointFit:
    batches = _batches(obs, size, budget)
    per_worker: dict[str, list[_Batch]] = {}
    for b in batches:
        per_worker.setdefault(b.worker, []).append(b)
    busy: list[tuple[_Batch, float]] = []  # (batch, previous batch's end on its worker)
    idle: list[_Batch] = []
    prev_end: dict[str, float | None] = {}
    for chain in per_worker.values():
        chain.sort(key=lambda b: b.first_end)
        for prev, b in zip([None, *chain[:-1]], chain, strict=True):
            prev_end[b.id] = prev.end if prev is not None else None
            if prev is not None and b.dispatched < prev.end:
                busy.append((b, prev.end))
            else:
                idle.append(b)
    stamped = bool(batches) and all(m.start is not None for b in batches for m in b.micro)
    if stamped:
        fit_ = _fit_stamped(batches, prev_end)
    else:
        fit_ = _fit_from_ends(batches, busy, idle, per_worker)
    a, per, gap, bo = (fit_[k].value for k in ("micro", "per", "gap", "head"))

    def batch_ms(b: _Batch) -> float:
        return bo + sum(a + per * m.padded for m in b.micro) + gap * (len(b.micro) - 1)

    # A worker's first batch pays its warm-up (first calls of the model in these shapes).
    warm = [b.end - (b.taken if b.taken is not None else b.dispatched) - batch_ms(b)
            for chain in per_worker.values() for b in chain[:1]]
    warm_up = _mean_figure(warm)
    pairs = [(batch_ms(b), b.end - pe) for b, pe in busy]
    # The model is one service time for the whole run: say when the run's changed.
    half = len(pairs) // 2
    halves = ((statistics.fmean(m for _, m in pairs[:half]),
               statistics.fmean(m for _, m in pairs[half:])) if half else (0.0, 0.0))
    predicted_ms = statistics.fmean(p for p, _ in pairs) if pairs else 0.0
    measured_ms = statistics.fmean(m for _, m in pairs) if pairs else 0.0
    err_ms = statistics.median(abs(p - m) for p, m in pairs) if pairs else 0.0
    # A batch's slot comes back when its last micro-batch starts (credit) or when
    # it is done: feedback is a dispatch while the scheduler held work, after the
    # latest slot returned on its worker; the slots in use are counted at each.
    credit = credit and stamped

    def released(b: _Batch) -> float:
        return b.micro[-1].stamped_start if credit else b.end

    frees = {w: sorted(released(b) for b in chain) for w, chain in per_worker.items()}
    pending = sorted((_entered(o), o.dispatched_ms) for o in obs)
    feedback, in_use = [], []
    for b in batches:
        before = [e for e in frees[b.worker] if e <= b.dispatched]
        # Work was waiting: a request held before the slot freed left at or after b.
        if before and any(held < before[-1] and disp >= b.dispatched for held, disp in pending):
            feedback.append(b.dispatched - before[-1])
            in_use.append(sum(1 for c in per_worker[b.worker]
                              if c.dispatched <= b.dispatched < released(c)))
    feedback_fig = _figure(feedback)
    slots = (Figure(max(1, round(statistics.median(in_use))), len(in_use),
                    _median(in_use)[1], "batches a worker held, counted at each dispatch")
             if in_use else Figure(0, 0, 0.0, "not measured: the configuration's"))
    delivery = fit_["delivery"]
    if not delivery.samples:
        # Both are one Kafka hop (a produce and a fetch), the other way round.
        delivery = Figure(feedback_fig.value, 0, 0.0,
                          "no idle batch after a worker's first: the feedback hop")
    admission, rate = _admission(obs)
    return EndpointFit(endpoint=endpoint, batches=len(batches), busy_batches=len(busy),
                       batch_overhead_ms=fit_["head"], micro_overhead_ms=fit_["micro"],
                       ms_per_padded_token=fit_["per"], micro_gap_ms=fit_["gap"],
                       admission_ms=admission, admission_rate_rps=rate, delivery_ms=delivery,
                       feedback_ms=feedback_fig, batch_predicted_ms=predicted_ms,
                       batch_measured_ms=measured_ms, batch_error_ms=err_ms,
                       batch_halves_ms=halves,
                       microbatch_size=size, microbatch_tokens=budget, stamped=stamped,
                       slots=slots, release_at_last_micro=credit, warm_up_ms=warm_up,
                       workers=len(per_worker))


def _call_tokens(f: EndpointFit) -> float:
    """What the fitted worker counted a call as when it cut a batch (padded tokens).

    A worker since 2026-12-07 cuts where a call more costs less than the padding
    it saves, a call worth its fixed cost over a token's as it fits them on its own
    calls (``worker/call_cost.py``): the regression :func:`_fit_stamped` makes of
    the same micro-batches. A fit without start stamps is of an older worker, which
    filled each call to its budget (0).
    """
    if not f.stamped:
        return 0.0
    return worth(f.micro_overhead_ms.value, f.ms_per_padded_token.value, f.microbatch_tokens)


def _fit_stamped(batches: Sequence[_Batch], prev_end: dict[str, float | None]
                 ) -> dict[str, Figure]:
    """With the workers' start stamps every part is measured on its own."""
    points = [(float(m.padded), m.end - m.stamped_start) for b in batches for m in b.micro]
    a, per = _line(points) or (0.0, 0.0)
    resid = [y - (a + per * x) for x, y in points]
    gaps = [q.stamped_start - p.end for b in batches for p, q in zip(b.micro, b.micro[1:], strict=False)]
    heads, delivery = [], []
    for b in batches:
        if b.taken is None:
            continue
        delivery.append(b.taken - b.dispatched)
        pe = prev_end.get(b.id)
        begin = b.taken if pe is None else max(b.taken, pe)
        heads.append(b.micro[0].stamped_start - begin)
    return {"micro": Figure(a, len(points), _median(resid)[1]),
            "per": Figure(per, len(points)),
            "gap": _mean_figure(gaps), "head": _mean_figure(heads),
            "delivery": _figure(delivery)}


def _fit_from_ends(batches, busy, idle, per_worker) -> dict[str, Figure]:
    """Without start stamps: from when micro-batches ended, in busy batches."""
    durations = [(float(m.padded), m.end - p.end) for b, _ in busy
                 for p, m in zip(b.micro, b.micro[1:], strict=False)]
    line = _line(durations)
    note = ""
    if line is None:
        line, note = (5.0, 0.28), "no busy batch of two micro-batches: the simulator's defaults"
    a, per = line
    resid = [y - (a + per * x) for x, y in durations]
    heads = [b.first_end - pe - (a + per * b.micro[0].padded) for b, pe in busy]
    head = _mean_figure(heads)
    # A worker's first batch also pays its warm-up: not a delivery sample.
    firsts = {id(chain[0]) for chain in per_worker.values()}
    delivery = _figure([b.first_end - b.dispatched - head.value - (a + per * b.micro[0].padded)
                        for b in idle if id(b) not in firsts])
    return {"micro": Figure(a, len(durations), _median(resid)[1], note),
            "per": Figure(per, len(durations), 0.0, note),
            "gap": Figure(0.0, 0, 0.0, "in the micro-batch overhead: no start stamps"),
            "head": head, "delivery": delivery}


def _drifted(halves: tuple[float, float], ratio: float = 1.3) -> bool:
    a, b = halves
    return min(a, b) > 0 and max(a, b) / min(a, b) > ratio


def _entered(o: Observation) -> float:
    """When the scheduler could hold it: read off its tier topic, else admitted."""
    return o.received_ms if o.received_ms is not None else o.admitted_ms


def _admission(obs: Sequence[Observation]) -> tuple[Figure, Figure]:
    """Admission's fixed delay, and the rate it admits an org's queued requests at.

    An org that sent faster than it was admitted queued behind its own
    requests (they share an ingress partition and are decided in order): the
    largest such org gives the rate. Every other org's requests waited only
    for admission itself: the median of their send-to-admitted times is the
    fixed delay.
    """
    by_org: dict[str, list[Observation]] = {}
    for o in obs:
        by_org.setdefault(o.org, []).append(o)
    light: list[float] = []
    queued: list[tuple[float, int]] = []  # (admitted per second, requests)
    for members in by_org.values():
        members.sort(key=lambda o: o.sent_ms)
        n = len(members)
        sent_span = members[-1].sent_ms - members[0].sent_ms
        admitted = sorted(_entered(o) for o in members)
        admitted_span = admitted[-1] - admitted[0]
        if n >= 10 and admitted_span > 0:
            admit_rate = (n - 1) / admitted_span
            send_rate = (n - 1) / sent_span if sent_span > 0 else float("inf")
            if send_rate > 2 * admit_rate:
                queued.append((admit_rate * 1000, n))
                continue
        light.extend(_entered(o) - o.sent_ms for o in members)
    admission = _figure(light, note="" if light else "every org queued behind itself: 0")
    if queued:
        rate, n = max(queued, key=lambda q: q[1])
        return admission, Figure(rate, n, 0.0, "the largest org that sent faster than admitted")
    return admission, Figure(0.0, 0, 0.0, "no org queued behind itself: unlimited")


def format_fit(cal: Calibration) -> str:
    """The fitted parameters and their error, one block per endpoint."""
    lines = [f"calibrated from {cal.source}" if cal.source else "calibration"]
    for ep, f in cal.endpoints.items():
        lines += [
            (f"  {ep}: {f.batches} batches ({f.busy_batches} busy), "
             + ("micro-batches as the workers stamped them" if f.stamped else
                f"micro-batches of <= {f.microbatch_size} texts / {f.microbatch_tokens} "
                "padded tokens")),
            f"    batch overhead ms        {f.batch_overhead_ms}",
            f"    micro-batch overhead ms  {f.micro_overhead_ms}",
            f"    ms per padded token      {f.ms_per_padded_token.value:.6f}",
            f"    between micro-batches ms {f.micro_gap_ms}",
            f"    a worker's first batch   +{f.warm_up_ms} ms (warm-up; {f.workers} worker(s))",
            (f"    busy batches: predicted {f.batch_predicted_ms:,.1f} ms on average, measured "
             f"{f.batch_measured_ms:,.1f} ms; median absolute error {f.batch_error_ms:,.1f} ms"),
            (f"    busy batches measured {f.batch_halves_ms[0]:,.1f} ms in the run's first half, "
             f"{f.batch_halves_ms[1]:,.1f} ms in its second"
             + (": the service time changed during the run, the fit averages it"
                if _drifted(f.batch_halves_ms) else "")),
            f"    admission delay ms       {f.admission_ms}",
            f"    admission rate /s        {f.admission_rate_rps}",
            f"    delivery ms              {f.delivery_ms}",
            f"    feedback ms              {f.feedback_ms}",
            f"    slots per worker         {f.slots}, each returned "
            + ("when its last micro-batch starts" if f.release_at_last_micro else "when done"),
        ]
    return "\n".join(lines)


# -- the fitted world, for the simulator ----------------------------------------------------


class CalibratedPipeline:
    """The world around the core as fitted: :class:`traffic.simulate.Pipeline`.

    Endpoints the fit has no data for use ``fallback`` (the simulator's
    :class:`~traffic.simulate.ServiceModel`) and no delays.
    """

    def __init__(self, cal: Calibration, config: Config, fallback, policy: str = "drr",
                 fitted_slots: bool = True):
        self.cal = cal
        #: Hold as many batches per worker as the live run did (else SimSettings.slots).
        self.fitted_slots = fitted_slots
        #: Batches served so far per endpoint: the first of each worker pays the warm-up.
        self.served: dict[str, int] = {}
        self.tier_names = config.tier_names
        self.fallback = fallback
        #: The service hands drr batches over in run order, fifo batches as chosen.
        self.run_order = policy != "fifo"

    def _fit(self, endpoint: str) -> EndpointFit | None:
        return self.cal.endpoints.get(endpoint)

    def enter_times(self, records: Sequence) -> list[float]:
        """When each record may be held by the scheduler: admission's delay and rate per org."""
        last: dict[str, float] = {}
        out = []
        for r in records:
            f = self._fit(r.endpoint)
            if f is None:
                out.append(r.ts)
                continue
            t = r.ts + f.admission_ms.value / 1000
            rate = f.admission_rate_rps.value
            if rate > 0 and r.org in last:
                t = max(t, last[r.org] + 1.0 / rate)
            last[r.org] = t
            out.append(t)
        return out

    def delivery_s(self, endpoint: str) -> float:
        f = self._fit(endpoint)
        return f.delivery_ms.value / 1000 if f else 0.0

    def feedback_s(self, endpoint: str) -> float:
        f = self._fit(endpoint)
        return f.feedback_ms.value / 1000 if f else 0.0

    def slots(self, endpoint: str) -> int | None:
        """Batches a worker held in the live run (None: not measured)."""
        f = self._fit(endpoint)
        if not self.fitted_slots or f is None or f.slots.value < 1:
            return None
        return int(f.slots.value)

    def serve(self, endpoint: str,
              entries: Sequence[Entry]) -> tuple[float, list[float], float]:
        """Seconds the batch holds its worker, from its start to each entry's result, and
        until its slot comes back (its last micro-batch's start with credit flow control)."""
        f = self._fit(endpoint)
        if f is None:
            took = self.fallback.batch_s(sum(e.tokens for e in entries))
            return took, [took] * len(entries), took
        order = run_order(entries, self.tier_names) if self.run_order else list(entries)
        lengths = [e.tokens for e in order]
        plan = plan_microbatches(lengths, max_padded_tokens=f.microbatch_tokens,
                                 max_size=f.microbatch_size, order="given",
                                 call_tokens=_call_tokens(f))
        t = f.batch_overhead_ms.value
        n = self.served[endpoint] = self.served.get(endpoint, 0) + 1
        if n <= f.workers:
            t += f.warm_up_ms.value
        done: dict[int, float] = {}
        last_start = t
        for k, group in enumerate(plan):
            padded = len(group) * max(lengths[i] for i in group)
            if k:
                t += f.micro_gap_ms.value
            last_start = t
            t += f.micro_overhead_ms.value + f.ms_per_padded_token.value * padded
            for i in group:
                done[id(order[i])] = t / 1000
        release = last_start if f.release_at_last_micro else t
        return t / 1000, [done[id(e)] for e in entries], release / 1000

"""The simulator: the scheduler core on a virtual clock, fed by a trace.

Why: the fairness claims (a burst does not hurt a quiet org, weights are
honoured, batches stay full) must be checkable in seconds, deterministically,
without Kafka or a GPU. The simulator drives the *same* :class:`Scheduler`
the live service uses; only the world around it is modelled.

The model (discrete events, no wall clock anywhere):

* **Arrivals** come from the trace at their ``ts``. Admission is instant.
  As the live admission does, a request naming an unknown org or endpoint,
  asking for a priority above its tier's cap, or larger than the endpoint's
  ``max_request_tokens`` is ``invalid``, and the tier comes from the
  configuration. With an :class:`Admission` plugged in (``--admission``:
  :class:`PipelineAdmission`, the rate limiter, overload check and throttle
  of :mod:`producer`), a refused request is ``rejected`` with its reason;
  the simulator hands it a :class:`SchedulerState` every
  ``service.state_interval_ms``, as the live scheduler publishes one.
  Without it nothing is rejected: the scheduler is measured alone.
* **Workers**: each endpoint gets ``workers`` workers with ``slots`` slots.
  A worker runs its batches one at a time (one GPU), holding at most
  ``slots`` of them; a slot frees when its batch is done. The scheduler is
  asked for a batch whenever a slot is free and requests are held, so the
  system is work-conserving, and a batch is chosen as late as the live
  design chooses it.
* **Express batches** (``SimSettings.express``, on as live; DRR only): with
  every slot taken, an org that came in with nothing held goes out at once
  in a batch of its own (:meth:`Scheduler.has_fresh`), one per worker until
  it starts (calibrated: until the scheduler hears so, the feedback hop later;
  it looks again at that moment), beyond the slots; it runs after the model
  call in progress (the whole batch uncalibrated, one micro-batch with
  ``--calibrate``) and the calls queued behind that move back by its time.
  Behind its fresh requests it is topped up in DRR order to
  ``SimSettings.express_fill`` of a full batch's tokens, as live
  (``SF_SCHEDULER_EXPRESS_FILL``); uncalibrated, it is two calls as the live
  worker plans it: what comes before its largest org's first request (the
  fresh requests) first, done at that call's end, then the rest (one call
  where there is no such head). It is not a share-out among backlogged
  orgs, so the Jain accounting below leaves it out. With
  ``SimSettings.express_horizon`` (``SF_SCHEDULER_EXPRESS_HORIZON`` live)
  none goes out while a worker's work in hand ends within that many
  full-batch times (live counts the work whose credit the worker has not
  returned); the next regular batch takes the fresh orgs' requests first.
  Not modelled: the live worker running an express batch's call inside the
  call waiting next (:class:`worker.model_thread.Joinable`); here it pays
  its own overhead, so express batches cost more than they do live.
* **Service time** of a batch: ``overhead_ms + ms_per_token x batch
  tokens``. The defaults, 5 ms + 0.28 ms/token (about 3,500 tokens/s, a full
  4,096-token batch in 1.15 s), resemble all-MiniLM-L6-v2 on a few CPU
  cores; on a GPU use e.g. ``--overhead-ms 3 --ms-per-token 0.005``.
  Each served request's share of its batch's time is fed back with
  :meth:`Scheduler.feedback`, so the ``adaptive`` cost model learns: the
  overhead split evenly over the batch's requests, the per-token time by its
  tokens (:meth:`ServiceModel.shares_s`). So an org of short requests costs
  more per token than an org of long ones, as padding and per-sequence work
  make it on a real model.
* **Deadlines**: the clock also stops at the earliest held deadline;
  :meth:`Scheduler.expire` returns what is due and each such request is
  counted ``expired``, never served.

Every request of the trace leaves exactly once, as one :class:`Outcome`
(ok, rejected, expired or invalid). Latency runs from arrival to the end of
the request's batch.

Jain's fairness index over backlogged orgs
------------------------------------------

Jain's index of allocations ``x_1..x_n`` is ``(sum x)^2 / (n sum x^2)``:
1 when all are equal, ``1/n`` when one org gets everything. It measures
fairness only among orgs that *wanted more than they got*: an org whose
queue empties was given all it asked for, and comparing its small share
with a flooder's would call perfect DRR unfair. So:

* an org is **backlogged across a decision** when the scheduler still holds
  one of its requests right after assembling a batch (it competed for that
  batch and was not satisfied by it);
* for every batch, in each (endpoint, tier), the set S of orgs backlogged
  across it is noted, with what each org of S was served in that batch
  (its cost in the lane's units; often nothing);
* for each distinct S with at least two orgs, over all batches with that
  exact set -- the period in which all of them, and only they, were
  backlogged -- ``x_i = served cost of org i / weight of org i``, and
  ``J(S)`` is Jain's index of those ``x_i``;
* ``jain_index`` is ``J(S)`` of the set with the most served cost (the
  main contention of the run); every set is listed under ``jain``. With no
  set of two orgs it is ``None``: no two orgs ever waited together, so there
  was nothing to share.

DRR keeps ``|served_i/w_i - served_j/w_j| <= quantum + 2 x max cost`` while
i and j are backlogged, so over a period of many rounds ``J(S)`` tends to 1.
The FIFO baseline serves in arrival order: in the noisy-neighbour trace the
quiet org waits behind the whole burst, served nothing, and ``J`` is 0.5.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from scheduler.core import Policy, Scheduler
from scheduler.entry import NO_DEADLINE, Entry
from scheduler.snapshot import half_batch, sets_rate
from schemas.config import Config, ConfigError, load_config
from schemas.messages import LaneState, SchedulerState
from traffic.report import Outcome, QueueSample, compare, format_table, summarize, write_report
from traffic.trace import TraceError, TraceRecord, read_trace
from worker.microbatch import express_head

__all__ = [
    "Admission",
    "JainGroup",
    "PipelineAdmission",
    "ServiceModel",
    "SimResult",
    "SimSettings",
    "add_arguments",
    "count_backlogged",
    "jain",
    "run",
    "simulate",
]


@dataclass(frozen=True)
class ServiceModel:
    """How long a batch takes: a fixed overhead plus a cost per token."""

    overhead_ms: float = 5.0
    ms_per_token: float = 0.28

    def batch_s(self, tokens: int) -> float:
        return (self.overhead_ms + self.ms_per_token * tokens) / 1000.0

    def shares_s(self, tokens: Sequence[int]) -> list[float]:
        """Each request's share of its batch's time: the overhead split evenly (a cost per
        sequence), the rest by its own tokens. They add up to :meth:`batch_s` of the batch;
        per token, a short request costs more than a long one."""
        overhead_ms = self.overhead_ms / len(tokens) if tokens else 0.0
        return [(overhead_ms + self.ms_per_token * t) / 1000.0 for t in tokens]


class Pipeline(Protocol):
    """The live pipeline around the scheduler, fitted to a run (:mod:`traffic.calibrate`).

    Without one, admission is instant, a freed slot is refilled at once and a
    batch takes :class:`ServiceModel` time, every request done with its batch.
    """

    def enter_times(self, records: Sequence[TraceRecord]) -> list[float]:
        """When each record (in trace order) reaches the scheduler."""

    def delivery_s(self, endpoint: str) -> float:
        """From a batch chosen until its worker may start it."""

    def feedback_s(self, endpoint: str) -> float:
        """From a batch done until the scheduler sees its slot free."""

    def slots(self, endpoint: str) -> int | None:
        """Batches a worker holds (None: ``SimSettings.slots``)."""

    def serve(self, endpoint: str,
              entries: Sequence[Entry]) -> tuple[float, list[float], float]:
        """Seconds the batch holds its worker, from its start to each entry's result, and
        from its start until its slot comes back."""


class Admission(Protocol):
    """Admission control plugged into the simulator (rate limits, overload, throttle)."""

    def observe(self, state: SchedulerState, now: float) -> None:
        """The scheduler's latest snapshot, every ``service.state_interval_ms``."""

    def admit(self, record: TraceRecord, tier: str, now: float) -> str | None:
        """None to admit ``record`` at ``now``, else the reason it is rejected."""


@dataclass
class SimSettings:
    """Everything that shapes a simulated run besides the configuration and the trace."""

    policy: Policy = "drr"
    #: Workers per endpoint.
    workers: int = 1
    #: Batches a worker may hold at once (it runs them one after the other).
    slots: int = 1
    service: ServiceModel = field(default_factory=ServiceModel)
    #: Queue depth is sampled at most this often (virtual seconds).
    sample_interval_s: float = 0.1
    admission: Admission | None = None
    pipeline: Pipeline | None = None
    #: The live scheduler's express batches (``SF_SCHEDULER_EXPRESS_BATCHES``, on by
    #: default; DRR lanes only): with every slot taken, an org that came in with
    #: nothing held goes out at once in a batch of its own, one per worker until
    #: it is heard to have started, run after the model call in progress and
    #: ahead of those queued (the module's docstring has the details).
    express: bool = True
    #: The share of a full batch's tokens an express batch is topped up to
    #: (``SF_SCHEDULER_EXPRESS_FILL``, the same default).
    express_fill: float = 0.0
    #: No express batch while a worker's work in hand ends within this many full-batch
    #: times; the next regular batch takes the fresh orgs' requests first
    #: (``SF_SCHEDULER_EXPRESS_HORIZON``, the same default, 0: no such wait).
    express_horizon: float = 0.0


@dataclass
class JainGroup:
    """One set of orgs backlogged together, and what each was served meanwhile."""

    endpoint: str
    tier: str
    orgs: tuple[str, ...]
    batches: int
    served: dict[str, float]
    weights: dict[str, float]

    @property
    def index(self) -> float:
        return jain([self.served[o] / self.weights[o] for o in self.orgs])

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "tier": self.tier, "orgs": list(self.orgs),
                "batches": self.batches, "served_cost": {o: round(v, 3) for o, v in
                                                         self.served.items()},
                "weights": self.weights, "index": round(self.index, 6)}


def jain(xs: Sequence[float]) -> float:
    """Jain's index ``(sum x)^2 / (n sum x^2)``; 1.0 for all zeros (nobody favoured)."""
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq else 1.0


def count_backlogged(groups: dict[tuple[str, str, frozenset[str]], JainGroup],
                     held: Mapping[tuple[str, str], Collection[str]], endpoint: str,
                     served: Mapping[tuple[str, str], float], config: Config) -> None:
    """Count one batch of ``endpoint`` in every set of orgs backlogged across it.

    ``held`` names, per (endpoint, tier), the orgs holding requests while the
    batch went out; two or more of one tier are a set, its group in
    ``groups`` made on first sight (weights from the registry, 1 for an org
    not in it). Each of the set's orgs is credited what ``served`` says the
    batch gave it, by (tier, org). The simulator and the replay's estimate
    (:func:`traffic.replay_outcomes.live_jain`) both count this way.
    """
    for (ep, tier), orgs_held in held.items():
        if ep != endpoint or len(orgs_held) < 2:
            continue
        key = (ep, tier, frozenset(orgs_held))
        g = groups.get(key)
        if g is None:
            orgs = tuple(sorted(orgs_held))
            weights = {o: config.orgs[o].weight if o in config.orgs else 1.0 for o in orgs}
            g = groups[key] = JainGroup(ep, tier, orgs, 0, dict.fromkeys(orgs, 0.0), weights)
        g.batches += 1
        for org in g.orgs:
            g.served[org] += served.get((tier, org), 0.0)


@dataclass
class SimResult:
    """A run's outcomes, queue samples and fairness groups."""

    outcomes: list[Outcome]
    samples: list[QueueSample]
    groups: list[JainGroup]
    meta: dict[str, Any]

    @property
    def main_group(self) -> JainGroup | None:
        return max(self.groups, key=lambda g: sum(g.served.values()), default=None)

    def summary(self) -> dict[str, Any]:
        """:func:`traffic.report.summarize` plus ``jain_index``, ``jain`` and ``meta``."""
        g = self.main_group
        groups = sorted(self.groups, key=lambda g: -sum(g.served.values()))[:10]
        extra: dict[str, Any] = {
            "meta": self.meta,
            "jain_index": round(g.index, 6) if g else None,
            "jain": [x.to_json() for x in groups],
        }
        if g is None:
            extra["jain_note"] = "no two orgs of one tier stayed backlogged across a batch"
        return summarize(self.outcomes, **extra)


class _Run:
    """One batch at a worker: what it carries, when it starts (moved back when an express
    batch goes ahead of it), how long it holds the worker, and when its slot comes back
    relative to its end."""

    __slots__ = ("back_s", "batch_id", "charged", "dispatched", "endpoint", "express",
                 "offsets", "paused_s", "start", "took", "version", "worker")

    def __init__(self, worker: _Worker, endpoint: str, batch_id: str,
                 charged: list[tuple[Entry, float]], dispatched: float, *, start: float,
                 took: float, offsets: list[float] | None, back_s: float, express: bool):
        self.worker, self.endpoint, self.batch_id = worker, endpoint, batch_id
        self.charged, self.dispatched = charged, dispatched
        self.start, self.took, self.offsets, self.back_s = start, took, offsets, back_s
        self.express = express
        #: Of ``took``, the time express calls ran between its own calls.
        self.paused_s = 0.0
        #: Bumped when ``start`` or ``took`` moves: the done event pushed before it is stale.
        self.version = 0

    @property
    def slot_back(self) -> float:
        return self.start + self.took + self.back_s


class _Worker:
    __slots__ = ("free_at", "name", "runs", "tokens_per_s")

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0
        #: The batches it holds, in the order it runs them.
        self.runs: list[_Run] = []
        #: Moving average of tokens per second while busy, as the live
        #: scheduler measures it from ``batch_done`` reports (0 = unknown).
        self.tokens_per_s = 0.0

    @property
    def in_hand(self) -> int:
        return len(self.runs)

    def holds_express(self, now: float, lag_s: float = 0.0) -> bool:
        """Does it hold an express batch the scheduler cannot yet know started by ``now``?
        (The live worker returns a batch's credit as it starts it, an express one's too;
        the scheduler hears of it ``lag_s`` later, the fitted feedback hop.)"""
        return any(r.express and r.start + lag_s > now for r in self.runs)

    def place_express(self, at: float, took: float) -> tuple[float, list[_Run]]:
        """Where an express batch arriving at ``at`` runs: after the model call running then
        (if any), ahead of every call not started by then; (its start, the batches it moves).

        As live (:mod:`worker.model_thread`), the call in progress is one micro-batch when
        the run knows its calls (``offsets``, calibrated): the express call goes between it
        and the running batch's next call, whose results and end move back by ``took``.
        Uncalibrated, a batch is one call, so the express call follows the whole batch.
        """
        running = None
        for r in self.runs:  # in start order: the latest started one holds the model
            if r.start <= at < r.start + r.took:
                running = r
        start, split = at, None
        if running is not None:
            start = running.start + running.took
            if running.offsets:
                call_end = min((o for o in running.offsets if running.start + o > at),
                               default=running.took)
                if call_end < running.took:  # not its last call: the express goes next
                    start, split = running.start + call_end, call_end
        moved = [r for r in self.runs if r.start >= start]
        for r in moved:
            r.start += took
            r.version += 1
        if running is not None and split is not None and running.offsets is not None:
            # (split is set only where the running batch has offsets)
            running.offsets = [o + took if o > split else o for o in running.offsets]
            running.took += took
            running.paused_s += took
            running.version += 1
            moved.append(running)
        return start, moved


#: Orgs listed per lane in the snapshot handed to admission (the live default).
_SNAPSHOT_TOP_ORGS = 20


def _express_calls(service: ServiceModel, batch: Sequence[Entry]
                   ) -> tuple[float, list[float] | None]:
    """An express batch's time and each request's end in it (None: the batch's), as the
    live worker runs it uncalibrated: what comes before its largest org's first request
    (its fresh requests) in a call of its own, first, the rest in a second call
    (:func:`worker.microbatch.plan_with_head`); one call where that is all of it."""
    head = express_head([e.org for e in batch])
    if not head:
        return service.batch_s(sum(e.tokens for e in batch)), None
    head_s = service.batch_s(sum(e.tokens for e in batch[:head]))
    took = head_s + service.batch_s(sum(e.tokens for e in batch[head:]))
    return took, [head_s] * head + [took] * (len(batch) - head)


def simulate(config: Config, records: Sequence[TraceRecord],
             settings: SimSettings | None = None) -> SimResult:
    """Run ``records`` (sorted by ``ts``, as :func:`read_trace` gives them) through the core."""
    s = settings or SimSettings()
    if s.workers < 1 or s.slots < 1:
        raise ValueError("workers and slots must be at least 1")
    if not 0.0 <= s.express_fill <= 1.0:
        raise ValueError(f"express_fill must be within 0 and 1, not {s.express_fill}")
    if not s.express_horizon >= 0:
        raise ValueError(f"express_horizon must be 0 or more, not {s.express_horizon}")
    sched = Scheduler(config, s.policy)
    pools = {ep: [_Worker(f"{ep}-w{i}") for i in range(s.workers)] for ep in config.endpoints}
    outcomes: list[Outcome] = []
    samples: list[QueueSample] = []
    # Held [requests, tokens] per (endpoint, tier) and org: backlogged sets, snapshots.
    held: dict[tuple[str, str], dict[str, list[int]]] = {}
    groups: dict[tuple[str, str, frozenset[str]], JainGroup] = {}
    # Batches in flight: (slot back at, seq, the run's version then, run); an event
    # whose version is not its run's is stale (the run moved, and was pushed again).
    done: list[tuple[float, int, int, _Run]] = []
    #: When the scheduler hears an express batch started: its worker may take the next
    #: one then, so it looks again at that moment, not only at the next arrival or done.
    wakes: list[float] = []
    seq = 0
    n_batches = 0
    state_every = config.service.state_interval_ms / 1000.0
    next_state = 0.0
    pipe = s.pipeline
    # When each record reaches the scheduler, and the order they do.
    enter = pipe.enter_times(records) if pipe is not None else [r.ts for r in records]
    arrivals = sorted(range(len(records)), key=lambda k: (enter[k], k))
    entered: dict[str, float] = {}
    slots_of = {ep: (pipe.slots(ep) if pipe is not None else None) or s.slots for ep in pools}
    full_s = {ep: s.service.batch_s(config.endpoints[ep].max_batch_tokens) for ep in pools}

    def unhold(ep: str, e: Entry) -> None:
        counts = held[(ep, e.tier)]
        c = counts[e.org]
        c[0] -= 1
        c[1] -= e.tokens
        if not c[0]:
            del counts[e.org]

    def expired(ep: str, entries: list[Entry], now: float) -> None:
        for e in entries:
            unhold(ep, e)
            outcomes.append(Outcome(id=e.id, org=e.org, tier=e.tier, endpoint=ep,
                                    status="expired", reason="deadline_passed", tokens=e.tokens,
                                    arrival_s=e.arrival, admitted_s=entered.get(e.id, e.arrival),
                                    completed_s=now))

    def snapshot(now: float) -> SchedulerState:
        lanes = {}
        for ep, st in sched.stats().items():
            per_tier = {t: c for (e, t), c in held.items() if e == ep and c}
            org_tokens: dict[str, int] = {}
            for c in per_tier.values():
                for org, (_, tok) in c.items():
                    org_tokens[org] = org_tokens.get(org, 0) + tok
            top = sorted(org_tokens.items(), key=lambda kv: -kv[1])[:_SNAPSHOT_TOP_ORGS]
            pool = pools[ep]
            lanes[ep] = LaneState(
                endpoint=ep, held_requests=st.held,
                held_cost_by_tier={t: float(v) for t, v in st.held_tokens_by_tier.items()},
                held_tokens_by_tier=st.held_tokens_by_tier,
                tokens_per_s=sum(w.tokens_per_s for w in pool),
                free_slots=sum(s.slots - w.in_hand for w in pool), workers=len(pool),
                active_orgs_by_tier={t: len(c) for t, c in per_tier.items()},
                org_held_tokens=dict(top))
        return SchedulerState(sent_ms=int(now * 1000), lanes=lanes, held_requests=sched.held)

    def arrive(r: TraceRecord) -> None:
        nonlocal next_state
        base: dict[str, Any] = {"id": r.id, "org": r.org, "endpoint": r.endpoint,
                                "tokens": r.tokens, "arrival_s": r.ts}
        ep = config.endpoints.get(r.endpoint)
        org = config.orgs.get(r.org)
        reason = ("unknown_org" if org is None else "unknown_endpoint" if ep is None else
                  "priority_above_cap" if r.priority > config.priority_cap(org.tier, r.endpoint)
                  else "too_many_tokens" if r.tokens > ep.max_request_tokens else None)
        if reason:
            outcomes.append(Outcome(**base, tier=org.tier if org else "", status="invalid",
                                    reason=reason, completed_s=r.ts))
            return
        assert org is not None  # else the reason above was unknown_org
        if s.admission is not None:
            if r.ts >= next_state:
                # The state is constant between events: this is the state at the tick.
                tick = next_state + state_every * ((r.ts - next_state) // state_every)
                s.admission.observe(snapshot(tick), tick)
                next_state = tick + state_every
            reason = s.admission.admit(r, org.tier, r.ts)
            if reason:
                outcomes.append(Outcome(**base, tier=org.tier, status="rejected", reason=reason,
                                        completed_s=r.ts))
                return
        deadline = (r.ts + r.deadline_ms / 1000.0 if r.deadline_ms is not None
                    else NO_DEADLINE)
        e = Entry(r.id, r.org, org.tier, r.tokens, priority=r.priority, deadline=deadline,
                  arrival=r.ts, payload=r)
        if not sched.push(r.endpoint, e):
            outcomes.append(Outcome(**base, tier=org.tier, status="invalid",
                                    reason="duplicate_id", completed_s=r.ts))
            return
        c = held.setdefault((r.endpoint, org.tier), {}).setdefault(r.org, [0, 0])
        c[0] += 1
        c[1] += r.tokens

    def dispatch(now: float) -> None:
        nonlocal seq, n_batches
        for ep, pool in pools.items():
            # When the scheduler hears a worker's news (an express batch started): at once
            # uncalibrated, the fitted feedback hop later with a pipeline.
            lag = 0.0 if pipe is None else pipe.feedback_s(ep)
            while sched.held_in(ep):
                w = min(pool, key=lambda w: (w.in_hand, w.free_at))
                express = fresh = False
                if w.in_hand >= slots_of[ep]:
                    # Every slot taken: the live scheduler's express batch, one request
                    # of each org that came in with nothing held; one per worker until
                    # that one starts.
                    spare = [x for x in pool if not x.holds_express(now, lag)]
                    if not (s.express and spare and sched.has_fresh(ep)):
                        break
                    if (s.express_horizon > 0 and min(x.free_at for x in pool) - now
                            <= s.express_horizon * full_s[ep]):
                        break  # a regular batch starts soon: the fresh requests go in it
                    w, express = min(spare, key=lambda x: x.free_at), True
                elif s.express and s.express_horizon > 0:
                    fresh = sched.has_fresh(ep)
                d = sched.next_batch(ep, now, in_run_order=True, fresh=express or fresh,
                                     fill=s.express_fill if express else 1.0)
                expired(ep, d.expired, now)
                if not d.batch:
                    if express:
                        break
                    continue
                n_batches += 1
                bid = f"{ep}-b{n_batches}"
                tokens = sum(e.tokens for e in d.batch)
                served: dict[tuple[str, str], float] = {}
                charged = []
                for e in d.batch:
                    unhold(ep, e)
                    c = sched.cost(ep, e)
                    charged.append((e, c))
                    served[(e.tier, e.org)] = served.get((e.tier, e.org), 0.0) + c
                if not express:
                    # An express batch shares nothing out among the backlogged orgs: it takes
                    # the fresh orgs' requests ahead of their turns (charged to their deficits).
                    count_backlogged(groups, held, ep, served, config)
                if pipe is None:
                    at = now
                    took, offsets, back_s = s.service.batch_s(tokens), None, 0.0
                    if express:
                        took, offsets = _express_calls(s.service, d.batch)
                else:
                    at = now + pipe.delivery_s(ep)
                    took, offsets, release = pipe.serve(ep, d.batch)
                    back_s = pipe.feedback_s(ep) - (took - release)  # slot back before the end
                if express:
                    start, moved = w.place_express(at, took)
                    for r in moved:
                        seq += 1
                        heapq.heappush(done, (r.slot_back, seq, r.version, r))
                else:
                    start = max(at, w.free_at)
                w.free_at = max(w.free_at, start) + took
                run = _Run(w, ep, bid, charged, now, start=start, took=took, offsets=offsets,
                           back_s=back_s, express=express)
                bisect.insort(w.runs, run, key=lambda r: r.start)
                seq += 1
                heapq.heappush(done, (run.slot_back, seq, run.version, run))
                if express:
                    heapq.heappush(wakes, start + lag)  # heard to have started: look again

    def complete(t: float, run: _Run) -> None:
        w, ep, bid, batch, dispatched = (run.worker, run.endpoint, run.batch_id, run.charged,
                                         run.dispatched)
        w.runs.remove(run)
        endpoint = config.endpoints[ep]
        budget = endpoint.max_batch_tokens
        tokens = sum(e.tokens for e, _ in batch)
        start, took, offsets = run.start, run.took, run.offsets
        rate = tokens / (took - run.paused_s)
        if sets_rate(tokens, len(batch), *half_batch(endpoint)):  # as the live ServiceRate
            w.tokens_per_s = rate if not w.tokens_per_s else 0.8 * w.tokens_per_s + 0.2 * rate
        for k, (e, c) in enumerate(batch):
            outcomes.append(Outcome(id=e.id, org=e.org, tier=e.tier, endpoint=ep, status="ok",
                                    tokens=e.tokens, cost=c, arrival_s=e.arrival,
                                    admitted_s=entered.get(e.id, e.arrival),
                                    dispatched_s=dispatched,
                                    completed_s=t if offsets is None else start + offsets[k],
                                    batch_id=bid, batch_tokens=tokens, batch_budget=budget,
                                    express=run.express))
        shares = s.service.shares_s([e.tokens for e, _ in batch])
        sched.feedback(ep, [(e.org, e.tokens, t) for (e, _), t in zip(batch, shares, strict=True)])

    last_sample = float("-inf")

    def sample(now: float, force: bool = False) -> None:
        nonlocal last_sample
        if not force and now < last_sample + s.sample_interval_s:
            return
        last_sample = now
        for ep, st in sched.stats().items():
            samples.append(QueueSample(t_s=now, endpoint=ep,
                                       held_tokens_by_tier=st.held_tokens_by_tier,
                                       held_by_tier=st.held_by_tier))

    i, n = 0, len(records)
    inf = float("inf")
    now = 0.0
    while True:
        t_arrival = enter[arrivals[i]] if i < n else inf
        t_done = done[0][0] if done else inf
        t_deadline = sched.next_deadline()
        t = min(t_arrival, t_done, wakes[0] if wakes else inf,
                inf if t_deadline is None else t_deadline)
        if t == inf:
            break
        now = t
        while wakes and wakes[0] <= now:
            heapq.heappop(wakes)
        while done and done[0][0] <= now:
            t_end, _, version, run = heapq.heappop(done)
            if version == run.version:  # else moved back by an express batch: pushed again
                complete(t_end, run)
        while i < n and enter[arrivals[i]] <= now:
            entered[records[arrivals[i]].id] = now
            arrive(records[arrivals[i]])
            i += 1
        for e in sched.expire(now):
            expired(e.payload.endpoint, [e], now)
        dispatch(now)
        sample(now)
    sample(now, force=True)
    used = {r.endpoint for r in records if r.endpoint in config.endpoints}
    meta = {
        "policy": s.policy, "workers": s.workers, "slots": s.slots,
        "overhead_ms": s.service.overhead_ms, "ms_per_token": s.service.ms_per_token,
        "full_batch_ms": {ep: round(s.service.batch_s(e.max_batch_tokens) * 1000, 3)
                          for ep, e in config.endpoints.items() if ep in used},
        "admission": "off" if s.admission is None else type(s.admission).__name__,
        "express": s.express,
        "express_fill": s.express_fill,
        "express_horizon": s.express_horizon,
    }
    return SimResult(outcomes, samples, list(groups.values()), meta)


class PipelineAdmission:
    """The live admission's last three checks, from :mod:`producer`, in its order.

    Rate limits (:class:`producer.ratelimit.RateLimiter`, charged only when
    the request is admitted), then the overload check and the real-time
    throttle (:class:`producer.throttle.ThrottleState`, fed the simulator's
    snapshots). The validity checks before them are the simulator's own.
    Each can be switched off, e.g. to see what the throttle alone does.
    """

    def __init__(self, config: Config, *, rate_limits: bool = True, overload: bool = True,
                 throttle: bool = True):
        from producer.ratelimit import RateLimiter  # the simulator runs without producer too
        from producer.throttle import ThrottleState

        self.config = config
        self.limiter = RateLimiter(config) if rate_limits else None
        self.state = ThrottleState()
        self.overload = overload
        self.throttle = throttle

    def observe(self, state: SchedulerState, now: float) -> None:
        self.state.observe(state, now * 1000.0)

    def admit(self, record: TraceRecord, tier: str, now: float) -> str | None:
        now_ms = now * 1000.0
        limiter = self.limiter
        if limiter and not limiter.check(record.org, record.endpoint, record.tokens,
                                         now_ms).allowed:
            return "rate_limited"
        if self.overload and self.state.check_overload(self.config) is not None:
            return "overloaded"
        if self.throttle:
            deadline = now_ms + record.deadline_ms if record.deadline_ms is not None else None
            v = self.state.check_throttle(self.config, endpoint=record.endpoint, tier=tier,
                                          org=record.org, tokens=record.tokens, now_ms=now_ms,
                                          deadline_at_ms=deadline)
            if v is not None:
                return v.reason
        if self.limiter is not None:
            self.limiter.acquire(record.org, record.endpoint, record.tokens, now_ms)
        self.state.note_admitted()
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness simulate``."""
    parser.add_argument("--config", required=True, help="configuration TOML (tiers, orgs...)")
    parser.add_argument("--trace", required=True, help="trace file (JSON Lines)")
    parser.add_argument("--policy", choices=["drr", "fifo"], default="drr")
    parser.add_argument("--compare-policy", action="store_true",
                        help="also run the other policy and print both side by side")
    parser.add_argument("--workers", type=int, default=1, help="workers per endpoint")
    parser.add_argument("--slots", type=int, default=None,
                        help="batches a worker may hold (default 1; with --calibrate as many "
                             "as the live run's workers held)")
    parser.add_argument("--overhead-ms", type=float, default=5.0,
                        help="fixed time per batch (default 5 ms)")
    parser.add_argument("--ms-per-token", type=float, default=0.28,
                        help="time per batch token (default 0.28 ms: MiniLM on CPU)")
    parser.add_argument("--sample-ms", type=float, default=100.0,
                        help="queue-depth sampling interval, virtual ms")
    parser.add_argument("--admission", action="store_true",
                        help="apply the live admission's rate limits, overload check and "
                             "throttle (rejected > 0); off by default so the scheduler is "
                             "measured alone")
    parser.add_argument("--no-express", dest="express", action="store_false",
                        help="leave out the live scheduler's express batches (as "
                             "SF_SCHEDULER_EXPRESS_BATCHES=false does live)")
    parser.add_argument("--express-fill", type=float, default=SimSettings.express_fill,
                        metavar="SHARE",
                        help="top an express batch up to this share of a full batch's "
                             "tokens, as SF_SCHEDULER_EXPRESS_FILL does live (default "
                             "%(default)s; 0: the fresh requests alone)")
    parser.add_argument("--express-horizon", type=float, default=SimSettings.express_horizon,
                        metavar="BATCHES",
                        help="no express batch while a worker's work in hand ends within "
                             "this many full-batch times, as SF_SCHEDULER_EXPRESS_HORIZON "
                             "does live (default %(default)s: none held back)")
    parser.add_argument("--json", metavar="OUT", help="write the summary as JSON")
    parser.add_argument("--report", metavar="DIR", help="write the full report (tables, plots)")
    cal = parser.add_argument_group("calibration (traffic/calibrate.py)")
    cal.add_argument("--calibrate", metavar="SOURCE",
                     help="fit the workers' batch times and the pipeline's delays to a live "
                          "run and simulate with them: a replay report folder, or topic:NAME "
                          "(results on a topic, with --bootstrap); --slots then defaults to "
                          "the configuration's worker_slots")
    cal.add_argument("--microbatch-size", type=int, default=32,
                     help="texts per micro-batch of the live workers (their --microbatch-size)")
    cal.add_argument("--microbatch-tokens", type=int, default=4096,
                     help="padded tokens per micro-batch of the live workers")
    from plumbing.kafka import add_kafka_arguments  # for --calibrate topic:NAME

    add_kafka_arguments(parser)


def _calibration(args: argparse.Namespace, config: Config):
    """The fit of ``--calibrate`` (None without it); prints the fitted parameters."""
    if not args.calibrate:
        return None
    from plumbing.kafka import settings_from_args
    from traffic.calibrate import calibrate, format_fit

    cal = calibrate(args.calibrate, kafka=settings_from_args(args),
                    microbatch_size=args.microbatch_size,
                    microbatch_tokens=args.microbatch_tokens,
                    flow_control=config.service.flow_control)
    print(format_fit(cal))
    return cal


def run(args: argparse.Namespace) -> int:
    """Run ``serving-fairness simulate``: 0 on success, 2 on bad input."""
    try:
        config = load_config(args.config)
        records = read_trace(args.trace)
    except (ConfigError, TraceError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        calibration = _calibration(args, config)
    except (OSError, ValueError) as e:
        print(f"error: --calibrate: {e}", file=sys.stderr)
        return 2
    fitted_slots = args.slots is None and calibration is not None
    if args.slots is None:
        args.slots = config.service.worker_slots if calibration is not None else 1
    if args.workers < 1 or args.slots < 1:
        print("error: --workers and --slots must be at least 1", file=sys.stderr)
        return 2
    if not 0.0 <= args.express_fill <= 1.0:
        print(f"error: --express-fill must be within 0 and 1, not {args.express_fill}",
              file=sys.stderr)
        return 2
    if not args.express_horizon >= 0:
        print(f"error: --express-horizon must be 0 or more, not {args.express_horizon}",
              file=sys.stderr)
        return 2
    policies = [args.policy] + ([{"drr": "fifo", "fifo": "drr"}[args.policy]]
                                if args.compare_policy else [])
    summaries: dict[str, dict[str, Any]] = {}
    for policy in policies:
        service = ServiceModel(args.overhead_ms, args.ms_per_token)
        pipeline = None
        if calibration is not None:
            from traffic.calibrate import CalibratedPipeline

            pipeline = CalibratedPipeline(calibration, config, service, policy,
                                          fitted_slots=fitted_slots)
        settings = SimSettings(policy=policy, workers=args.workers, slots=args.slots,
                               service=service, sample_interval_s=args.sample_ms / 1000.0,
                               admission=PipelineAdmission(config) if args.admission else None,
                               pipeline=pipeline, express=args.express,
                               express_fill=args.express_fill,
                               express_horizon=args.express_horizon)
        result = simulate(config, records, settings)
        result.meta.update(trace=Path(args.trace).name, config=Path(args.config).name)
        if calibration is not None:
            result.meta["calibration"] = calibration.to_json()
        summary = result.summary()
        summaries[policy] = summary
        fb = ", ".join(f"{ep} {ms:g} ms" for ep, ms in result.meta["full_batch_ms"].items())
        model = ("the calibrated model" if calibration is not None else
                 f"{args.overhead_ms:g} ms + {args.ms_per_token:g} ms/token (full batch: {fb})")
        slots = (", ".join(f"{ep} {pipeline.slots(ep) or args.slots}" for ep in config.endpoints)
                 if fitted_slots and pipeline is not None else f"{args.slots}")
        express = "" if policy == "fifo" else (", express batches" if args.express
                                                else ", no express batches")
        print(f"\n## {policy}: {len(records)} requests, {args.workers} worker(s) x {slots} "
              f"slot(s) per endpoint{express}, batch = {model}\n")
        print(format_table(summary))
        if args.report:
            out = Path(args.report) / policy if args.compare_policy else Path(args.report)
            title = f"Simulated run: {Path(args.trace).name}, policy {policy}"
            write_report(out, result.outcomes, result.samples, title=title, summary=summary)
            print(f"\nreport written to {out}", file=sys.stderr)
    if args.compare_policy:
        text = compare(summaries[policies[0]], summaries[policies[1]], labels=tuple(policies))
        print(f"\n## {policies[0]} vs {policies[1]}\n\n{text}")
        if args.report:
            (Path(args.report) / "compare.md").write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(summaries[args.policy], indent=2) + "\n")
    return 0

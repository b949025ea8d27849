"""What the scheduler tells admission: who holds how much, and how fast it drains.

Admission's throttle predicts a new request's wait from the latest
:class:`~schemas.messages.SchedulerState` (see ``docs/protocol.md``): higher
tiers' held tokens, plus, in the request's own tier, the smaller of the
tier's held tokens and (the org's own held tokens + the request) x the
number of active orgs, over the measured tokens per second. So per lane the
snapshot needs, besides the core's per-tier totals:

* the number of orgs with work waiting, per tier;
* the held tokens of the orgs holding the most (bounded: an org not listed
  holds no more than the smallest listed value);
* the measured service rate of the lane's live workers.

The core keeps orgs inside its DRR rings and does not count tokens per org,
so :class:`Backlog` keeps those counters beside it, updated by the service
on every push, dispatch and expiry (O(1) each). :class:`ServiceRate` keeps
an exponential moving average of each worker's tokens per second while
busy, from its ``batch_done`` reports. Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from schemas.config import Endpoint
from schemas.messages import LaneState

__all__ = ["HOP_FRESH_S", "MAX_EXPRESS_SHARE", "Backlog", "HopTime", "ServiceRate",
           "half_batch", "lane_state", "sets_rate"]


class Backlog:
    """Held requests and tokens per (endpoint, tier, org).

    Each org's entry also carries a *join serial*, new every time the org
    goes from holding nothing to holding something, so that a watcher that
    looks only now and then (:class:`scheduler.fairness.FairnessWatch`) can
    tell one long backlog from one that emptied and refilled in between.
    """

    def __init__(self) -> None:
        # endpoint -> tier -> org -> [requests, tokens, join serial]
        self._held: dict[str, dict[str, dict[str, list[int]]]] = {}
        self._serial = 0

    def add(self, endpoint: str, tier: str, org: str, tokens: int, requests: int = 1) -> None:
        """``requests`` more held of ``org`` (``tokens`` all together)."""
        orgs = self._held.setdefault(endpoint, {}).setdefault(tier, {})
        c = orgs.get(org)
        if c is None:
            self._serial += 1
            orgs[org] = [requests, tokens, self._serial]
        else:
            c[0] += requests
            c[1] += tokens

    def remove(self, endpoint: str, tier: str, org: str, tokens: int, requests: int = 1) -> None:
        """``requests`` fewer held of ``org`` (``tokens`` all together)."""
        orgs = self._held.get(endpoint, {}).get(tier)
        c = orgs.get(org) if orgs else None
        if orgs is None or c is None:
            return
        c[0] -= requests
        c[1] -= tokens
        if c[0] <= 0:
            del orgs[org]

    def held_serials(self, endpoint: str) -> dict[str, dict[str, int]]:
        """Orgs holding work on ``endpoint``, per tier, with their join serials."""
        return {t: {org: c[2] for org, c in orgs.items()}
                for t, orgs in self._held.get(endpoint, {}).items()}

    def active_orgs(self, endpoint: str) -> dict[str, int]:
        """Orgs with work waiting, per tier."""
        return {t: len(orgs) for t, orgs in self._held.get(endpoint, {}).items() if orgs}

    def org_tokens(self, endpoint: str) -> dict[str, int]:
        """Held tokens per org on ``endpoint``, all tiers together."""
        out: dict[str, int] = {}
        for orgs in self._held.get(endpoint, {}).values():
            for org, (_, tokens, _serial) in orgs.items():
                out[org] = out.get(org, 0) + tokens
        return out

    def top_orgs(self, endpoint: str, n: int) -> dict[str, int]:
        """The ``n`` orgs holding the most tokens on ``endpoint``."""
        return dict(heapq.nlargest(n, self.org_tokens(endpoint).items(), key=lambda kv: kv[1]))

    def cost_by_tier(self, endpoint: str, cost: Callable[[str, int, int], float]) -> dict[str, float]:
        """Held cost per tier, with ``cost(org, requests, tokens)`` per org."""
        return {
            tier: float(sum(cost(org, r, tok) for org, (r, tok, _) in orgs.items()))
            for tier, orgs in self._held.get(endpoint, {}).items()
        }


#: The largest share of a worker's time :class:`ServiceRate` takes its
#: express calls to leave the held work short of: one express call per full
#: batch, no longer than it.
MAX_EXPRESS_SHARE = 0.5
#: A hop measured longer ago than this is not published (:class:`HopTime`).
HOP_FRESH_S = 2.0


class HopTime:
    """The tier topic's hop, measured at the scheduler's intake: an EMA, published doubled.

    A request admitted now is not done when its batch is: it first crosses
    the tier topic (admission's append, the scheduler's fetch), and its
    result then crosses the reply topic to the client. The throttle's
    prediction counted neither, and ``bench/overload.py``'s accepted p99
    sat 12-30 ms under its 2,000 ms target with ~30 ms of p50 (~70 ms of
    p99) in those two hops. (The batch topic's hop is not one of them: the
    worker's credit sends a batch ahead of the worker's need.)

    One sample per intake fetch that read a record admitted later than any
    before it: the scheduler's clock at the fetch less that newest
    ``admitted_ms`` (so a fetch's backlog does not count, only the freshest
    record's way; clocks as the throttle's deadlines assume them, in step).
    The result's way back is the same kind of append and fetch, which the
    scheduler does not see, so :meth:`published_ms` is twice the average.

    A measurement older than :data:`HOP_FRESH_S` is not published (0:
    unknown), and the next sample starts the average afresh. That keeps one
    long sample (a stall, a new leader reading the tier topic's backlog)
    from throttling every request for good: with everything refused no
    fresh record comes to bring the average down, as the batch time once did
    (:meth:`ServiceRate.batch_seconds`).
    """

    def __init__(self, alpha: float = 0.2, fresh_s: float = HOP_FRESH_S) -> None:
        self.alpha = alpha
        self.fresh_s = fresh_s
        self.ms: float | None = None
        self._at: float | None = None

    def observe(self, ms: float, now_s: float) -> None:
        """One sample of ``ms`` (clipped at 0), taken at ``now_s`` (epoch seconds)."""
        ms = max(0.0, ms)
        if not ms < float("inf"):
            return
        fresh = self._fresh(now_s)
        self.ms = (1 - self.alpha) * fresh + self.alpha * ms if fresh is not None else ms
        self._at = now_s

    def published_ms(self, now_s: float) -> float:
        """Twice the average (in, and the result's way out), or 0 when stale or unmeasured."""
        fresh = self._fresh(now_s)
        return 0.0 if fresh is None else 2 * fresh

    def _fresh(self, now_s: float) -> float | None:
        """The average, if its last sample is at most ``fresh_s`` before ``now_s``."""
        if self._at is None or now_s - self._at > self.fresh_s:
            return None
        return self.ms


def half_batch(endpoint: Endpoint) -> tuple[int, int]:
    """``(min_tokens, min_requests)`` for :func:`sets_rate`: half of a full batch of
    ``endpoint`` by each of its limits (a batch fills by whichever comes first)."""
    return endpoint.max_batch_tokens // 2, endpoint.max_batch_size // 2


def sets_rate(tokens: int, requests: int, min_tokens: int, min_requests: int) -> bool:
    """Does a batch of ``tokens`` in ``requests`` move the service rate? Only one at
    least ``min_tokens`` or ``min_requests`` (0: no such rule) big: a smaller one is
    mostly fixed overhead. The live rate (:class:`ServiceRate`) and the simulator's
    (:mod:`traffic.simulate`) both ask this."""
    return tokens > 0 and (tokens >= min_tokens or 0 < min_requests <= requests)


class ServiceRate:
    """Tokens per second of each worker while busy: an EMA of its batch reports.

    A batch's time is its model time, or, when the worker already had this
    batch in hand at its previous report (so it worked without a pause in
    between), the time between the two reports if that is longer: it adds
    what the model time leaves out (publishing results, committing, the
    gaps between micro-batches). The throttle divides a backlog by this
    rate, and model time alone made it admit about 1.5x what it could serve
    within the target (``bench/overload.py``).

    Express batches (:mod:`scheduler.dispatch`) go ahead of everything held,
    so the work already waiting gets the worker's time less theirs: the rate
    :meth:`total` gives is the full batches' rate times the share of a busy
    worker's time its express calls leave (an EMA, sampled at each full
    batch: the express calls' time since the full batch before over that
    plus the full batch's own). Without it the throttle admitted work that
    the express calls then pushed past the target (``bench/overload.py``:
    accepted p99 1,996-2,074 ms against 2,000, 1,927-1,959 with express
    batches off; the fake model spent ~8 % of its time on them). The share
    taken is at most :data:`MAX_EXPRESS_SHARE`: the scheduler sends one
    express batch per worker per credit it returns, i.e. at most one per
    full batch, and no longer than one; the cap also keeps a stretch of
    express calls (a warm-up: nearly every batch an express one, measured
    here) from setting a rate near zero that the throttle would then refuse
    everything by, with no full batch coming to correct it.
    """

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self._rate: dict[str, float] = {}
        #: worker -> EMA of one batch's seconds (as measured for the rate)
        self._batch_s: dict[str, float] = {}
        #: worker -> (sent_ms of its last batch report, had a batch in hand then)
        self._last: dict[str, tuple[float, bool]] = {}
        #: worker -> seconds of express calls since its last full batch, in busy stretches
        self._express_s: dict[str, float] = {}
        #: worker -> EMA of the share of its busy time its express calls took
        self._express_share: dict[str, float] = {}

    def observe(self, worker: str, tokens: int, seconds: float, *,
                done_ms: float | None = None, busy_after: bool = False,
                min_tokens: int = 0, requests: int = 0, min_requests: int = 0,
                express: bool = False) -> None:
        """One ``batch_done``: ``seconds`` of model time; ``done_ms`` its ``sent_ms``;
        ``busy_after``: it listed another batch in hand (``in_flight``);
        ``express``: the batch was an express one (never sets the rate; its
        time, in a busy stretch, counts against the share left to the rest).

        Batches under ``min_tokens`` do not move the rate unless they hold
        ``min_requests`` requests or more (0: no such rule): a small batch is
        mostly fixed overhead, and a rate taken from it (a warm-up request:
        ~20 tokens/s) would make the throttle refuse the next burst, which
        full batches serve hundreds of times faster. A batch fills by either
        limit: short requests fill ``max_batch_size`` long before
        ``max_batch_tokens`` (64 of 16 tokens are a quarter of 4,096), and
        such batches are the burst's real speed. Until a batch that size has
        been seen the rate is unknown: the throttle stays off, which is right
        for a system that has never been busy, and admission's pacing assumes
        a rate (:func:`producer.pacing.cold_rates`)."""
        busy_before = False
        if done_ms is not None:
            prev = self._last.get(worker)
            self._last[worker] = (done_ms, busy_after)
            busy_before = prev is not None and prev[1]
            if prev is not None and busy_before and done_ms > prev[0]:
                seconds = max(seconds, (done_ms - prev[0]) / 1000)
        if not (seconds > 0.0) or seconds == float("inf"):
            return
        if express:
            if busy_before or busy_after:
                self._express_s[worker] = self._express_s.get(worker, 0.0) + seconds
            return
        if not sets_rate(tokens, requests, min_tokens, min_requests):
            return
        taken = self._express_s.pop(worker, 0.0)
        self._ema(self._express_share, worker, taken / (taken + seconds))
        self._ema(self._batch_s, worker, seconds)
        self._ema(self._rate, worker, tokens / seconds)

    def _ema(self, values: dict[str, float], worker: str, sample: float) -> None:
        prev = values.get(worker)
        values[worker] = sample if prev is None else (
            (1 - self.alpha) * prev + self.alpha * sample)

    def forget(self, worker: str) -> None:
        self._rate.pop(worker, None)
        self._last.pop(worker, None)
        self._batch_s.pop(worker, None)
        self._express_s.pop(worker, None)
        self._express_share.pop(worker, None)

    def batch_seconds(self, workers: Iterable[str], full_tokens: int = 0) -> float:
        """Mean batch time of ``workers`` measured so far (0 if none).

        Each worker's no longer than ``full_tokens`` (a full batch) at its
        rate (:meth:`total`'s, net of express calls), when given. A batch
        timed across a stall (the worker held the next batch while its
        results waited on a stalled broker: seconds between two reports)
        moves the EMA of seconds by a fifth of the stall, where it moves the
        rate's by a fifth of the rate; ten seconds took the batch time from
        0.2 s to 2.2 s (``tests/unit/test_throttle.py``), and the throttle,
        which adds two batch times to every prediction, then refused every
        request even on an empty lane, with no full batch to come and
        correct it.
        """
        times = []
        for w in workers:
            t = self._batch_s.get(w)
            if t is None:
                continue
            r = self._net_rate(w)
            times.append(min(t, full_tokens / r) if full_tokens > 0 and r > 0 else t)
        return sum(times) / len(times) if times else 0.0

    def _net_rate(self, worker: str) -> float:
        r = self._rate.get(worker, 0.0)
        return r * (1 - min(MAX_EXPRESS_SHARE, self._express_share.get(worker, 0.0)))

    def known(self, worker: str) -> bool:
        """Has ``worker``'s rate been measured (a batch at least half full seen)?"""
        return worker in self._rate

    def total(self, workers: Iterable[str]) -> float:
        """Summed rate of ``workers`` for the work they hold (0 for a worker
        never measured): each one's full-batch rate, less the share its
        express calls take (at most :data:`MAX_EXPRESS_SHARE`)."""
        return sum(self._net_rate(w) for w in workers)


def lane_state(
    endpoint: str,
    *,
    held_requests: int,
    held_tokens_by_tier: dict[str, int],
    held_cost_by_tier: dict[str, float],
    backlog: Backlog,
    tokens_per_s: float,
    free_slots: int,
    workers: int,
    top_orgs: int,
    in_flight_tokens: int = 0,
    batch_ms: float = 0.0,
    turns: bool = False,
    hops_ms: float = 0.0,
) -> LaneState:
    """The snapshot of one lane for :class:`~schemas.messages.SchedulerState`."""
    return LaneState(
        endpoint=endpoint,
        held_requests=held_requests,
        held_cost_by_tier=held_cost_by_tier,
        held_tokens_by_tier=held_tokens_by_tier,
        tokens_per_s=tokens_per_s,
        free_slots=free_slots,
        workers=workers,
        active_orgs_by_tier=backlog.active_orgs(endpoint),
        org_held_tokens=backlog.top_orgs(endpoint, top_orgs),
        in_flight_tokens=in_flight_tokens,
        batch_ms=batch_ms,
        turns=turns,
        hops_ms=hops_ms,
    )

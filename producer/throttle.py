"""The real-time throttle and the overload check, from the scheduler's snapshots.

Pure: no I/O, no clock of its own (every call takes ``now_ms``), no logging.

Why a throttle
--------------

A request admitted into a backlog it cannot get through in time is worse
than one refused at once: it takes a place in the queue, then expires
anyway, and its sender learns that only after the deadline. So admission
predicts the wait and refuses (``throttled``, with a retry-after) what could
not be served in time.

The prediction
--------------

The scheduler publishes a :class:`schemas.messages.SchedulerState` every
``state_interval_ms``: per endpoint lane, the tokens held per tier, the orgs
with work per tier, the biggest orgs' held tokens and the measured service
rate (net of what express batches take: they go ahead of everything held). For a request of ``n`` tokens from org ``o`` in tier ``t``, the tokens
that must be served before it is done are

* the batches already at the workers (``in_flight_tokens``), plus
* every higher tier's held tokens (strict priority serves them first), plus
* within ``t``, the smaller of the tier's held tokens (+ ``n``) and
  ``(o's held tokens + n) x the tier's active orgs``: DRR gives every active
  org a turn for each of ``o``'s, so ``o`` waits for about its own backlog
  times the number of orgs, never for more than the whole tier,

each counting what this instance admitted that the snapshot does not show
yet: admitted after the newest ``admitted_ms`` the scheduler had read when
it took the snapshot (``admitted_through_ms``), i.e. still on the tier topic
(a burst in one fetch is decided against one snapshot). Over
``tokens_per_s``, plus two measured batch times (``batch_ms``: work is
served a batch at a time, so when the request's turn comes a batch may have
just started, and then it is done when its own whole batch is), plus the
measured Kafka hops after admission that none of that counts (``hops_ms``:
the tier topic in, the result out), that is the predicted time to
completion. With one batch time the accepted requests' p99 overshot the
target by about a batch (``bench/overload.py``: 2,542 ms against 2,000);
without the hops it sat 12-30 ms under it. It is compared with the time
left to the request's deadline when it has one, else with the endpoint's
``latency_target_ms`` less the time the request already waited before
admission (since its ``created_ms``).
A burst is throttled (its own backlog grows with it); a quiet org is not
(its own backlog is empty). An org absent from ``org_held_tokens`` (which
lists only the top few) is taken to hold nothing: the list's floor is an
upper bound, and erring towards admission is what a quiet org needs. The
retry-after is the time the backlog needs, at the measured rate, to shrink
until the request would fit.

Lower tiers' ``min_share`` is ignored: it only shortens a lower tier's wait,
so the prediction stays an upper bound.

When the snapshot cannot be trusted
-----------------------------------

* **No rate measured yet** (``tokens_per_s == 0``: no batch finished, or no
  worker): no throttling. Refusing everything before the first batch would
  deadlock a fresh pipeline.
* **No snapshot, or a stale one** (``sent_ms`` older than
  ``stale_after_ms``, say the scheduler is down or failing over): the
  throttle is off, because a backlog that nobody reports any more must not
  throttle forever. The **overload** check stays on: it counts the last known
  ``held_requests`` plus every request this instance admitted since that
  snapshot (none are being served while the scheduler is gone), so an
  admission instance in front of a dead scheduler still stops at
  ``max_held_requests`` instead of filling Kafka without bound. A fresh
  snapshot takes out of the count what the scheduler had read by then
  (``admitted_through_ms``; all of it from a snapshot without the stamp).

Staleness compares the scheduler's ``sent_ms`` with this host's clock, so
hosts need synchronized clocks (deadlines already assume it); a snapshot
stamped in the future counts as fresh.

Which snapshot wins: the one with the highest leadership ``epoch``, then the
latest ``sent_ms``; a stale snapshot loses to any other, so a scheduler that
restarted with a lower epoch is heard again once the old leader falls silent.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping

import msgspec

from schemas.config import Config
from schemas.messages import SchedulerState

__all__ = ["DEFAULT_STALE_AFTER_MS", "MAX_RETRY_AFTER_MS", "ThrottleState", "Verdict",
           "predict_wait_ms"]

#: A snapshot older than this is ignored by the throttle. A few scheduler
#: intervals (250 ms by default) plus a failover's group join.
DEFAULT_STALE_AFTER_MS = 5_000.0
#: The longest retry-after the throttle gives (a day): beyond that a number
#: says nothing more, and from a bad snapshot it could be infinite.
MAX_RETRY_AFTER_MS = 86_400_000


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """Why a request is refused by the overload check or the throttle."""

    reason: str  # "overloaded" or "throttled"
    retry_after_ms: int
    message: str


def predict_wait_ms(
    state: SchedulerState, config: Config, *, endpoint: str, tier: str, org: str, tokens: int,
    since: Mapping[tuple[str, str], int] | None = None,
) -> float | None:
    """Predicted milliseconds until a new request would be served, or None if unknown.

    None when the snapshot has no lane for ``endpoint`` or no measured rate.
    ``since`` adds tokens admitted after the snapshot was taken, keyed
    ``("tier", name)`` and ``("org", name)`` for this endpoint.
    """
    lane = state.lanes.get(endpoint)
    # "not > 0" also refuses NaN, which a snapshot in msgpack can carry.
    if lane is None or not lane.tokens_per_s > 0:
        return None
    names = config.tier_names
    rank = names.index(tier) if tier in names else len(names) - 1
    since = since or {}
    # Batches already at the workers are served first, whatever their tier.
    ahead = float(max(0, lane.in_flight_tokens))
    ahead += float(sum(lane.held_tokens_by_tier.get(t, 0) + since.get(("tier", t), 0)
                      for t in names[:rank]))
    tier_held = lane.held_tokens_by_tier.get(tier, 0) + since.get(("tier", tier), 0)
    active = max(1, lane.active_orgs_by_tier.get(tier, 0))
    own = lane.org_held_tokens.get(org, 0) + since.get(("org", org), 0)
    ahead += min(tier_held + tokens, (own + tokens) * active)
    # Work is served a batch at a time: when its turn comes a batch may have
    # just started (one batch time), then its own batch runs (another).
    batch_ms = lane.batch_ms if lane.batch_ms > 0 else 0.0
    # Then the hops no term above counts: the tier topic in, the result out.
    hops_ms = lane.hops_ms if 0 < lane.hops_ms < math.inf else 0.0
    return ahead / lane.tokens_per_s * 1000.0 + 2 * batch_ms + hops_ms


class ThrottleState:
    """The latest scheduler snapshot, and what this instance admitted since.

    Mutated only by the admission service's loop: :meth:`observe` for each
    snapshot read, :meth:`note_admitted` for each request admitted.
    """

    def __init__(self, *, stale_after_ms: float = DEFAULT_STALE_AFTER_MS,
                 overload_retry_ms: int = 1_000):
        #: Snapshots older than this (by their ``sent_ms``) do not throttle.
        self.stale_after_ms = stale_after_ms
        #: retry-after of an ``overloaded`` refusal: about the time a few
        #: snapshots take to show the backlog shrinking.
        self.overload_retry_ms = overload_retry_ms
        self.state: SchedulerState | None = None
        #: Requests this instance admitted that ``state`` does not count yet.
        self.admitted_since = 0
        #: Their tokens, per endpoint, by ("tier", name) and ("org", name): one
        #: fetch of a burst is decided against one snapshot, and without
        #: these every request of it would see the same predicted wait.
        self.tokens_since: dict[str, dict[tuple[str, str], int]] = {}
        #: The same admissions one by one, oldest first: (admitted_ms,
        #: endpoint, tier, org, tokens, count), to take out those a snapshot
        #: shows the scheduler has read. As long as ``admitted_since``: the
        #: overload check stops admitting at ``max_held_requests``.
        self._pending: collections.deque[
            tuple[int | None, str | None, str | None, str | None, int, int]] = collections.deque()

    def observe(self, state: SchedulerState, now_ms: float) -> bool:
        """Take ``state`` if it is newer than the one held; True when taken.

        What this instance admitted stays counted on top of it unless the
        scheduler had read it: those admitted up to the snapshot's
        ``admitted_through_ms`` are in its figures, the later ones are still
        on the tier topic. (Counting none of them let admission, at the
        onset of an overload, admit a second time what the snapshot did not
        show yet: the first second's accepted requests overshot the target.)
        A snapshot without that stamp counts everything, as before it existed.
        """
        cur = self.state
        if (
            cur is None
            or not self.is_fresh(now_ms)
            or state.epoch > cur.epoch
            or (state.epoch == cur.epoch and state.sent_ms >= cur.sent_ms)
        ):
            self.state = state
            through = state.admitted_through_ms
            if through is None:
                self._pending.clear()
                self.admitted_since = 0
                self.tokens_since = {}
            else:
                while self._pending and (self._pending[0][0] is None
                                         or self._pending[0][0] <= through):
                    self._forget(*self._pending.popleft()[1:])
            return True
        return False

    def note_admitted(self, count: int = 1, *, endpoint: str | None = None,
                      tier: str | None = None, org: str | None = None, tokens: int = 0,
                      at_ms: int | None = None) -> None:
        """Count an admission until a snapshot counts it (with its tokens, for the throttle).

        ``at_ms`` is the request's ``admitted_ms``; None: counted until the next snapshot.
        """
        self.admitted_since += count
        if endpoint is not None and tokens:
            since = self.tokens_since.setdefault(endpoint, {})
            for kind, name in (("tier", tier), ("org", org)):
                if name is not None:
                    since[kind, name] = since.get((kind, name), 0) + tokens
        self._pending.append((at_ms, endpoint, tier, org, tokens, count))

    def _forget(self, endpoint: str | None, tier: str | None, org: str | None, tokens: int,
                count: int) -> None:
        self.admitted_since -= count
        if endpoint is None or not tokens:
            return
        since = self.tokens_since.get(endpoint, {})
        for kind, name in (("tier", tier), ("org", org)):
            if name is not None and (kind, name) in since:
                since[kind, name] -= tokens
                if since[kind, name] <= 0:
                    del since[kind, name]

    def is_fresh(self, now_ms: float) -> bool:
        return self.state is not None and now_ms - self.state.sent_ms <= self.stale_after_ms

    def age_ms(self, now_ms: float) -> float | None:
        return None if self.state is None else now_ms - self.state.sent_ms

    def org_backlog_s(self, org: str, now_ms: float,
                      cold_tokens_per_s: Mapping[str, float] | None = None) -> float | None:
        """Seconds of service the scheduler holds for ``org``, as far as this instance can tell.

        The most over the lanes that serve orgs in turns (``LaneState.turns``)
        and have a rate: the org's held tokens in the snapshot (0 if it is
        not among the top few listed) plus what this instance admitted for
        it since, over the lane's whole rate (the org alone would be served
        that fast; sharing the lane, slower: an estimate on the low side).
        The rate is the measured one, or before one is measured the lane's
        ``cold_tokens_per_s[endpoint]``, where given (admission's assumed
        rate: :mod:`producer.pacing`). None: no fresh snapshot, or no such lane.
        """
        st = self.state
        if st is None or not self.is_fresh(now_ms):
            return None
        most: float | None = None
        key = ("org", org)
        for endpoint, lane in st.lanes.items():
            if not lane.turns:
                continue
            rate = lane.tokens_per_s
            if not rate > 0 and cold_tokens_per_s is not None:
                rate = cold_tokens_per_s.get(endpoint, 0.0)
            if not rate > 0:
                continue
            held = lane.org_held_tokens.get(org, 0)
            since = self.tokens_since.get(endpoint)
            if since:
                held += since.get(key, 0)
            seconds = max(0.0, held) / rate
            if most is None or seconds > most:
                most = seconds
        return most

    def held_estimate(self) -> int:
        """Requests the scheduler holds, as far as this instance can tell."""
        known = self.state.held_requests if self.state is not None else 0
        return known + self.admitted_since

    def check_overload(self, config: Config) -> Verdict | None:
        """``overloaded`` when the held estimate reaches ``max_held_requests``."""
        limit = config.service.max_held_requests
        held = self.held_estimate()
        if held < limit:
            return None
        return Verdict(
            reason="overloaded",
            retry_after_ms=self.overload_retry_ms,
            message=(
                f"the scheduler holds about {held} requests, at or above "
                f"service.max_held_requests = {limit}; retry later"
            ),
        )

    def check_throttle(
        self,
        config: Config,
        *,
        endpoint: str,
        tier: str,
        org: str,
        tokens: int,
        now_ms: float,
        deadline_at_ms: float | None = None,
        waited_ms: float = 0.0,
    ) -> Verdict | None:
        """``throttled`` when the predicted wait exceeds the request's time budget.

        The budget is the time left to ``deadline_at_ms`` when given, else the
        endpoint's ``latency_target_ms`` less ``waited_ms``, the time the
        request already spent before admission (since its ``created_ms``: an
        ingress backlog under overload). A request already past its target is
        throttled even without a snapshot; otherwise no verdict without a
        fresh snapshot or a measured rate.
        """
        target = float(config.endpoints[endpoint].latency_target_ms)
        waited = min(max(0.0, waited_ms), MAX_RETRY_AFTER_MS)
        if deadline_at_ms is None and waited >= target:
            return Verdict(
                reason="throttled",
                retry_after_ms=max(1, math.ceil(waited - target)),
                message=(f"the request waited {waited:.0f} ms before admission, past endpoint "
                         f"{endpoint!r} latency_target_ms = {target:.0f}; retry later"),
            )
        if self.state is None or not self.is_fresh(now_ms):
            return None
        wait = predict_wait_ms(
            self.state, config, endpoint=endpoint, tier=tier, org=org, tokens=tokens,
            since=self.tokens_since.get(endpoint),
        )
        if wait is None:
            return None
        if deadline_at_ms is not None:
            budget = deadline_at_ms - now_ms
            what = f"the request's deadline ({budget:.0f} ms from now)"
        else:
            budget = target - waited
            what = (f"endpoint {endpoint!r} latency_target_ms = {target:.0f}"
                    + (f" less {waited:.0f} ms already waited" if waited >= 1 else ""))
        if wait <= budget:
            return None
        return Verdict(
            reason="throttled",
            # Capped: a rate of 1e-300 tokens/s predicts an infinite wait, and a
            # retry-after must stay an int64 that a result can carry.
            retry_after_ms=max(1, math.ceil(min(wait - budget, MAX_RETRY_AFTER_MS))),
            message=(
                f"predicted wait of {wait:.0f} ms on endpoint {endpoint!r} (tier {tier!r}) "
                f"exceeds {what}; retry later or with a longer deadline"
            ),
        )

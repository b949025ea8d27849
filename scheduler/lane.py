"""One endpoint's lane: strict tiers over DRR rings, expiry, batch assembly.

Selection, repeated until the batch is full:

1. **Tier.** The highest tier with work is chosen, except that a lower tier
   with a ``min_share`` s earns ``s x cost`` of credit for every request
   served while it waits, and is served first once its credit covers its
   next request. Credit is spent when the tier is served and dropped when
   it empties, so a tier cannot bank it.
2. **Org.** The tier's DRR ring picks the org (see :mod:`scheduler.drr`).
3. **Request.** The org's heap gives its best request.

The chosen request is added if it fits the batch's token and size budgets.
If it does not, the batch closes and the request stays first in line (its
org's turn and deficit untouched), so fairness, not size, decides the order.
An empty batch always takes its first request, so nothing can wedge a lane.

Expiry: every request with a deadline also sits in one lane-wide heap
ordered by deadline, so expired requests are found in O(log n) each, even
in a tier that is starved. Expired requests are returned, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from heapq import heappop, heappush
from typing import Any, NamedTuple

from scheduler.cost import AdaptiveCost, Cost, make_cost
from scheduler.drr import DrrTier
from scheduler.entry import DISPATCHED, EXPIRED, HELD, NO_DEADLINE, REMOVED, Entry
from schemas.config import Endpoint, Tier

__all__ = ["Dispatch", "FifoLane", "Lane", "LaneStats"]

#: What a lane's ``_peek`` chose: the entry first, then what its ``_take``
#: needs back (its shape is the lane's own, so the rest is untyped).
Pick = tuple[Any, ...]


class Dispatch(NamedTuple):
    """What one call to ``next_batch`` decided: a batch (maybe empty) and expiries."""

    batch: list[Entry]
    expired: list[Entry]


class LaneStats(NamedTuple):
    held: int
    held_tokens_by_tier: dict[str, int]
    held_by_tier: dict[str, int]
    rounds: int


class _LaneBase:
    """Expiry heap, budgets and counters shared by the DRR lane and the FIFO baseline."""

    def __init__(self, endpoint: Endpoint, tiers: list[Tier]):
        self.endpoint = endpoint
        self.tier_names = [t.name for t in tiers]
        self.cost: Cost = make_cost(endpoint.cost_model, endpoint.ema_alpha)
        self._deadlines: list[tuple[float, int, Entry]] = []
        self._seq = 0
        self.held = 0
        self.held_tokens: dict[str, int] = {t: 0 for t in self.tier_names}
        self.held_count: dict[str, int] = {t: 0 for t in self.tier_names}

    def _tier_of(self, e: Entry) -> str:
        # A tier removed by a reconfiguration falls back to the lowest one.
        return e.tier if e.tier in self.held_count else self.tier_names[-1]

    def _account(self, e: Entry, sign: int, tokens: int | None = None) -> None:
        """``sign`` requests of ``e``'s tier held (+) or gone (-), of ``tokens`` in all
        (``sign`` x ``e.tokens`` when None)."""
        t = self._tier_of(e)
        self.held += sign
        self.held_tokens[t] += sign * e.tokens if tokens is None else tokens
        self.held_count[t] += sign

    def push(self, e: Entry) -> None:
        self._seq += 1
        e.seq = self._seq
        e.state = HELD
        if e.deadline != NO_DEADLINE:
            heappush(self._deadlines, (e.deadline, e.seq, e))
        self._account(e, +1)
        self._push(e)

    def expire(self, now: float) -> list[Entry]:
        """Remove and return every held request whose deadline is at or before ``now``."""
        out: list[Entry] = []
        dl = self._deadlines
        while dl and dl[0][0] <= now:
            e = heappop(dl)[2]
            if e.state != HELD:
                continue
            e.state = EXPIRED
            self._account(e, -1)
            self._discard(e)
            out.append(e)
        return out

    def remove(self, e: Entry) -> None:
        """Take a held request out without dispatching or expiring it."""
        if e.state != HELD:
            return
        e.state = REMOVED
        self._account(e, -1)
        self._discard(e)

    def next_batch(self, now: float, *, fresh: bool = False, fill: float = 0.0) -> Dispatch:
        """Expire what is due, then assemble the next batch within the endpoint's budgets.

        ``fresh``: an express batch, one request of each fresh org
        (:meth:`scheduler.drr.DrrTier.peek_fresh`) of the highest tier with work,
        then topped up in the lane's usual order to ``fill`` x ``max_batch_tokens``
        at most (0: nothing more). Whatever an express batch carries, its model call
        costs the call's fixed time: a few requests alone waste it.
        """
        expired = self.expire(now)
        ep = self.endpoint
        batch: list[Entry] = []
        tokens = 0
        peek = self._peek_fresh if fresh else self._peek
        # Topping up an express batch (one with a fresh request at least): the tokens
        # it may reach, once no fresh org is left.
        top_up = fill * ep.max_batch_tokens if fresh else 0.0
        topping = False
        while len(batch) < ep.max_batch_size:
            pick = peek()
            if pick is None and batch and top_up > tokens and not topping:
                peek, topping = self._peek, True
                pick = peek()
            if pick is None:
                break
            e: Entry = pick[0]
            if batch and tokens + e.tokens > ep.max_batch_tokens:
                break
            if topping and tokens + e.tokens > top_up:
                break
            self._take(pick)
            e.state = DISPATCHED
            self._account(e, -1)
            tokens += e.tokens
            batch.append(e)
            if not fresh:
                tokens = self._take_run(pick, batch, tokens)
        if self._deadlines and not self.held:
            self._deadlines.clear()  # only dead entries are left
        return Dispatch(batch, expired)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a held request (dead heap tops are dropped)."""
        dl = self._deadlines
        while dl and dl[0][2].state != HELD:
            heappop(dl)
        return dl[0][0] if dl else None

    def drain(self) -> list[Entry]:
        """Remove and return every held request (still HELD), for a rebuild."""
        out = [e for e in self._entries() if e.state == HELD]
        for e in out:
            self._account(e, -1)
        self._deadlines.clear()
        self._clear()
        return out

    def feedback(self, samples: Iterable[tuple[str, int, float]]) -> None:
        self.cost.observe(samples)

    def cost_state(self) -> tuple[float | None, dict[str, float]] | None:
        """The adaptive cost's measurements (None for a lane that measures nothing)."""
        return self.cost.state() if isinstance(self.cost, AdaptiveCost) else None

    def restore_cost(self, lane_spt: float | None, org_spt: dict[str, float]) -> bool:
        """Continue from another scheduler's measurements; False if this lane is not adaptive."""
        if not isinstance(self.cost, AdaptiveCost):
            return False
        self.cost.restore(lane_spt, org_spt)
        return True

    def keep_cost(self, previous: _LaneBase) -> None:
        """Take over ``previous``'s cost model, and what it measured, if the model is the same."""
        if previous.endpoint.cost_model == self.endpoint.cost_model:
            self.cost = previous.cost
            if isinstance(self.cost, AdaptiveCost):
                self.cost.alpha = self.endpoint.ema_alpha

    def _reconfigure_cost(self, endpoint: Endpoint) -> None:
        # The cost model is built from the endpoint: a changed model must take
        # effect (a request-based quantum against token costs would take a
        # turn per unit of cost), an unchanged one keeps its measurements.
        if endpoint.cost_model != self.endpoint.cost_model:
            self.cost = make_cost(endpoint.cost_model, endpoint.ema_alpha)
        elif isinstance(self.cost, AdaptiveCost):
            self.cost.alpha = endpoint.ema_alpha

    # Policy hooks. ``_peek`` returns a tuple whose first item is the entry
    # chosen; ``_take`` gets that same tuple back.
    def _push(self, e: Entry) -> None:
        raise NotImplementedError

    def _peek(self) -> Pick | None:
        raise NotImplementedError

    def _take(self, pick: Pick) -> None:
        raise NotImplementedError

    def _discard(self, e: Entry) -> None:
        raise NotImplementedError

    def _take_run(self, pick: Pick, batch: list[Entry], tokens: int) -> int:
        """After ``pick`` was taken into ``batch``: take what the policy would pick next
        without asking it again, while that is certain; returns the batch's tokens.

        A shortcut only: :meth:`next_batch` picks the rest one by one, the same way.
        """
        return tokens

    def _entries(self) -> Iterable[Entry]:
        raise NotImplementedError

    def _clear(self) -> None:
        raise NotImplementedError

    def rounds(self) -> int:
        return 0

    def has_fresh(self) -> bool:
        """Does an org of the highest tier with work have a request and no service yet?"""
        return False

    def _peek_fresh(self) -> Pick | None:
        return None

    def stats(self) -> LaneStats:
        return LaneStats(self.held, dict(self.held_tokens), dict(self.held_count), self.rounds())


class Lane(_LaneBase):
    """Strict tiers (with optional minimum shares) over per-tier DRR rings."""

    def __init__(self, endpoint: Endpoint, tiers: list[Tier], weight_of: Callable[[str], float]):
        super().__init__(endpoint, tiers)
        self.tiers = [DrrTier(endpoint.quantum, weight_of) for _ in tiers]
        self.index = {t.name: i for i, t in enumerate(tiers)}
        self.min_share = [t.min_share for t in tiers]
        self.credit = [0.0] * len(tiers)
        self._shared = [i for i, s in enumerate(self.min_share) if s > 0]

    def _push(self, e: Entry) -> None:
        self.tiers[self.index.get(e.tier, len(self.tiers) - 1)].push(e)

    def _peek(self) -> Pick | None:
        cost = self.cost.cost
        for i in self._shared:
            t = self.tiers[i]
            if t.live and self.credit[i] > 0:
                pick = t.peek(cost)
                if pick is not None and pick[2] <= self.credit[i]:
                    return pick[1], i, pick[0], pick[2]
        for i, t in enumerate(self.tiers):
            if t.live:
                pick = t.peek(cost)
                if pick is not None:
                    return pick[1], i, pick[0], pick[2]
        return None

    def _take(self, pick: Pick) -> None:
        e, i, q, c = pick
        self.tiers[i].take(q, e, c)
        for j in self._shared:
            if self.tiers[j].live:
                self.credit[j] += self.min_share[j] * c
            else:
                self.credit[j] = 0.0
        if self.min_share[i] > 0:
            self.credit[i] = max(0.0, self.credit[i] - c)

    def _take_run(self, pick: Pick, batch: list[Entry], tokens: int) -> int:
        # The org just served keeps the turn while its deficit covers its next
        # request, and its tier stays the highest with work (nothing is pushed
        # during a batch): its next request is what _peek returns, as long as no
        # min_share tier with work has credit (then _peek asks that tier first,
        # and may pick from it). That is checked before each request, without
        # peeking; the moment it fails, _peek picks again one by one. (A pick that
        # came by credit, past a higher tier with work, leaves its tier with
        # credit, at least min_share x its cost: checked, and left to _peek.)
        _, i, q, _ = pick
        tiers = self.tiers
        cost = self.cost.cost
        credit, shared = self.credit, self._shared
        ep = self.endpoint
        most, most_tokens = ep.max_batch_size, ep.max_batch_tokens
        # With no min_share tier, taking is the tier's take alone (what _take does then),
        # and every request taken here is of one tier: its counts are settled once, after.
        plain = not shared and not self.min_share[i]
        tier = tiers[i]
        taken = taken_tokens = 0
        while q.live and len(batch) < most:
            for j in shared:
                if credit[j] > 0 and tiers[j].live:
                    return self._settle(batch, taken, taken_tokens, tokens)
            e = q.top()
            if e is None:
                break
            c = cost(e)
            if c > q.deficit or tokens + e.tokens > most_tokens:
                break
            if plain:
                tier.take(q, e, c)
            else:
                self._take((e, i, q, c))
            e.state = DISPATCHED
            taken += 1
            taken_tokens += e.tokens
            tokens += e.tokens
            batch.append(e)
        return self._settle(batch, taken, taken_tokens, tokens)

    def _settle(self, batch: list[Entry], taken: int, taken_tokens: int, tokens: int) -> int:
        """:meth:`_take_run` took the last ``taken`` requests of ``batch`` (``taken_tokens``
        tokens, all of one tier): take them off the held counts; returns ``tokens``."""
        if taken:
            self._account(batch[-1], -taken, -taken_tokens)
        return tokens

    def _discard(self, e: Entry) -> None:
        i = self.index.get(e.tier, len(self.tiers) - 1)
        self.tiers[i].discard(e)
        if not self.tiers[i].live:
            self.credit[i] = 0.0

    def rounds(self) -> int:
        return sum(t.rounds for t in self.tiers)

    def has_fresh(self) -> bool:
        for t in self.tiers:
            if t.live:
                return bool(t.fresh)
        return False

    def _peek_fresh(self) -> Pick | None:
        # Strict tiers: only the highest tier with work may go ahead.
        for i, t in enumerate(self.tiers):
            if t.live:
                pick = t.peek_fresh(self.cost.cost)
                return None if pick is None else (pick[1], i, pick[0], pick[2])
        return None

    def _entries(self) -> Iterable[Entry]:
        for t in self.tiers:
            for q in t.orgs.values():
                for item in q.heap:
                    yield item[-1]

    def _clear(self) -> None:
        weight_of = self.tiers[0].weight_of
        self.tiers = [DrrTier(self.endpoint.quantum, weight_of) for _ in self.tiers]
        self.credit = [0.0] * len(self.tiers)

    def reconfigure(self, endpoint: Endpoint) -> None:
        """Apply new quantum, budgets, cost model and weights; held requests stay where they are."""
        self._reconfigure_cost(endpoint)
        self.endpoint = endpoint
        for t in self.tiers:
            t.quantum = endpoint.quantum
            t.reweigh()


class FifoLane(_LaneBase):
    """The baseline: one queue in arrival order, batched the same way, tiers ignored."""

    def __init__(self, endpoint: Endpoint, tiers: list[Tier]):
        super().__init__(endpoint, tiers)
        self._heap: list[tuple[float, int, Entry]] = []

    def _push(self, e: Entry) -> None:
        heappush(self._heap, (e.arrival, e.seq, e))

    def _peek(self) -> Pick | None:
        h = self._heap
        while h and h[0][2].state != HELD:
            heappop(h)
        return (h[0][2],) if h else None

    def _take(self, pick: Pick) -> None:
        heappop(self._heap)

    def _discard(self, e: Entry) -> None:
        pass  # dropped lazily in _peek

    def _entries(self) -> Iterable[Entry]:
        return (item[2] for item in self._heap)

    def _clear(self) -> None:
        self._heap = []

    def reconfigure(self, endpoint: Endpoint) -> None:
        self._reconfigure_cost(endpoint)
        self.endpoint = endpoint

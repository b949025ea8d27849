"""The scheduler core: one lane per endpoint, behind one small facade.

Pure: no I/O, no clock of its own (every call takes ``now``), no logging.
It returns decisions as values; the Kafka service, the simulator and the
tests turn them into sends, commits, logs and metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.batch_order import run_order
from scheduler.entry import Entry
from scheduler.lane import Dispatch, FifoLane, Lane, LaneStats
from schemas.config import Config, Endpoint, Policy

__all__ = ["Policy", "Scheduler"]


class Scheduler:
    """Holds admitted requests and decides, on demand, the next batch per endpoint.

    A request id is held at most once: pushing an id already held is refused
    (a replayed record after a crash or a rebalance), so it can leave only once.
    """

    def __init__(self, config: Config, policy: Policy = "drr"):
        self.policy = policy
        self.config = config
        self.lanes: dict[str, Lane | FifoLane] = {
            name: self._make_lane(name) for name in config.endpoints
        }
        self._held: dict[str, Entry] = {}

    def _weight(self, org: str) -> float:
        o = self.config.orgs.get(org)
        return o.weight if o is not None else 1.0

    def _make_lane(self, endpoint: str, ep: Endpoint | None = None) -> Lane | FifoLane:
        ep = ep or self.config.endpoints[endpoint]
        if self.policy == "fifo":
            return FifoLane(ep, self.config.tiers)
        return Lane(ep, self.config.tiers, self._weight)

    @property
    def held(self) -> int:
        return len(self._held)

    def holds(self, request_id: str) -> bool:
        return request_id in self._held

    def push(self, endpoint: str, e: Entry) -> bool:
        """Hold ``e`` on ``endpoint``'s lane; False if its id is already held.

        Raises KeyError for an endpoint the configuration does not know.
        """
        lane = self.lanes[endpoint]
        if e.id in self._held:
            return False
        e.endpoint = endpoint
        self._held[e.id] = e
        lane.push(e)
        return True

    def remove(self, request_id: str) -> Entry | None:
        """Drop a held request without a decision, returning it (None if not held).

        For a service that lost the partition a request came from: the new
        owner replays it, so it must not also be dispatched here.
        """
        e = self._held.pop(request_id, None)
        if e is None:
            return None
        self.lanes[e.endpoint].remove(e)
        return e

    def next_batch(self, endpoint: str, now: float, *, in_run_order: bool = False,
                   fresh: bool = False, fill: float = 0.0) -> Dispatch:
        """Expire what is due on ``endpoint``, then take its next batch (maybe empty).

        ``in_run_order``: the batch in the order to run it
        (:func:`scheduler.batch_order.run_order`; FIFO keeps arrival order),
        else in the order the lane chose it. ``fresh``: an express batch, one
        request of each org that came in with nothing held and was not served
        since (:meth:`has_fresh`), then topped up in DRR order to ``fill`` x
        the endpoint's ``max_batch_tokens`` (0: nothing more).
        """
        d = self.lanes[endpoint].next_batch(now, fresh=fresh, fill=fill)
        self._forget(d.batch)
        self._forget(d.expired)
        if in_run_order and self.policy != "fifo" and d.batch:
            d = Dispatch(run_order(d.batch, self.config.tier_names), d.expired)
        return d

    # -- what the service and the simulator need of a lane, without reaching in --

    @property
    def endpoints(self) -> list[str]:
        return list(self.lanes)

    def has_fresh(self, endpoint: str) -> bool:
        """Does an org wait on ``endpoint``'s lane that came in with nothing held and was
        not served since (DRR lanes only; :meth:`scheduler.drr.DrrTier.peek_fresh`)?"""
        lane = self.lanes.get(endpoint)
        return lane is not None and lane.has_fresh()

    def held_in(self, endpoint: str) -> int:
        """Requests held on ``endpoint``'s lane (0 for an unknown endpoint)."""
        lane = self.lanes.get(endpoint)
        return lane.held if lane is not None else 0

    def cost(self, endpoint: str, e: Entry) -> float:
        """What ``e`` costs on ``endpoint``'s lane, in its cost model's units."""
        lane = self.lanes.get(endpoint)
        return lane.cost.cost(e) if lane is not None else float(e.tokens)

    def cost_of(self, endpoint: str) -> Callable[[Entry], float]:
        """:meth:`cost` on ``endpoint``'s lane, resolved once (for a batch's requests)."""
        lane = self.lanes.get(endpoint)
        return lane.cost.cost if lane is not None else (lambda e: float(e.tokens))

    def backlog_cost(self, endpoint: str) -> Callable[[str, int, int], float]:
        """``cost(org, requests, tokens)`` of held work on ``endpoint``, in its units.

        For the snapshot's held cost per tier: requests, tokens, or tokens x
        the org's measured ratio (adaptive).
        """
        lane = self.lanes[endpoint]
        model = lane.endpoint.cost_model
        if model == "requests":
            return lambda org, n, tokens: n
        if model == "adaptive":
            ratio = getattr(lane.cost, "ratio", lambda org: 1.0)
            return lambda org, n, tokens: tokens * ratio(org)
        return lambda org, n, tokens: tokens

    def expire(self, now: float) -> list[Entry]:
        """Expire what is due on every lane."""
        out: list[Entry] = []
        for lane in self.lanes.values():
            out.extend(lane.expire(now))
        self._forget(out)
        return out

    def next_deadline(self) -> float | None:
        ds = [d for lane in self.lanes.values() if (d := lane.next_deadline()) is not None]
        return min(ds) if ds else None

    def feedback(self, endpoint: str, samples: Iterable[tuple[str, int, float]]) -> None:
        """Measured ``(org, tokens, seconds)`` of served requests, for the adaptive cost."""
        self.lanes[endpoint].feedback(samples)

    def stats(self) -> dict[str, LaneStats]:
        return {name: lane.stats() for name, lane in self.lanes.items()}

    def reconfigure(self, config: Config) -> None:
        """Apply a new registry without dropping a held request.

        Weights, quanta, budgets and cost models change in place (an adaptive
        model keeps its measurements while the model stays). If the tiers
        changed, lanes are rebuilt and every held request is pushed again in
        its original push order; each lane keeps its cost model's state.
        A removed endpoint keeps its lane until it drains.
        """
        old = self.config
        self.config = config
        if old.tiers != config.tiers:
            held = [(name, e) for name, lane in self.lanes.items() for e in lane.drain()]
            eps = old.endpoints | config.endpoints  # a removed endpoint keeps its settings
            busy = {name for name, _ in held}
            old_lanes = self.lanes
            self.lanes = {
                name: self._make_lane(name, ep)
                for name, ep in eps.items()
                if name in config.endpoints or name in busy
            }
            for name, lane in self.lanes.items():
                if name in old_lanes:
                    lane.keep_cost(old_lanes[name])
            for name, e in sorted(held, key=lambda p: p[1].seq):
                self.lanes[name].push(e)
            return
        for name, ep in config.endpoints.items():
            if name in self.lanes:
                self.lanes[name].reconfigure(ep)
            else:
                self.lanes[name] = self._make_lane(name)

    def _forget(self, entries: list[Entry]) -> None:
        held = self._held
        for e in entries:
            held.pop(e.id, None)

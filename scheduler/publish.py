"""The state snapshot: what the scheduler publishes for admission's throttle, and its gauges.

Every ``state_interval_ms`` the leader publishes a
:class:`~schemas.messages.SchedulerState`: per lane, what it holds per tier
(requests, tokens, cost), the orgs with work, the measured service rate and
batch time, the workers and their credit, and the tokens outstanding at
them. :func:`snapshot` builds it from the core, flow control, the backlog
and the rates, and says per lane what the service's gauges show. Pure: the
clock is an argument.
"""

from __future__ import annotations

from typing import NamedTuple

from scheduler.core import Scheduler
from scheduler.dispatch import Dispatcher
from scheduler.flow import FlowControl
from scheduler.snapshot import Backlog, ServiceRate, lane_state
from schemas.messages import LaneState, SchedulerState

__all__ = ["LaneGauges", "snapshot"]


class LaneGauges(NamedTuple):
    """One lane's figures for the service's gauges."""

    endpoint: str
    held_by_tier: dict[str, int]
    held_tokens_by_tier: dict[str, int]
    held_cost_by_tier: dict[str, float]
    free_slots: int
    workers: int
    rounds: int
    #: Flow control's view (means over the workers measured; 0 when none is).
    round_trip_s: float
    full_batch_s: float
    outstanding: int


def snapshot(now: float, *, core: Scheduler, flow: FlowControl, backlog: Backlog,
             rates: ServiceRate, dispatcher: Dispatcher, epoch: int, top_orgs: int,
             costs=None, admitted_through_ms: int | None = None, hops_ms: float = 0.0,
             ) -> tuple[SchedulerState, list[LaneGauges]]:
    """The snapshot to publish and each lane's gauges, as of ``now`` (epoch seconds);
    ``hops_ms``: the measured hops after admission (:class:`scheduler.snapshot.HopTime`)."""
    lanes: dict[str, LaneState] = {}
    gauges: list[LaneGauges] = []
    for endpoint, st in core.stats().items():
        workers = flow.endpoint_workers(endpoint)
        free = flow.free_slots(endpoint)
        full = flow.full_batch_tokens.get(endpoint, 0)
        lane = lanes[endpoint] = lane_state(
            endpoint, held_requests=st.held, held_tokens_by_tier=st.held_tokens_by_tier,
            held_cost_by_tier=backlog.cost_by_tier(endpoint, core.backlog_cost(endpoint)),
            backlog=backlog, tokens_per_s=rates.total(w.worker for w in workers),
            free_slots=free, workers=len(workers), top_orgs=top_orgs,
            in_flight_tokens=dispatcher.in_flight_tokens(endpoint, full),
            batch_ms=rates.batch_seconds([w.worker for w in workers], full) * 1000,
            turns=core.policy != "fifo", hops_ms=hops_ms)
        trips = [w.credit.round_trip_ms for w in workers if w.credit.round_trip_ms is not None]
        batches = [w.credit.estimate_ms(full) for w in workers if w.credit.samples]
        gauges.append(LaneGauges(
            endpoint, st.held_by_tier, st.held_tokens_by_tier, lane.held_cost_by_tier, free,
            len(workers), st.rounds,
            sum(trips) / len(trips) / 1000 if trips else 0.0,
            sum(batches) / len(batches) / 1000 if batches else 0.0,
            sum(len(w.unreleased()) for w in workers)))
    state = SchedulerState(sent_ms=int(now * 1000), lanes=lanes, held_requests=core.held,
                           epoch=epoch, costs=costs or {},
                           admitted_through_ms=admitted_through_ms)
    return state, gauges

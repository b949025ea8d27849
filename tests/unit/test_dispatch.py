"""Dispatch, expiry and the state snapshot: the scheduler service's decisions, without Kafka."""

import pytest

from scheduler.core import Scheduler
from scheduler.dispatch import Dispatcher
from scheduler.entry import Entry
from scheduler.expiry import expire
from scheduler.flow import FlowControl
from scheduler.publish import snapshot
from scheduler.snapshot import Backlog, ServiceRate
from schemas.build import build_config
from schemas.messages import AdmittedRequest, EmbedInput, WorkerEvent

CONFIG = build_config(worker_slots=2, orgs={"bulk": "free", "quiet": "free"},
                      endpoints={"embed": {"quantum": 4, "max_batch_tokens": 8,
                                           "max_batch_size": 4, "max_request_tokens": 4}}).config


def _entry(i: int, org: str, tokens: int = 2, deadline_s: float | None = None) -> Entry:
    req = AdmittedRequest(id=f"r{i}", org=org, endpoint="embed", tier="free",
                          input=EmbedInput(texts=("x",)), tokens=tokens, created_ms=1,
                          admitted_ms=1, reply_to="sf.results",
                          deadline_at_ms=None if deadline_s is None else int(deadline_s * 1000))
    return Entry(req.id, org, "free", tokens, deadline=deadline_s, arrival=i, payload=req)


def _setup():
    core = Scheduler(CONFIG)
    flow = FlowControl(10_000, mode="slots", full_batch_tokens={"embed": 8})
    backlog = Backlog()
    return core, flow, backlog, Dispatcher(core, flow, backlog, instance="s1")


def _hello(flow: FlowControl, now_ms: float, slots: int = 2) -> None:
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="hello", partitions=[0, 1],
                             slots=slots, free_slots=slots, sent_ms=int(now_ms)), now_ms)


def _hold(core: Scheduler, backlog: Backlog, entries: list[Entry]) -> None:
    for e in entries:
        core.push("embed", e)
        backlog.add("embed", e.tier, e.org, e.tokens)


def test_no_batch_without_a_worker_with_credit():
    """Work is held, but nothing goes out before a worker announces itself."""
    core, _flow, backlog, disp = _setup()
    _hold(core, backlog, [_entry(i, "bulk") for i in range(8)])
    assert list(disp.batches(1.0, may=lambda: True, on_expired=list)) == []
    assert core.held == 8


def test_batches_fill_the_credit_and_carry_run_order_and_the_epoch():
    """Two slots: two batches; the quiet org's one request runs first in its batch."""
    core, flow, backlog, disp = _setup()
    disp.epoch = 7
    _hello(flow, 1000)
    _hold(core, backlog, [*(_entry(i, "bulk") for i in range(6)), _entry(9, "quiet")])
    out = list(disp.batches(1.0, may=lambda: True, on_expired=list))
    assert len(out) == 2 and {o.partition for o in out} == {0, 1}
    assert all(o.batch.epoch == 7 and o.batch.worker == "w" for o in out)
    first = [r.org for r in out[0].batch.requests]
    assert "quiet" in first and first[0] == "quiet"
    assert sum(o.batch.tokens for o in out) == backlog_tokens_removed(out)
    assert disp.in_flight_tokens("embed", 8) == sum(o.batch.tokens for o in out)


def test_a_batch_carries_the_round_trip_measured_to_its_worker():
    """None before the worker's first report; then the credit's measured round trip."""
    core, flow, backlog, disp = _setup()
    _hello(flow, 1000)
    _hold(core, backlog, [_entry(i, "bulk") for i in range(16)])
    first = list(disp.batches(1.0, may=lambda: True, on_expired=list))
    assert first and all(o.batch.round_trip_ms is None for o in first)
    done = first[0].batch
    # Sent at 1,000 ms, reported at 1,100 after the worker held it 70: 30 ms of round trip.
    flow.observe(WorkerEvent(worker="w", endpoint="embed", kind="batch_done", partitions=[0, 1],
                             slots=2, free_slots=2, sent_ms=1100, batch_id=done.id,
                             batch_tokens=done.tokens, held_ms=70, service_ms=60), 1100)
    assert flow.round_trip_ms("w") == 30
    again = list(disp.batches(1.2, may=lambda: True, on_expired=list))
    assert again and all(o.batch.round_trip_ms == 30 for o in again)


def backlog_tokens_removed(out) -> int:
    return sum(e.tokens for o in out for e in o.entries)


def test_leadership_is_asked_before_every_batch():
    """When may() turns false after the first batch, no second batch is made."""
    core, flow, backlog, disp = _setup()
    _hello(flow, 1000)
    _hold(core, backlog, [_entry(i, "bulk") for i in range(8)])
    answers = iter([True, False])
    out = list(disp.batches(1.0, may=lambda: next(answers, False), on_expired=list))
    assert len(out) == 1 and core.held == 4


def test_expired_requests_get_a_result_naming_how_late_and_leave_the_backlog():
    """A request past its deadline is answered ``expired`` and no longer counted as held."""
    core, _flow, backlog, _disp = _setup()
    e = _entry(1, "bulk", deadline_s=1.0)
    _hold(core, backlog, [e])
    got = expire(core.expire(1.5), backlog, 1500)
    assert [(x.request.id, x.result.status, x.result.reason, x.late_ms) for x in got] == [
        ("r1", "expired", "deadline_passed", 500)]
    assert backlog.active_orgs("embed") == {}


def test_snapshot_counts_what_is_held_and_what_is_out():
    """The published state holds the lane's backlog and the tokens at the workers."""
    core, flow, backlog, disp = _setup()
    _hello(flow, 1000)
    _hold(core, backlog, [_entry(i, "bulk") for i in range(12)])
    out = list(disp.batches(1.0, may=lambda: True, on_expired=list))
    state, gauges = snapshot(2.0, core=core, flow=flow, backlog=backlog, rates=ServiceRate(),
                             dispatcher=disp, epoch=3, top_orgs=5)
    lane = state.lanes["embed"]
    assert state.epoch == 3 and state.held_requests == 12 - 4 * len(out)
    assert lane.held_tokens_by_tier["free"] == 2 * state.held_requests
    assert lane.in_flight_tokens == sum(o.batch.tokens for o in out)
    assert gauges[0].outstanding == len(out) == 2


def test_a_lane_says_whether_it_serves_orgs_in_turns():
    """Admission paces an org only behind a lane that serves orgs in turns (producer/pacing.py)."""
    for policy, turns in (("drr", True), ("fifo", False)):
        core = Scheduler(CONFIG, policy)
        _, flow, backlog, _ = _setup()
        disp = Dispatcher(core, flow, backlog, instance="s1")
        state, _ = snapshot(2.0, core=core, flow=flow, backlog=backlog, rates=ServiceRate(),
                            dispatcher=disp, epoch=1, top_orgs=5)
        assert state.lanes["embed"].turns is turns, policy


def test_the_published_batch_time_is_at_most_a_full_batch_at_the_rate():
    """A report timed across a stall must not become the throttle's batch time
    (tests/unit/test_throttle.py): the snapshot bounds it by a full batch (8 tokens
    here) at the measured rate."""
    core, flow, backlog, disp = _setup()
    _hello(flow, 1000)
    rates = ServiceRate()
    for i in range(1, 31):  # 8 tokens every 10 ms, back to back: 800 tokens/s
        rates.observe("w", 8, 0.01, done_ms=1000 + 10 * i, busy_after=True)
    rates.observe("w", 8, 0.01, done_ms=11_300)  # 10 s after the report before
    assert rates.batch_seconds(["w"]) > 2.0
    state, _ = snapshot(12.0, core=core, flow=flow, backlog=backlog, rates=rates,
                        dispatcher=disp, epoch=1, top_orgs=5)
    lane = state.lanes["embed"]
    assert lane.tokens_per_s == pytest.approx(0.8 * 800 + 0.2 * 0.8)
    assert lane.batch_ms == pytest.approx(8 / lane.tokens_per_s * 1000)  # 12.5 ms

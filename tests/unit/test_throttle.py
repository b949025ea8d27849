"""The throttle's wait prediction and the overload check, from scheduler snapshots."""

from __future__ import annotations

from producer.throttle import ThrottleState, predict_wait_ms
from scheduler.snapshot import HOP_FRESH_S, Backlog, HopTime, ServiceRate, lane_state
from schemas.messages import LaneState, SchedulerState
from tests.admission_setup import NOW_MS, make_config

CFG = make_config()  # embed: latency_target_ms = 1000; max_held_requests = 100


def snapshot(*, sent_ms=NOW_MS, held_requests=10, epoch=0, tokens_per_s=1000.0,
             held=None, active=None, org_held=None) -> SchedulerState:
    lane = LaneState(
        endpoint="embed",
        held_requests=held_requests,
        held_cost_by_tier={},
        held_tokens_by_tier=held if held is not None else {"standard": 10_000},
        tokens_per_s=tokens_per_s,
        free_slots=0,
        workers=1,
        active_orgs_by_tier=active if active is not None else {"standard": 2},
        org_held_tokens=org_held if org_held is not None else {"bulk": 9_900},
    )
    return SchedulerState(sent_ms=sent_ms, lanes={"embed": lane}, held_requests=held_requests,
                          epoch=epoch)


def throttled(ts: ThrottleState, org="bulk", tier="standard", tokens=10, now_ms=NOW_MS,
              deadline_at_ms=None):
    return ts.check_throttle(CFG, endpoint="embed", tier=tier, org=org, tokens=tokens,
                             now_ms=now_ms, deadline_at_ms=deadline_at_ms)


def fresh(state: SchedulerState) -> ThrottleState:
    ts = ThrottleState()
    ts.observe(state, NOW_MS)
    return ts


def test_bursting_org_is_throttled_with_retry_after_and_message():
    """An org holding most of its tier's backlog waits for the whole tier: throttled."""
    v = throttled(fresh(snapshot()))
    assert v is not None and v.reason == "throttled"
    # min(10000 + 10, (9900 + 10) x 2) = 10010 tokens at 1000/s = 10010 ms, budget 1000 ms.
    assert v.retry_after_ms == 9_010
    assert "10010 ms" in v.message and "latency_target_ms = 1000" in v.message


def test_quiet_org_in_the_same_tier_is_not_throttled():
    """An org with nothing held waits about (its tokens x active orgs): admitted."""
    assert throttled(fresh(snapshot()), org="quiet") is None
    wait = predict_wait_ms(snapshot(), CFG, endpoint="embed", tier="standard", org="quiet",
                           tokens=10)
    assert wait == 20.0


def test_higher_tiers_count_and_lower_tiers_do_not():
    """Strict priority: an enterprise request ignores the standard backlog, a free one waits for it."""
    state = snapshot(held={"standard": 10_000, "free": 50_000}, active={"standard": 2, "free": 1},
                     org_held={})
    ts = fresh(state)
    assert throttled(ts, org="acme", tier="enterprise") is None
    v = throttled(ts, org="trial", tier="free")
    assert v is not None and v.retry_after_ms == 10_000 + 10 - 1_000


def test_deadline_replaces_latency_target():
    """A request's own deadline is its budget: a long one admits, a short one throttles."""
    ts = fresh(snapshot())
    assert throttled(ts, deadline_at_ms=NOW_MS + 20_000) is None
    v = throttled(ts, org="quiet", deadline_at_ms=NOW_MS + 5)
    assert v is not None and "deadline (5 ms from now)" in v.message and v.retry_after_ms == 15


def test_no_measured_rate_does_not_throttle():
    """tokens_per_s = 0 (no batch served yet): never throttle."""
    assert throttled(fresh(snapshot(tokens_per_s=0.0))) is None


def test_no_snapshot_or_unknown_lane_does_not_throttle():
    """Without a snapshot, or without a lane for the endpoint, nothing is throttled."""
    assert throttled(ThrottleState()) is None
    ts = fresh(snapshot())
    assert ts.check_throttle(CFG, endpoint="rerank", tier="standard", org="bulk", tokens=10,
                             now_ms=NOW_MS) is None


def test_stale_snapshot_stops_throttling():
    """A snapshot older than stale_after_ms (scheduler gone) throttles nobody."""
    ts = ThrottleState(stale_after_ms=5_000)
    ts.observe(snapshot(), NOW_MS)
    assert throttled(ts, now_ms=NOW_MS + 5_000) is not None
    assert throttled(ts, now_ms=NOW_MS + 5_001) is None


def test_overload_from_snapshot():
    """held_requests at max_held_requests refuses with a message naming the limit."""
    ts = fresh(snapshot(held_requests=99))
    assert ts.check_overload(CFG) is None
    ts = fresh(snapshot(held_requests=100))
    v = ts.check_overload(CFG)
    assert v is not None and v.reason == "overloaded" and v.retry_after_ms == 1_000
    assert "max_held_requests = 100" in v.message


def test_overload_counts_admitted_since_snapshot_even_when_stale():
    """With the scheduler gone, admissions since its last snapshot still lead to overload."""
    ts = ThrottleState(stale_after_ms=5_000)
    ts.observe(snapshot(held_requests=90), NOW_MS)
    ts.note_admitted(9)
    assert ts.check_overload(CFG) is None
    ts.note_admitted()
    assert ts.check_overload(CFG) is not None
    assert not ts.is_fresh(NOW_MS + 60_000) and ts.check_overload(CFG) is not None
    ts.observe(snapshot(held_requests=0, sent_ms=NOW_MS + 60_000), NOW_MS + 60_000)
    assert ts.check_overload(CFG) is None  # a fresh snapshot resets the count


def test_overload_without_any_snapshot_counts_admissions():
    """Before any snapshot, admissions alone count towards max_held_requests."""
    ts = ThrottleState()
    ts.note_admitted(100)
    assert ts.check_overload(CFG) is not None


def test_latest_snapshot_wins_and_higher_epoch_wins():
    """An older snapshot is ignored; a new leader's (higher epoch) replaces the old one's."""
    ts = ThrottleState()
    assert ts.observe(snapshot(sent_ms=NOW_MS, epoch=1), NOW_MS)
    assert not ts.observe(snapshot(sent_ms=NOW_MS - 1, epoch=1), NOW_MS)
    assert not ts.observe(snapshot(sent_ms=NOW_MS + 1, epoch=0), NOW_MS)
    assert ts.observe(snapshot(sent_ms=NOW_MS - 10, epoch=2), NOW_MS)
    assert ts.state.epoch == 2


def test_stale_snapshot_loses_to_any_other():
    """Once the held snapshot is stale, a lower epoch's fresh snapshot is taken."""
    ts = ThrottleState(stale_after_ms=5_000)
    ts.observe(snapshot(sent_ms=NOW_MS, epoch=3), NOW_MS)
    later = NOW_MS + 10_000
    assert ts.observe(snapshot(sent_ms=later, epoch=0), later)
    assert ts.state.epoch == 0


def test_time_waited_before_admission_counts_against_the_target():
    """A request that sat in the ingress backlog has less budget left; past the target: refused."""
    ts = fresh(snapshot(held_requests=0))
    target = CFG.endpoints["embed"].latency_target_ms
    quiet = {"endpoint": "embed", "tier": "standard", "org": "quiet", "tokens": 10,
             "now_ms": NOW_MS}
    assert ts.check_throttle(CFG, **quiet) is None
    late = ts.check_throttle(CFG, **quiet, waited_ms=target + 500)
    assert late is not None and late.reason == "throttled" and late.retry_after_ms == 500
    assert "before admission" in late.message
    # Even with no snapshot at all.
    assert ThrottleState().check_throttle(CFG, **quiet, waited_ms=target) is not None
    assert ThrottleState().check_throttle(CFG, **quiet, waited_ms=target - 1) is None


def test_admissions_since_the_snapshot_count_in_the_prediction():
    """A burst decided against one snapshot sees its own admissions grow the predicted wait."""
    ts = fresh(snapshot(held_requests=0))
    assert throttled(ts, org="quiet", tokens=100) is None
    # quiet alone in its tier (CFG: 1000 ms target at 1000 tokens/s): ~9 more fit.
    admitted = 0
    while throttled(ts, org="quiet", tokens=100) is None:
        ts.note_admitted(endpoint="embed", tier="standard", org="quiet", tokens=100)
        admitted += 1
    assert 1 <= admitted <= 10
    ts.observe(snapshot(held_requests=0, sent_ms=NOW_MS + 1), NOW_MS + 1)
    assert throttled(ts, org="quiet", tokens=100) is None, "a new snapshot starts afresh"


def test_batches_at_the_workers_count_ahead_of_every_tier():
    """Tokens already dispatched (in flight) are waited for by any new request."""
    import msgspec

    state = snapshot(held_requests=0)
    lane = state.lanes["embed"]
    busy = msgspec.structs.replace(
        state, lanes={"embed": msgspec.structs.replace(lane, in_flight_tokens=500)})
    args = {"endpoint": "embed", "tier": "standard", "org": "quiet", "tokens": 10}
    idle_ms = predict_wait_ms(state, CFG, **args)
    assert predict_wait_ms(busy, CFG, **args) == idle_ms + 500  # 1000 tokens/s


def _quiet_lane_snapshot(sent_ms: int, through: int | None) -> SchedulerState:
    state = snapshot(sent_ms=sent_ms, held={}, active={"standard": 1}, org_held={},
                     held_requests=0)
    state.admitted_through_ms = through
    return state


def test_a_snapshot_counts_only_what_the_scheduler_had_read():
    """Admitted after the snapshot's admitted_through_ms: still on the tier topic, still counted.

    At the onset of an overload the snapshot after a big step did not show
    that step yet; forgetting it admitted the step's worth again.
    """
    ts = fresh(_quiet_lane_snapshot(NOW_MS, None))
    for i in range(6):  # 6 x 100 tokens, admitted 10 ms apart
        ts.note_admitted(endpoint="embed", tier="standard", org="bulk", tokens=100,
                         at_ms=NOW_MS + 10 * i)
    # The scheduler has read the first three (admitted_ms up to NOW_MS + 20).
    assert ts.observe(_quiet_lane_snapshot(NOW_MS + 100, NOW_MS + 20), NOW_MS + 100)
    assert ts.admitted_since == 3
    assert ts.tokens_since["embed"] == {("tier", "standard"): 300, ("org", "bulk"): 300}
    wait = predict_wait_ms(ts.state, CFG, endpoint="embed", tier="standard", org="bulk",
                           tokens=10, since=ts.tokens_since["embed"])
    assert wait == 310.0  # (300 in transit + 10) tokens at 1000/s
    # Then all of them: nothing left on top of the snapshot.
    assert ts.observe(_quiet_lane_snapshot(NOW_MS + 200, NOW_MS + 50), NOW_MS + 200)
    assert ts.admitted_since == 0 and ts.tokens_since["embed"] == {}
    assert ts.held_estimate() == 0


def test_a_snapshot_without_the_stamp_forgets_everything_admitted_before_it():
    """A scheduler from before admitted_through_ms: counted until the next snapshot, as before."""
    ts = fresh(_quiet_lane_snapshot(NOW_MS, None))
    ts.note_admitted(endpoint="embed", tier="standard", org="bulk", tokens=100, at_ms=NOW_MS)
    ts.note_admitted(endpoint="embed", tier="standard", org="bulk", tokens=100)
    assert ts.observe(_quiet_lane_snapshot(NOW_MS + 100, None), NOW_MS + 100)
    assert ts.admitted_since == 0 and ts.tokens_since == {}


def test_a_batch_timed_across_a_stall_does_not_throttle_an_empty_lane_for_good():
    """A report that spans a broker stall is one long batch to the service rate. Taken as
    the batch time, two of them exceeded every budget: the throttle refused every request,
    on an empty lane too, and no full batch came to correct it. A full batch's time is
    bounded by its tokens at the measured rate, which one report moves by a fifth."""
    rates = ServiceRate()
    t = 10_000.0
    for _ in range(20):  # 1,000-token batches back to back, 0.2 s each: 5,000 tokens/s
        t += 200
        rates.observe("w", 1000, 0.2, done_ms=t, busy_after=True, min_tokens=500)
    t += 10_000  # the next report comes ten seconds later: the results waited on the broker
    rates.observe("w", 1000, 0.2, done_ms=t, busy_after=False, min_tokens=500)
    assert rates.batch_seconds(["w"]) > 2.0  # the EMA of seconds: 0.2 x 0.8 + 10 x 0.2

    def empty_lane(batch_ms: float) -> SchedulerState:
        lane = lane_state("embed", held_requests=0, held_tokens_by_tier={},
                          held_cost_by_tier={}, backlog=Backlog(),
                          tokens_per_s=rates.total(["w"]), free_slots=1, workers=1,
                          top_orgs=5, batch_ms=batch_ms)
        return SchedulerState(sent_ms=NOW_MS, lanes={"embed": lane}, held_requests=0)

    # What the snapshot published before: the EMA of seconds alone (1,000 ms target).
    assert throttled(fresh(empty_lane(rates.batch_seconds(["w"]) * 1000))) is not None
    bounded = rates.batch_seconds(["w"], full_tokens=1000)
    assert bounded == 1000 / rates.total(["w"]) < 0.25
    assert throttled(fresh(empty_lane(bounded * 1000))) is None


def _lane_with_hops(hops_ms: float, held: int = 0) -> SchedulerState:
    """One lane at 1,000 tokens/s holding ``held`` tokens of org "bulk", with ``hops_ms``."""
    lane = LaneState(endpoint="embed", held_requests=held // 10, held_cost_by_tier={},
                     held_tokens_by_tier={"standard": held}, tokens_per_s=1000.0,
                     free_slots=0, workers=1, active_orgs_by_tier={"standard": 1},
                     org_held_tokens={"bulk": held}, hops_ms=hops_ms)
    return SchedulerState(sent_ms=NOW_MS, lanes={"embed": lane}, held_requests=held // 10)


def test_the_prediction_counts_the_hops_after_admission():
    """The tier topic in and the result out are part of a request's time: a request whose
    batch would be done just within the target is throttled once they are counted."""
    wait = predict_wait_ms(_lane_with_hops(70.0, held=900), CFG, endpoint="embed",
                           tier="standard", org="bulk", tokens=50)
    assert wait == 950.0 + 70.0
    assert throttled(fresh(_lane_with_hops(0.0, held=900)), tokens=50) is None
    v = throttled(fresh(_lane_with_hops(70.0, held=900)), tokens=50)
    assert v is not None and v.retry_after_ms == 20
    # A snapshot from a scheduler older than the field, or a value no clock gives: none.
    for odd in (0.0, -5.0, float("nan"), float("inf")):
        assert predict_wait_ms(_lane_with_hops(odd, held=900), CFG, endpoint="embed",
                               tier="standard", org="bulk", tokens=50) == 950.0, odd


def test_a_stall_in_the_tier_topic_does_not_throttle_an_empty_lane_for_good():
    """One fetch after a ten-second stall times the hop at ten seconds: every request is
    throttled while that is fresh. With none admitted no new sample comes; once it is stale
    the snapshot carries no hops, a request gets through, and its sample starts afresh."""
    hops = HopTime()
    hops.observe(10_000.0, 100.0)
    assert throttled(fresh(_lane_with_hops(hops.published_ms(100.25))), org="quiet") is not None
    later = 100.0 + HOP_FRESH_S + 0.25
    assert throttled(fresh(_lane_with_hops(hops.published_ms(later))), org="quiet") is None
    hops.observe(15.0, later + 0.1)
    assert hops.published_ms(later + 0.25) == 30.0

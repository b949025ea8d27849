"""A new leader continues the adaptive costs of the one it replaces (scheduler.handover)."""

from __future__ import annotations

import random

import pytest

from scheduler import Entry, Scheduler
from scheduler.handover import CostHandover
from schemas.codec import codec_for
from schemas.messages import BatchTiming, SchedulerState, WorkerEvent
from tests.core_setup import ENDPOINT, config_for

ORGS = {"pads": "t0", "lean": "t0", "new": "t0"}


def config(cost_model="adaptive"):
    return config_for(orgs=ORGS, cost_model=cost_model, quantum=400, max_request_tokens=100)


def reports(n: int, seed: int = 1, workers=("w1", "w2")) -> list[WorkerEvent]:
    """batch_done events: 'pads' costs 5x per token what 'lean' does, with noise."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        timings = [BatchTiming(org=org, tokens=t, seconds=t * per * rng.uniform(0.8, 1.2))
                   for org, per in (("pads", 5e-4), ("lean", 1e-4))
                   for t in [rng.randint(5, 100)]]
        out.append(WorkerEvent(worker=workers[i % len(workers)], endpoint=ENDPOINT,
                               kind="batch_done", partitions=[0], slots=2, free_slots=1,
                               sent_ms=1_000_000 + i, batch_id=f"b{i}", timings=timings))
    return out


def apply(core: Scheduler, handover: CostHandover, ev: WorkerEvent) -> None:
    """What the service does with a batch_done: feed the core, note the report."""
    core.feedback(ev.endpoint, [(t.org, t.tokens, t.seconds) for t in ev.timings])
    handover.seen(ev)


def costs(core: Scheduler) -> dict[str, float]:
    cost = core.lanes[ENDPOINT].cost.cost
    return {org: cost(Entry(f"x-{org}", org, "t0", 50)) for org in ORGS}


def snapshot(core: Scheduler, handover: CostHandover, epoch: int, sent_ms: int) -> SchedulerState:
    """Through the wire codec, as a standby reads it."""
    state = SchedulerState(sent_ms=sent_ms, lanes={}, held_requests=0, epoch=epoch,
                           costs=handover.export(core))
    codec = codec_for(SchedulerState)
    return codec.decode(codec.encode(state), "msgpack")


@pytest.mark.parametrize("seen_by_standby", [0, 5, 30])
def test_the_new_leader_charges_what_the_old_one_would_have(seen_by_standby):
    """Snapshot after 40 reports, 10 more after it: the standby ends with the leader's exact costs."""
    evs = reports(50)
    leader, lh = Scheduler(config()), CostHandover()
    standby, sh = Scheduler(config()), CostHandover()
    for i, ev in enumerate(evs):
        apply(leader, lh, ev)
        if i >= 50 - seen_by_standby - 10:  # the standby started late: it saw only the last ones
            apply(standby, sh, ev)
        if i == 39:
            sh.offer(snapshot(leader, lh, epoch=7, sent_ms=2_000_000))
    before = costs(standby)
    want = costs(leader)
    assert want["pads"] > 3 * want["lean"]  # the measurements matter
    took = sh.take_over(standby, epoch=8)
    assert took is not None and took.lanes == (ENDPOINT,) and took.from_epoch == 7
    assert took.replayed == 10
    assert costs(standby) == pytest.approx(want, rel=1e-12)
    if seen_by_standby < 30:
        assert before != pytest.approx(want, rel=1e-3)  # without the takeover it would differ


@pytest.mark.parametrize("bound", [{"keep": 5}, {"keep_samples": 11}],
                         ids=["reports", "timings"])
def test_marks_older_than_what_is_kept_fall_back_to_report_times(bound):
    """With the marked reports gone from the buffer, reports after the marks' time are replayed.

    Each report holds two timings, so 11 timings keep the last 5 reports, as 5 reports do.
    """
    evs = reports(30)
    leader, lh = Scheduler(config()), CostHandover()
    standby, sh = Scheduler(config()), CostHandover(**bound)
    for i, ev in enumerate(evs):
        apply(leader, lh, ev)
        apply(standby, sh, ev)
        if i == 24:
            sh.offer(snapshot(leader, lh, epoch=1, sent_ms=5))
    took = sh.take_over(standby, epoch=2)
    assert took.replayed == 5
    assert costs(standby) == pytest.approx(costs(leader), rel=1e-12)


def test_what_is_kept_is_bounded_by_timings_not_only_by_reports():
    """Reports of large batches: the timings kept stay within the bound, the newest report
    stays whatever its size, and each org's name is one string however many reports name it."""
    def big(i: int, n: int) -> WorkerEvent:
        # Decoded, as the service reads it: every org name a fresh string.
        ev = WorkerEvent(worker="w1", endpoint=ENDPOINT, kind="batch_done", partitions=[0],
                         slots=2, free_slots=1, sent_ms=i, batch_id=f"b{i}",
                         timings=[BatchTiming(org="pads", tokens=9, seconds=1e-3)] * n)
        codec = codec_for(WorkerEvent)
        return codec.decode(codec.encode(ev), "msgpack")

    h = CostHandover(keep_samples=1_000)
    for i in range(50):
        h.seen(big(i, 256))
    assert [r[2].batch_id for r in h.recent] == ["b47", "b48", "b49"]
    assert h.samples == sum(len(r[3]) for r in h.recent) == 768
    assert len({id(org) for r in h.recent for org, _, _ in r[3]}) == 1
    h.seen(big(50, 5_000))
    assert [r[2].batch_id for r in h.recent] == ["b50"] and h.samples == 5_000


def test_only_an_older_leaders_newest_snapshot_counts():
    """Own or newer epochs are ignored; of several snapshots the newest is taken; none: nothing."""
    leader, lh = Scheduler(config()), CostHandover()
    for ev in reports(10):
        apply(leader, lh, ev)
    sh = CostHandover()
    assert sh.take_over(Scheduler(config()), epoch=3) is None
    sh.offer(SchedulerState(sent_ms=1, lanes={}, held_requests=0, epoch=9))  # no costs: ignored
    assert sh.latest is None
    old = snapshot(leader, lh, epoch=2, sent_ms=10)
    newer = snapshot(leader, lh, epoch=2, sent_ms=20)
    sh.offer(newer)
    sh.offer(old)
    assert sh.latest is newer
    assert sh.take_over(Scheduler(config()), epoch=2) is None  # its own epoch: not a predecessor
    assert sh.take_over(Scheduler(config()), epoch=3) is not None


def test_lanes_that_do_not_measure_export_nothing_and_take_nothing():
    """A tokens lane has no cost state; a snapshot's adaptive lane does not change it."""
    leader, lh = Scheduler(config()), CostHandover()
    for ev in reports(5):
        apply(leader, lh, ev)
    sh = CostHandover()
    sh.offer(snapshot(leader, lh, epoch=1, sent_ms=1))
    tokens = Scheduler(config("tokens"))
    assert CostHandover().export(tokens) == {}
    took = sh.take_over(tokens, epoch=2)
    assert took.lanes == ()
    assert costs(tokens) == {org: 50.0 for org in ORGS}


def test_restore_drops_values_that_are_not_finite_and_positive():
    """A broken snapshot must not poison the averages."""
    core = Scheduler(config())
    lane = core.lanes[ENDPOINT]
    assert lane.restore_cost(float("nan"), {"pads": 2e-3, "lean": float("inf"), "new": -1.0})
    lane_spt, org_spt = lane.cost_state()
    assert lane_spt is None and org_spt == {"pads": 2e-3}

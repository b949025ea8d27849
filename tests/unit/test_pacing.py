"""Admission's pacing: an org with a second of service held at the scheduler waits in the
read-ahead; the others, FIFO lanes and unknown backlogs are not held back."""

from __future__ import annotations

import pytest

from producer.pacing import RECHECK_S, Pacer, cold_rates
from producer.readahead import ReadAhead
from producer.shaping import Shaper
from producer.throttle import ThrottleState
from schemas.messages import LaneState, SchedulerState
from tests.admission_setup import NOW_MS, make_config


def lane(endpoint="embed", *, org_held=None, tokens_per_s=1000.0, turns=True) -> LaneState:
    return LaneState(endpoint=endpoint, held_requests=1, held_cost_by_tier={},
                     held_tokens_by_tier={}, tokens_per_s=tokens_per_s, free_slots=0,
                     workers=1, org_held_tokens=org_held or {}, turns=turns)


def throttle(*lanes: LaneState, sent_ms=NOW_MS, through=None) -> ThrottleState:
    ts = ThrottleState()
    ts.observe(SchedulerState(sent_ms=sent_ms, lanes={ln.endpoint: ln for ln in lanes},
                              held_requests=1, admitted_through_ms=through), NOW_MS)
    return ts


# -- the backlog estimate ------------------------------------------------------


def test_an_orgs_backlog_is_its_held_tokens_over_the_lanes_rate_the_most_of_its_lanes():
    ts = throttle(lane("embed", org_held={"bulk": 1500}),
                  lane("rerank", org_held={"bulk": 500}, tokens_per_s=100.0))
    assert ts.org_backlog_s("bulk", NOW_MS) == pytest.approx(5.0)
    assert ts.org_backlog_s("quiet", NOW_MS) == 0.0  # not listed: holds (about) nothing


def test_what_this_instance_admitted_since_the_snapshot_counts():
    ts = throttle(lane(org_held={"bulk": 500}), through=NOW_MS - 10)
    ts.note_admitted(endpoint="embed", tier="standard", org="bulk", tokens=700,
                     at_ms=NOW_MS)
    assert ts.org_backlog_s("bulk", NOW_MS) == pytest.approx(1.2)


@pytest.mark.parametrize("why, ts, now_ms", [
    ("a FIFO lane serves in arrival order", throttle(lane(org_held={"bulk": 9000},
                                                          turns=False)), NOW_MS),
    ("no measured rate", throttle(lane(org_held={"bulk": 9000}, tokens_per_s=0.0)), NOW_MS),
    ("a stale snapshot", throttle(lane(org_held={"bulk": 9000})), NOW_MS + 60_000),
    ("no snapshot", ThrottleState(), NOW_MS),
])
def test_no_backlog_is_known_without_a_fresh_snapshot_of_a_lane_in_turns(why, ts, now_ms):
    assert ts.org_backlog_s("bulk", now_ms) is None, why


# -- before a rate is measured ---------------------------------------------------


def test_before_a_rate_is_measured_the_lanes_assumed_rate_stands_in():
    cold = {"embed": 4000.0}
    ts = throttle(lane("embed", org_held={"bulk": 6000}, tokens_per_s=0.0))
    assert ts.org_backlog_s("bulk", NOW_MS, cold_tokens_per_s=cold) == pytest.approx(1.5)
    assert ts.org_backlog_s("quiet", NOW_MS, cold_tokens_per_s=cold) == 0.0
    # Without an assumed rate for the lane, as before: not known.
    assert ts.org_backlog_s("bulk", NOW_MS, cold_tokens_per_s={"rerank": 4000.0}) is None
    assert ts.org_backlog_s("bulk", NOW_MS, cold_tokens_per_s={}) is None


def test_a_measured_rate_wins_over_the_assumed_one():
    ts = throttle(lane("embed", org_held={"bulk": 6000}, tokens_per_s=3000.0))
    assert ts.org_backlog_s("bulk", NOW_MS, cold_tokens_per_s={"embed": 100.0}) == \
        pytest.approx(2.0)


def test_a_fifo_lane_is_not_paced_before_its_rate_either():
    ts = throttle(lane("embed", org_held={"bulk": 90_000}, tokens_per_s=0.0, turns=False))
    assert ts.org_backlog_s("bulk", NOW_MS, cold_tokens_per_s={"embed": 1.0}) is None


def test_the_assumed_rate_paces_an_org_at_cold_batches_full_batches_held():
    config = make_config()
    full = {name: ep.max_batch_tokens for name, ep in config.endpoints.items()}
    rates = cold_rates(config, 0.5, 4)
    assert set(rates) == set(full)
    for name, tokens in full.items():
        held = 4 * tokens
        at = throttle(lane(name, org_held={"bulk": held}, tokens_per_s=0.0))
        under = throttle(lane(name, org_held={"bulk": held - 1}, tokens_per_s=0.0))
        pacer = Pacer(lambda org, t=at: t.org_backlog_s(org, NOW_MS, rates), 0.5)
        assert not pacer.take("bulk", 0.0), name
        pacer = Pacer(lambda org, t=under: t.org_backlog_s(org, NOW_MS, rates), 0.5)
        assert pacer.take("bulk", 0.0), name


def test_no_cold_batches_no_assumed_rate():
    assert cold_rates(make_config(), 1.0, 0) == {}


# -- the pacer -------------------------------------------------------------------


def test_an_org_at_its_limit_is_held_back_and_the_others_pass():
    backlog = {"bulk": 1.0, "calm": 0.99}
    p = Pacer(backlog.get, 1.0)
    assert not p.take(b"bulk", 0.0) and p.due_in(b"bulk", 0.0) == RECHECK_S
    assert p.take(b"calm", 0.0) and p.due_in(b"calm", 0.0) == 0.0
    assert p.take(b"quiet", 0.0)  # backlog unknown (None): never held back
    assert p.take(b"\xff\xfe", 0.0) and p.take(None, 0.0)  # not an org's name


def test_a_pacer_asks_each_orgs_backlog_once():
    asked: list[str] = []
    p = Pacer(lambda org: asked.append(org) or 5.0, 1.0)
    for _ in range(3):
        assert not p.take(b"bulk", 0.0)
    assert asked == ["bulk"]


def test_the_shaper_applies_to_what_pacing_lets_through_and_spends_only_then():
    shaper = Shaper(per_s=1.0, burst=1)
    p = Pacer({"bulk": 5.0}.get, 1.0, shaper)
    assert not p.take(b"bulk", 0.0)
    assert shaper.ready(b"bulk", 0.0), "a paced org's allowance was spent"
    assert p.take(b"quiet", 0.0) and not p.take(b"quiet", 0.0)
    assert p.due_in(b"quiet", 0.0) == pytest.approx(1.0)


def test_a_limit_must_be_positive():
    with pytest.raises(ValueError, match="> 0"):
        Pacer({}.get, 0.0)


class _Rec:
    def __init__(self, key: bytes, n: int):
        self.key, self.value, self.n = key, b"x", n


def test_the_read_ahead_decides_the_quiet_orgs_and_keeps_the_paced_ones_in_order():
    ahead = ReadAhead()
    ahead.add(0, [_Rec(b"bulk", i) for i in range(50)] + [_Rec(b"quiet", 0)])
    ahead.add(1, [_Rec(b"calm", 0)])
    backlog = {"bulk": 3.0}
    taken = ahead.take(100, shaper=Pacer(backlog.get, 1.0))
    assert sorted(r.key for _, r, _ in taken) == [b"calm", b"quiet"]
    assert ahead.held == 50 and ahead.due_in(Pacer(backlog.get, 1.0), 0.0) == RECHECK_S
    backlog["bulk"] = 0.5  # drained: decided again, in its order
    assert [r.n for _, r, _ in ahead.take(100, shaper=Pacer(backlog.get, 1.0))] == list(range(50))

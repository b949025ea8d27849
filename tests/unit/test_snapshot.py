"""Backlog and ServiceRate: the per-org counters behind the scheduler's state snapshot."""

from scheduler.snapshot import (
    HOP_FRESH_S,
    MAX_EXPRESS_SHARE,
    Backlog,
    HopTime,
    ServiceRate,
    lane_state,
)


def test_backlog_counts_orgs_and_tokens():
    """Active orgs per tier and per-org held tokens follow pushes and removals."""
    b = Backlog()
    b.add("e", "gold", "a", 10)
    b.add("e", "gold", "a", 5)
    b.add("e", "gold", "b", 1)
    b.add("e", "free", "c", 100)
    assert b.active_orgs("e") == {"gold": 2, "free": 1}
    assert b.top_orgs("e", 2) == {"c": 100, "a": 15}
    b.remove("e", "gold", "b", 1)
    b.remove("e", "free", "c", 100)
    assert b.active_orgs("e") == {"gold": 1}
    assert b.org_tokens("e") == {"a": 15}
    b.remove("e", "gold", "zzz", 3)  # unknown: ignored
    assert b.cost_by_tier("e", lambda org, n, tok: n) == {"gold": 2.0, "free": 0.0}


def test_service_rate_sums_live_workers():
    """Rates are an EMA per worker; a forgotten or unmeasured worker adds nothing."""
    r = ServiceRate(alpha=0.5)
    r.observe("w1", 1000, 1.0)
    r.observe("w1", 3000, 1.0)
    r.observe("w2", 500, 0.5)
    r.observe("w2", 10, 0.0)  # broken report ignored
    assert r.total(["w1", "w2", "w3"]) == 2000 + 1000
    r.forget("w1")
    assert r.total(["w1", "w2"]) == 1000


def test_lane_state_lists_top_orgs():
    """The snapshot carries active orgs per tier and the top holders only."""
    b = Backlog()
    for i in range(5):
        b.add("e", "gold", f"o{i}", i + 1)
    s = lane_state("e", held_requests=5, held_tokens_by_tier={"gold": 15},
                   held_cost_by_tier={"gold": 15.0}, backlog=b, tokens_per_s=0.0,
                   free_slots=1, workers=1, top_orgs=2)
    assert s.active_orgs_by_tier == {"gold": 5}
    assert s.org_held_tokens == {"o4": 5, "o3": 4}


def test_service_rate_counts_wall_time_of_back_to_back_batches():
    """A worker busy without a pause is measured by the time between reports, not model time."""
    r = ServiceRate(alpha=1.0)
    r.observe("w", 1000, 0.5, done_ms=10_000, busy_after=True)
    assert r.total(["w"]) == 2000  # first report: model time only
    r.observe("w", 1000, 0.5, done_ms=10_800, busy_after=False)
    assert r.total(["w"]) == 1250  # 0.8 s since the last report, which had it in hand
    r.observe("w", 1000, 0.5, done_ms=15_000, busy_after=False)
    assert r.total(["w"]) == 2000  # idle in between: model time


def test_small_batches_do_not_set_the_rate():
    """A batch under min_tokens (a warm-up request) leaves the rate unknown or unchanged."""
    r = ServiceRate(alpha=1.0)
    r.observe("w", 3, 0.15, min_tokens=512)
    assert r.total(["w"]) == 0.0
    r.observe("w", 1024, 0.25, min_tokens=512)
    r.observe("w", 3, 0.15, min_tokens=512)
    assert r.total(["w"]) == 1024 / 0.25


def test_a_batch_full_by_count_sets_the_rate_though_its_tokens_are_few():
    """64 requests of 16 tokens fill a batch by count at a quarter of its 4,096 tokens:
    that is the burst's real speed, and without it the throttle and pacing never start.
    A batch under both halves (3 requests, 48 tokens) still does not count."""
    r = ServiceRate(alpha=1.0)
    r.observe("w", 48, 0.1, min_tokens=2048, requests=3, min_requests=32)
    assert r.total(["w"]) == 0.0
    r.observe("w", 1024, 0.25, min_tokens=2048, requests=64, min_requests=32)
    assert r.total(["w"]) == 1024 / 0.25
    r.observe("w", 1000, 0.5, min_tokens=2048, requests=31, min_requests=32)
    assert r.total(["w"]) == 1024 / 0.25


def test_express_calls_take_their_share_from_the_held_work():
    """Express batches go ahead of everything held: the rate left for it is the
    full batches' rate less the share of busy time their calls took."""
    r = ServiceRate(alpha=1.0)
    r.observe("w", 1000, 0.5, done_ms=10_000, busy_after=True, min_tokens=512)
    assert r.total(["w"]) == 2000
    r.observe("w", 20, 0.1, done_ms=10_100, busy_after=True, min_tokens=512, express=True)
    assert r.total(["w"]) == 2000  # an express batch never sets the rate itself
    r.observe("w", 1000, 0.4, done_ms=10_500, busy_after=True, min_tokens=512)
    assert r.total(["w"]) == 2500 * (1 - 0.1 / 0.5)
    assert r.batch_seconds(["w"]) == 0.4  # the full batch's own time
    # Counted once: the next full batch, with no express call before it, has all of it.
    r.observe("w", 1000, 0.4, done_ms=10_900, busy_after=False, min_tokens=512)
    assert r.total(["w"]) == 2500
    # An express call on an idle worker delayed nothing: no share.
    r.observe("w", 20, 0.1, done_ms=20_000, busy_after=False, min_tokens=512, express=True)
    r.observe("w", 1000, 0.4, done_ms=30_000, busy_after=False, min_tokens=512)
    assert r.total(["w"]) == 2500


def test_a_stretch_of_express_calls_takes_at_most_half():
    """A warm-up where nearly every batch is an express one must not set a rate
    near zero: the throttle would refuse everything, and no full batch would come."""
    r = ServiceRate(alpha=1.0)
    r.observe("w", 1000, 0.5, done_ms=10_000, busy_after=True, min_tokens=512)
    for t in range(1, 41):
        r.observe("w", 13, 0.05, done_ms=10_000 + 50 * t, busy_after=True, min_tokens=512,
                  express=True)
    r.observe("w", 1000, 0.5, done_ms=12_500, busy_after=True, min_tokens=512)
    assert MAX_EXPRESS_SHARE == 0.5
    assert r.total(["w"]) == 1000  # 2 s of express calls against 0.5 s: half, not a fifth
    r.forget("w")
    assert r.total(["w"]) == 0.0


def test_the_hop_time_is_an_average_published_twice_while_fresh():
    """The tier topic's hop, averaged; published doubled (the result's way back is a hop of
    the same kind); nothing once the last sample is older than HOP_FRESH_S."""
    hops = HopTime(alpha=0.5)
    assert hops.published_ms(100.0) == 0.0  # nothing measured yet
    hops.observe(20.0, 100.0)
    hops.observe(40.0, 100.5)
    assert hops.ms == 30.0
    assert hops.published_ms(100.5) == 60.0
    assert hops.published_ms(100.5 + HOP_FRESH_S) == 60.0
    assert hops.published_ms(100.5 + HOP_FRESH_S + 0.01) == 0.0
    hops.observe(-5.0, 100.6)  # the clocks of two hosts: never below 0
    assert hops.ms == 15.0


def test_a_sample_after_a_stale_stretch_starts_the_hop_time_afresh():
    """A long hop (a stall; a new leader reading a backlog) must not be averaged down slowly:
    the throttle would refuse every request meanwhile, and with nothing admitted no sample
    comes. Stale, it is not published; the next sample replaces it."""
    hops = HopTime()
    hops.observe(10_000.0, 50.0)
    assert hops.published_ms(50.1) == 20_000.0
    assert hops.published_ms(50.0 + HOP_FRESH_S + 0.5) == 0.0
    hops.observe(15.0, 50.0 + HOP_FRESH_S + 0.5)
    assert hops.ms == 15.0
    hops.observe(25.0, 50.0 + HOP_FRESH_S + 0.6)  # within the window: averaged
    assert hops.ms == 0.8 * 15.0 + 0.2 * 25.0

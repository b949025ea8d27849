"""The rate limiter: GCRA per org x endpoint x window, requests and tokens."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from producer.ratelimit import RateLimiter
from tests.admission_setup import make_config, registry

T0 = 1_000_000.0


def test_burst_up_to_limit_then_refused_with_emission_interval():
    """A full window may burst; the next request waits one emission interval (60 s / 3)."""
    rl = RateLimiter(make_config())
    for _ in range(3):
        assert rl.acquire("trial", "embed", 1, T0).allowed
    d = rl.acquire("trial", "embed", 1, T0)
    assert not d.allowed
    assert d.retry_after_ms == 20_000
    assert (d.window_s, d.unit, d.limit) == (60.0, "requests", 3)


def test_retry_after_is_exact():
    """Just before retry_after the request is still refused; at retry_after it is allowed."""
    rl = RateLimiter(make_config())
    for _ in range(3):
        rl.acquire("trial", "embed", 1, T0)
    wait = rl.check("trial", "embed", 1, T0).retry_after_ms
    assert not rl.check("trial", "embed", 1, T0 + wait - 1).allowed
    assert rl.acquire("trial", "embed", 1, T0 + wait).allowed


def test_check_charges_nothing():
    """check() only asks: any number of checks leaves the full budget."""
    rl = RateLimiter(make_config())
    for _ in range(10):
        assert rl.check("trial", "embed", 1, T0).allowed
    assert rl.keys == 0
    for _ in range(3):
        assert rl.acquire("trial", "embed", 1, T0).allowed


def test_refusal_charges_no_window():
    """A request refused by the token window does not use up the request window."""
    rl = RateLimiter(make_config())  # free/embed: 3 requests and 40 tokens per 60 s
    assert rl.acquire("trial", "embed", 30, T0).allowed
    refused = rl.acquire("trial", "embed", 30, T0)
    assert not refused.allowed and refused.unit == "tokens"
    # Had the refusal counted as a request, the second of these would fail.
    assert rl.acquire("trial", "embed", 5, T0).allowed
    assert rl.acquire("trial", "embed", 5, T0).allowed


def test_all_windows_must_allow_and_retry_after_is_the_latest():
    """With a minute and a day window, the day window binds once its 5 are spent."""
    rl = RateLimiter(make_config())
    t = T0
    for _ in range(5):
        while not rl.check("trial", "embed", 1, t).allowed:
            t += rl.check("trial", "embed", 1, t).retry_after_ms
        assert rl.acquire("trial", "embed", 1, t).allowed
    d = rl.check("trial", "embed", 1, t + 60_000)
    assert not d.allowed and d.window_s == 86400.0
    # One request refills every 86400 s / 5; the minute window is long free by then.
    first_day_charge = T0
    assert d.retry_after_ms == 86_400_000 // 5 - (t + 60_000 - first_day_charge)


def test_token_retry_after_waits_for_enough_tokens():
    """A token-limited request waits until enough tokens have drained, not one token's worth."""
    rl = RateLimiter(make_config())  # 40 tokens per 60 s: 1 token per 1500 ms
    assert rl.acquire("trial", "embed", 40, T0).allowed
    d = rl.check("trial", "embed", 10, T0)
    assert d.unit == "tokens" and d.retry_after_ms == 15_000


def test_cost_above_a_whole_window_is_never_allowed():
    """A request bigger than a window's limit is refused with no retry-after."""
    rl = RateLimiter(make_config())
    d = rl.check("trial", "embed", 41, T0)
    assert not d.allowed and d.never and d.retry_after_ms is None and d.limit == 40


def test_zero_limit_blocks_the_endpoint():
    """requests = 0 closes an endpoint to a tier, permanently."""
    rl = RateLimiter(make_config())
    d = rl.acquire("trial", "rerank", 1, T0)
    assert not d.allowed and d.never and d.unit == "requests"


def test_no_windows_means_no_limit_and_no_state():
    """An org whose tier has no limits is always allowed and costs no memory."""
    rl = RateLimiter(make_config())
    for _ in range(1000):
        assert rl.acquire("acme", "embed", 20, T0).allowed
    assert rl.keys == 0


def test_org_override_replaces_tier_default():
    """vip-trial's own window (1000/s) replaces the free tier's 3/min."""
    rl = RateLimiter(make_config())
    for _ in range(100):
        assert rl.acquire("vip-trial", "embed", 20, T0).allowed


def test_orgs_and_endpoints_are_limited_separately():
    """One org's spent budget does not touch another org's."""
    cfg = registry(orgs={"trial2": "free"}).config
    rl = RateLimiter(cfg)
    for _ in range(3):
        rl.acquire("trial", "embed", 1, T0)
    assert not rl.check("trial", "embed", 1, T0).allowed
    assert rl.check("trial2", "embed", 1, T0).allowed


def test_idle_keys_expire():
    """Once every bucket of a key has drained its state is dropped, by sweep or by itself."""
    rl = RateLimiter(make_config(), sweep_interval_ms=1_000)
    rl.acquire("trial", "embed", 10, T0)
    assert rl.keys == 1
    assert rl.sweep(T0 + 1_000) == 0  # the day window still holds a charge
    assert rl.keys == 1
    rl.acquire("vip-trial", "embed", 1, T0 + 86_400_000)  # triggers the periodic sweep
    assert rl.keys == 1  # trial's drained key gone; vip-trial's new one held
    assert rl.sweep(T0 + 86_400_000 + 1_000) == 1
    assert rl.keys == 0


def test_update_keeps_state_of_surviving_windows():
    """A reload keeps buckets whose (window_s, unit) still exists, under the new limit."""
    rl = RateLimiter(make_config())
    for _ in range(3):
        rl.acquire("trial", "embed", 1, T0)
    raised = registry(limits={"free": {"embed": [{"window_s": 60, "requests": 6, "tokens": 40},
                                                {"window_s": 86400, "requests": 99}]}}).config
    rl.update(raised)
    # 3 of the new 6 are used: three more fit, not six.
    for _ in range(3):
        assert rl.acquire("trial", "embed", 1, T0).allowed
    assert not rl.check("trial", "embed", 1, T0).allowed


def test_update_drops_state_of_removed_windows_and_orgs():
    """A window, an org or an endpoint that is gone takes its state with it."""
    rl = RateLimiter(make_config())
    for _ in range(3):
        rl.acquire("trial", "embed", 1, T0)
    no_minute = registry(limits={"free": {"embed": [{"window_s": 3600, "requests": 3},
                                                   {"window_s": 86400, "requests": 5}]}}).config
    rl.update(no_minute)
    assert rl.check("trial", "embed", 1, T0).allowed  # the hour window starts empty
    assert rl.keys == 1  # the day window's charges survived
    rl.update(registry(orgs={"trial": None}).config)
    assert rl.keys == 0


def test_clock_stepping_back_does_not_refill():
    """A clock that goes back gives no budget back."""
    rl = RateLimiter(make_config())
    for _ in range(3):
        rl.acquire("trial", "embed", 1, T0)
    assert not rl.check("trial", "embed", 1, T0 - 50_000).allowed


@given(
    gaps=st.lists(st.integers(min_value=0, max_value=30_000), min_size=1, max_size=60),
    costs=st.lists(st.integers(min_value=1, max_value=40), min_size=60, max_size=60),
)
def test_admitted_never_exceeds_burst_plus_rate(gaps, costs):
    """Over any run from an empty bucket, admitted tokens <= limit + elapsed x rate."""
    rl = RateLimiter(make_config())
    t, admitted = T0, 0
    for gap, cost in zip(gaps, costs, strict=False):
        t += gap
        if rl.acquire("trial", "embed", cost, t).allowed:
            admitted += cost
        assert admitted <= 40 + (t - T0) * 40 / 60_000 + 1e-6

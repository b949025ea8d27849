"""The run order of a batch: tier, then the org's count in the batch, then DRR's order."""

from hypothesis import given
from hypothesis import strategies as st

from scheduler.batch_order import run_order
from scheduler.entry import Entry
from worker.microbatch import plan_microbatches

TIERS = ["enterprise", "standard", "free"]


def _e(i: int, org: str, tier: str = "standard", tokens: int = 16) -> Entry:
    return Entry(f"r{i}", org, tier, tokens)


def test_a_quiet_orgs_request_runs_before_a_bursting_orgs():
    """Within a tier, the orgs with fewer requests in the batch run first."""
    # DRR's order: bulk's quantum first, then the quiet orgs, then bulk again.
    batch = ([_e(i, "bulk") for i in range(28)] + [_e(28, "quiet-1"), _e(29, "quiet-2")]
             + [_e(i, "bulk") for i in range(30, 57)])
    out = run_order(batch, TIERS)
    assert [e.org for e in out[:2]] == ["quiet-1", "quiet-2"]
    assert [e.id for e in out[2:]] == [f"r{i}" for i in range(57) if i not in (28, 29)]


def test_higher_tier_first_even_when_it_has_more_requests():
    """A higher tier runs first, however many requests it has in the batch."""
    batch = [_e(0, "small", "standard"), _e(1, "big", "enterprise"), _e(2, "big", "enterprise"),
             _e(3, "trial", "free")]
    assert [e.id for e in run_order(batch, TIERS)] == ["r1", "r2", "r0", "r3"]


def test_unknown_tier_runs_last():
    """A request of a tier the configuration no longer has runs last."""
    batch = [_e(0, "gone", "removed-tier"), _e(1, "x", "free")]
    assert [e.id for e in run_order(batch, TIERS)] == ["r1", "r0"]


def test_quiet_request_lands_in_the_first_microbatch():
    """A quiet org's request in a bursting org's batch is in the first micro-batch."""
    batch = [_e(i, "bulk") for i in range(40)] + [_e(40, "quiet", tokens=30)]
    out = run_order(batch, TIERS)
    plan = plan_microbatches([e.tokens for e in out], max_padded_tokens=4096, max_size=16,
                             order="given")
    assert out.index(next(e for e in out if e.org == "quiet")) in plan[0]


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]),
                          st.sampled_from([*TIERS, "old"])), max_size=60))
def test_a_permutation_that_keeps_each_orgs_order(spec):
    """The run order is a permutation that keeps each org's order within its tier."""
    # An org's requests can carry two tiers after a reload changed its tier:
    # its order is kept within each tier.
    batch = [_e(i, org, tier) for i, (org, tier) in enumerate(spec)]
    out = run_order(batch, TIERS)
    assert sorted(e.id for e in out) == sorted(e.id for e in batch)
    for org, tier in set(spec):
        def of(xs, org=org, tier=tier):
            return [e.id for e in xs if (e.org, e.tier) == (org, tier)]
        assert of(out) == of(batch)
    rank = {t: i for i, t in enumerate(TIERS)}
    keys = [(rank.get(e.tier, 3), sum(x.org == e.org for x in batch)) for e in out]
    assert keys == sorted(keys)

"""observe_all: a batch of observations lands exactly as one observe per value."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram

from plumbing.histogram import observe_all

_BUCKETS = (0.001, 0.01, 0.1, 1, 10)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in registry.collect() for s in m.samples if not s.name.endswith("_created")}


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    r1, r2 = CollectorRegistry(), CollectorRegistry()
    return (r1, Histogram("h", "h", ["tier"], buckets=_BUCKETS, registry=r1),
            r2, Histogram("h", "h", ["tier"], buckets=_BUCKETS, registry=r2))


@pytest.mark.parametrize("values", [
    [],
    [0.0],
    [0.001, 0.01, 0.1, 1, 10],  # on each bound: "v <= bound" puts it in that bucket
    [0.0010001, 0.5, 0.5, 11, 1e9, 3.25, 0.0],
    [-1.0, 0.02, 7.0],
])
def test_same_buckets_count_and_sum_as_observe(values):
    r1, one, r2, many = _pair()
    child = one.labels("a")
    for v in values:
        child.observe(v)
    observe_all(many.labels("a"), values)
    got, want = _samples(r2), _samples(r1)
    assert got == want
    assert want[("h_count", (("tier", "a"),))] == len(values)


def test_nan_counts_in_no_bucket_and_poisons_the_sum_as_observe_does():
    r1, one, r2, many = _pair()
    one.labels("a").observe(float("nan"))
    one.labels("a").observe(0.5)
    observe_all(many.labels("a"), [float("nan"), 0.5])
    got, want = _samples(r2), _samples(r1)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert (math.isnan(got[key]) and math.isnan(value)) or got[key] == value, key


def test_a_child_without_the_known_attributes_is_observed_value_by_value():
    seen: list[float] = []

    class Other:
        def observe(self, v: float) -> None:
            seen.append(v)

    observe_all(Other(), [0.5, 2.0, 0.5])
    assert seen == [0.5, 2.0, 0.5]

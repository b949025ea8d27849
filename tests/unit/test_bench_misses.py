"""The isolation and gpu_feed verdicts count a quiet request that is not ``ok`` as a miss.

Left out of the p99 (as they once were), an expired, refused or missing quiet
request would improve its org's figure, and a quiet org whose every request
was lost would have no p99 and pass.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from bench.gpu_feed import p99_ms, quiet_within
from bench.isolation import p99_by_org


def _run(statuses: list[str]) -> SimpleNamespace:
    """One org ``q``; the i-th request took i+1 ms when ``ok``."""
    return SimpleNamespace(outcomes=[
        SimpleNamespace(org="q", status=st, arrival_s=0.0,
                        completed_s=(i + 1) / 1000 if st == "ok" else None)
        for i, st in enumerate(statuses)])


def test_a_miss_is_the_slowest_request_not_a_missing_one():
    ok = ["ok"] * 10
    assert p99_by_org(_run(ok))["q"] == 10.0
    assert p99_by_org(_run(["expired", *ok[1:]]))["q"] == math.inf
    assert p99_ms(_run(ok), "q") == 10.0
    assert p99_ms(_run([*ok[:9], "missing"]), "q") == math.inf


def test_a_bound_made_of_a_miss_is_not_met():
    assert not quiet_within({"bound_ms": math.inf, "quiet_p99_ms": math.inf})
    assert not quiet_within({"bound_ms": math.nan, "quiet_p99_ms": 5.0})
    assert quiet_within({"bound_ms": 10.0, "quiet_p99_ms": 5.0})
    assert math.isnan(p99_ms(_run([]), "q"))

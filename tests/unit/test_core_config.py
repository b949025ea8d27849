"""Configuration the core relies on: one DRR turn and one batch can hold the largest request."""

from __future__ import annotations

import pytest

from schemas.config import ConfigError
from tests.core_setup import config_for


def _problems(**kwargs) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_for(**kwargs)
    return info.value.problems


def test_quantum_below_the_largest_request_is_rejected_naming_the_field():
    """quantum < max_request_tokens (tokens model) is refused; the message names endpoints.e.quantum."""
    [problem] = _problems(quantum=99, max_request_tokens=100)
    assert problem.startswith("endpoints.e.quantum (99)") and "largest request cost (100" in problem


def test_the_lightest_org_weight_counts():
    """quantum x the smallest org weight must still fit the largest request; that org is named."""
    [problem] = _problems(quantum=100, max_request_tokens=100,
                          orgs={"heavy": ("t0", 4.0), "light": ("t0", 0.5)})
    assert "endpoints.e.quantum" in problem and "'light'" in problem and "x weight 0.5" in problem
    config_for(quantum=200, max_request_tokens=100, orgs={"light": ("t0", 0.5)})


def test_adaptive_cost_needs_room_for_the_ratio_cap():
    """cost_model=adaptive: the quantum must hold max_request_tokens x 4 (the ratio's upper clamp)."""
    [problem] = _problems(cost_model="adaptive", quantum=399, max_request_tokens=100)
    assert "endpoints.e.quantum" in problem and "400" in problem
    config_for(cost_model="adaptive", quantum=400, max_request_tokens=100)


def test_requests_cost_model_needs_a_quantum_of_one():
    """cost_model=requests: a quantum of 1 fits every request; 0.5 does not."""
    config_for(cost_model="requests", quantum=1, max_request_tokens=100)
    [problem] = _problems(cost_model="requests", quantum=0.5)
    assert problem.startswith("endpoints.e.quantum (0.5)")


def test_batch_budget_below_the_largest_request_is_rejected_naming_the_field():
    """max_batch_tokens < max_request_tokens is refused; the message names the field."""
    [problem] = _problems(max_batch_tokens=99, max_request_tokens=100, quantum=100)
    assert problem.startswith("endpoints.e.max_batch_tokens (99)")
    assert "max_request_tokens = 100" in problem


def test_equal_bounds_are_accepted():
    """quantum == max cost and max_batch_tokens == max_request_tokens are enough."""
    cfg = config_for(quantum=100, max_batch_tokens=100, max_request_tokens=100)
    assert cfg.max_request_cost("e") == 100.0


def test_every_problem_is_reported_at_once():
    """Both faults of one endpoint are listed together, not one per attempt."""
    problems = _problems(quantum=10, max_batch_tokens=50, max_request_tokens=100)
    assert sorted(p.split(" ")[0] for p in problems) == [
        "endpoints.e.max_batch_tokens", "endpoints.e.quantum"]

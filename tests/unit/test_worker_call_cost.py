"""CallCost: a call's fixed cost in padded tokens, fitted from the calls' times."""

import math

import pytest

from worker.call_cost import CallCost


def feed(cost: CallCost, a: float, b: float, sizes) -> None:
    for padded in sizes:
        cost.observe(padded, a + b * padded)


def test_exact_times_give_back_the_fixed_cost_in_tokens():
    """2 ms a call + 0.01 ms a padded token (the benches' fake): a call is worth 200 tokens."""
    cost = CallCost()
    feed(cost, 0.002, 0.00001, [100, 400, 1600, 3000, 250, 4096, 800, 60])
    a, b = cost.fit()
    assert a == pytest.approx(0.002)
    assert b == pytest.approx(0.00001)
    assert cost.call_tokens() == pytest.approx(200)


def test_nothing_is_answered_before_enough_calls_or_from_calls_of_one_size():
    cost = CallCost(min_calls=8)
    feed(cost, 0.002, 0.00001, [100, 400, 1600, 3000, 250, 4096, 800])
    assert cost.fit() is None and cost.call_tokens() == 0  # 7 calls of 8
    same = CallCost()
    feed(same, 0.002, 0.00001, [1000] * 50)
    assert same.fit() is None and same.call_tokens() == 0


def test_a_fit_of_no_fixed_cost_or_no_token_cost_answers_nothing():
    """Times falling with size, or a negative fixed cost: the planner fills calls as before."""
    falling = CallCost()
    for padded in [100, 400, 1600, 3000, 250, 4096, 800, 60]:
        falling.observe(padded, 1.0 / padded)
    assert falling.fit() is None
    negative = CallCost()
    feed(negative, -0.001, 0.00001, [200, 400, 1600, 3000, 250, 4096, 800, 300])
    assert negative.fit() is None and negative.call_tokens() == 0


def test_the_answer_is_capped_at_the_limit():
    cost = CallCost(limit=4096)
    feed(cost, 1.0, 0.00001, [100, 400, 1600, 3000, 250, 4096, 800, 60])
    assert cost.call_tokens() == 4096


def test_recent_calls_weigh_more_so_a_model_that_changes_is_followed():
    cost = CallCost(decay=0.1)
    sizes = [100, 400, 1600, 3000, 250, 4096, 800, 60]
    feed(cost, 0.002, 0.00001, sizes * 5)
    feed(cost, 0.008, 0.00001, sizes * 20)
    assert cost.call_tokens() == pytest.approx(800, rel=0.02)


@pytest.mark.parametrize(("padded", "seconds"), [(0, 0.1), (-5, 0.1), (100, -1.0),
                                                 (100, math.inf), (100, math.nan)])
def test_nonsense_is_ignored(padded, seconds):
    cost = CallCost()
    feed(cost, 0.002, 0.00001, [100, 400, 1600, 3000, 250, 4096, 800, 60])
    cost.observe(padded, seconds)
    assert cost.call_tokens() == pytest.approx(200)


@pytest.mark.parametrize("kwargs", [{"decay": 0}, {"decay": 1}, {"min_calls": 1}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        CallCost(**kwargs)

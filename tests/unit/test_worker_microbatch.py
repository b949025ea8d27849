"""The micro-batch planner: a partition of the batch, within budget, with little padding."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.microbatch import (
    HEAD_MIN_REST_CALLS,
    minority_head,
    padded_tokens,
    plan_microbatches,
    plan_with_head,
)

plans = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.integers(min_value=0, max_value=600), max_size=120),
        "max_padded_tokens": st.integers(min_value=1, max_value=4096),
        "max_size": st.integers(min_value=1, max_value=64),
        "max_seq_length": st.none() | st.integers(min_value=1, max_value=512),
        "call_tokens": st.just(0.0) | st.floats(min_value=0, max_value=5000),
    }
)
orders = st.one_of(
    st.just({"order": "sorted"}),
    st.builds(
        lambda window: {"order": "given", "window": window},
        st.none() | st.integers(min_value=1, max_value=50),
    ),
)


def _cost(length: int, max_seq_length: int | None) -> int:
    return length if max_seq_length is None else min(length, max_seq_length)


@given(plan=plans, order=orders)
def test_every_index_once_and_budgets_hold(plan, order):
    """Each index is in exactly one micro-batch; size and padded cost stay within limits."""
    groups = plan_microbatches(**plan, **order)
    lengths, limit = plan["lengths"], plan["max_seq_length"]
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert 1 <= len(g) <= plan["max_size"]
        costs = [_cost(lengths[i], limit) for i in g]
        # A lone text over budget cannot be split, so it is the one exception.
        assert len(g) * max(costs) <= plan["max_padded_tokens"] or len(g) == 1
        assert costs == sorted(costs)


@given(plan=plans)
def test_sorted_runs_shortest_micro_batches_first(plan):
    """order='sorted' runs micro-batches in non-decreasing order of their longest text."""
    groups = plan_microbatches(**plan, order="sorted")
    limit = plan["max_seq_length"]
    widest = [max(_cost(plan["lengths"][i], limit) for i in g) for g in groups]
    assert widest == sorted(widest)


@given(plan=plans, window=st.integers(min_value=1, max_value=50))
def test_given_order_never_runs_a_later_window_first(plan, window):
    """order='given': a request of window k is in no later micro-batch than any of window k+1."""
    groups = plan_microbatches(**plan, order="given", window=window)
    position = {i: n for n, g in enumerate(groups) for i in g}
    n = len(plan["lengths"])
    for i in range(n):
        for j in range(i + 1, n):
            if i // window < j // window:
                assert position[i] <= position[j]


def test_window_one_without_budget_is_fixed_size_consecutive_batches():
    """order='given', window=1 and no token limit reproduce plain fixed-size batches."""
    lengths = [5, 90, 3, 40, 7, 8, 200]
    groups = plan_microbatches(
        lengths, max_padded_tokens=10**9, max_size=3, order="given", window=1
    )
    assert [sorted(g) for g in groups] == [[0, 1, 2], [3, 4, 5], [6]]


def test_sorting_pads_far_less_than_unsorted_fixed_batches():
    """On mixed lengths (8..256), sorted and windowed plans pad much less than batches of 32."""
    rng = random.Random(7)
    lengths = [rng.randint(8, 256) for _ in range(512)]
    fixed = [list(range(i, min(i + 32, len(lengths)))) for i in range(0, len(lengths), 32)]
    budget = 32 * 256
    by_length = plan_microbatches(lengths, max_padded_tokens=budget, max_size=64)
    windowed = plan_microbatches(lengths, max_padded_tokens=budget, max_size=64, order="given")
    wide = plan_microbatches(
        lengths, max_padded_tokens=budget, max_size=64, order="given", window=128
    )
    real = sum(lengths)
    assert padded_tokens(fixed, lengths) > 1.7 * real
    assert padded_tokens(by_length, lengths) < 1.15 * real
    # Windows trade padding for order: wider windows pad less, none beats a full sort.
    assert padded_tokens(windowed, lengths) < 0.85 * padded_tokens(fixed, lengths)
    assert padded_tokens(wide, lengths) < 0.7 * padded_tokens(fixed, lengths)
    assert padded_tokens(by_length, lengths) <= padded_tokens(wide, lengths)


def test_costs_are_capped_at_max_seq_length():
    """A text longer than the model reads costs max_seq_length, as the model truncates it."""
    groups = plan_microbatches([1000, 1000], max_padded_tokens=512, max_size=8, max_seq_length=256)
    assert groups == [[0, 1]]
    assert padded_tokens(groups, [1000, 1000], max_seq_length=256) == 512
    assert padded_tokens(groups, [1000, 1000]) == 2000


def test_lone_text_over_budget_gets_its_own_micro_batch():
    """A text over the whole budget is planned alone rather than dropped or merged."""
    assert plan_microbatches([10, 900, 12], max_padded_tokens=100, max_size=8) == [[0, 2], [1]]


def test_empty_batch_plans_nothing():
    """No lengths, no micro-batches."""
    assert plan_microbatches([], max_padded_tokens=1, max_size=1) == []
    assert plan_microbatches([], max_padded_tokens=1, max_size=1, order="given") == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_padded_tokens": 0, "max_size": 1},
        {"max_padded_tokens": 1, "max_size": 0},
        {"max_padded_tokens": 1, "max_size": 1, "order": "random"},
        {"max_padded_tokens": 1, "max_size": 1, "order": "given", "window": 0},
        {"max_padded_tokens": 1, "max_size": 1, "window": 4},
        {"max_padded_tokens": 1, "max_size": 1, "max_seq_length": 0},
    ],
)
def test_bad_arguments_are_refused(kwargs):
    """Limits below 1, an unknown order, or a window with order='sorted' raise ValueError."""
    with pytest.raises(ValueError):
        plan_microbatches([3, 4], **kwargs)


def test_negative_length_is_refused():
    """A negative token length is a caller bug, not a cost."""
    with pytest.raises(ValueError):
        plan_microbatches([3, -1], max_padded_tokens=10, max_size=2)


# -- the minority head -------------------------------------------------------


def test_minority_head_counts_the_texts_ahead_of_the_first_bulk_org():
    """The head ends at the first text of an org with ``bulk`` texts or more."""
    assert minority_head(["q1", "q2", "q2"] + ["bulk"] * 16, bulk=16) == 3
    assert minority_head(["bulk"] * 16 + ["q1"], bulk=16) == 0  # bulk first: no head
    assert minority_head([f"o{i}" for i in range(64)], bulk=16) == 0  # no bulk org
    assert minority_head(["q1"] + ["b"] * 15, bulk=16) == 0  # 15 is not bulk
    assert minority_head([], bulk=16) == 0


def test_a_quiet_text_ahead_of_a_burst_runs_in_a_micro_batch_of_its_own():
    """One quiet text then 63 of a bulk org, micro-batches of 16: the quiet text alone first."""
    keys = ["quiet"] + ["bulk"] * 63
    groups = plan_with_head([16] * 64, keys, max_padded_tokens=4096, max_size=16)
    assert groups[0] == [0]
    assert [len(g) for g in groups] == [1, 16, 16, 16, 15]
    # Without the head the quiet text shares its micro-batch with 15 of the burst's.
    assert [len(g) for g in plan_microbatches([16] * 64, max_padded_tokens=4096, max_size=16,
                                              order="given")] == [16, 16, 16, 16]


def test_no_head_when_the_rest_runs_as_two_calls():
    """A batch of two calls (a GPU's) is not cut: the cut adds a call to save a few ms."""
    keys = ["quiet"] + ["bulk"] * 63
    assert minority_head(keys, bulk=32) == 1
    groups = plan_with_head([60] * 64, keys, max_padded_tokens=4096, max_size=32)
    assert groups == plan_microbatches([60] * 64, max_padded_tokens=4096, max_size=32,
                                       order="given")
    assert len(groups) == 2 and groups[0] != [0]


@given(lengths=st.lists(st.integers(min_value=0, max_value=600), max_size=120),
       owners=st.lists(st.integers(min_value=0, max_value=3), max_size=120),
       max_size=st.integers(min_value=1, max_value=32),
       max_padded_tokens=st.integers(min_value=1, max_value=4096))
def test_head_plan_is_a_partition_within_budget_and_head_first(lengths, owners, max_size,
                                                             max_padded_tokens):
    """Every index once, budgets held, and no head text runs after a text behind the head."""
    n = min(len(lengths), len(owners))
    lengths, keys = lengths[:n], sorted(owners[:n], key=owners[:n].count)
    groups = plan_with_head(lengths, keys, max_padded_tokens=max_padded_tokens,
                            max_size=max_size)
    assert sorted(i for g in groups for i in g) == list(range(n))
    for g in groups:
        assert len(g) <= max_size
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= max_padded_tokens
    head = minority_head(keys, bulk=max_size)
    plain = plan_microbatches(lengths, max_padded_tokens=max_padded_tokens, max_size=max_size,
                              order="given")
    rest = plan_microbatches(lengths[head:], max_padded_tokens=max_padded_tokens,
                             max_size=max_size, order="given")
    if head and len(rest) >= HEAD_MIN_REST_CALLS:
        # The cut: the head's texts run first, in micro-batches of their own.
        cut = next(k for k, g in enumerate(groups) if g[0] >= head)
        assert sorted(i for g in groups[:cut] for i in g) == list(range(head))
        assert all(i >= head for g in groups[cut:] for i in g)
    else:
        assert groups == plain


def test_keys_and_lengths_must_match():
    """A key per length, or a clear error."""
    with pytest.raises(ValueError, match="2 keys for 3 lengths"):
        plan_with_head([1, 2, 3], ["a", "b"], max_padded_tokens=100, max_size=4)


# -- the cheapest cut (call_tokens > 0) ------------------------------------------------------


def _total(groups, lengths, call_tokens):
    return len(groups) * call_tokens + padded_tokens(groups, lengths)


def _cheapest_by_brute_force(stream, lengths, call_tokens, max_padded_tokens, max_size):
    """Every way to cut ``stream`` into consecutive groups within the limits: the least total."""
    n, best = len(stream), math.inf
    for mask in range(1 << max(n - 1, 0)):
        groups, current = [], [stream[0]]
        for k in range(1, n):
            if mask >> (k - 1) & 1:
                groups.append(current)
                current = []
            current.append(stream[k])
        groups.append(current)
        if all(len(g) <= max_size and (len(g) == 1 or len(g) * max(lengths[i] for i in g)
                                       <= max_padded_tokens) for g in groups):
            best = min(best, _total(groups, lengths, call_tokens))
    return best


@given(lengths=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=10),
       call_tokens=st.floats(min_value=0.5, max_value=2000),
       max_padded_tokens=st.integers(min_value=1, max_value=1200),
       max_size=st.integers(min_value=1, max_value=6))
def test_the_cut_costs_least_of_every_cut_of_the_ordered_texts(lengths, call_tokens,
                                                               max_padded_tokens, max_size):
    """call_tokens > 0: no other cut of the same ordered texts costs less, calls included."""
    groups = plan_microbatches(lengths, max_padded_tokens=max_padded_tokens, max_size=max_size,
                               order="sorted", call_tokens=call_tokens)
    stream = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    assert [i for g in groups for i in g] == stream  # consecutive runs of the sorted texts
    best = _cheapest_by_brute_force(stream, lengths, call_tokens, max_padded_tokens, max_size)
    assert _total(groups, lengths, call_tokens) == pytest.approx(best)


def test_the_cut_pads_less_than_filling_each_call_on_mixed_lengths():
    """Texts of 8-256 tokens (bench/sustained.py's mix), the fake's 2 ms + 0.01 ms a token:
    cut where a call more saves padding, 64 texts cost a third less than filled calls."""
    rng = random.Random(7)
    filled = cut = 0.0
    for _ in range(50):
        lengths = [max(8, min(256, int(rng.lognormvariate(3.8, 0.6)))) for _ in range(64)]
        kw = {"max_padded_tokens": 4096, "max_size": 32, "order": "given"}
        filled += _total(plan_microbatches(lengths, **kw), lengths, 200)
        cut += _total(plan_microbatches(lengths, **kw, call_tokens=200), lengths, 200)
    assert cut < 0.75 * filled


@pytest.mark.parametrize("call_tokens", [-1.0, math.nan])
def test_a_negative_or_nan_call_cost_is_refused(call_tokens):
    with pytest.raises(ValueError):
        plan_microbatches([3, 4], max_padded_tokens=8, max_size=2, call_tokens=call_tokens)


def test_plan_with_head_passes_the_call_cost_on():
    """The head and the rest are each cut at the least cost: one long text apart, not padded with."""
    lengths, keys = [10, 10, 10, 200], ["a", "a", "a", "a"]
    kw = {"max_padded_tokens": 4096, "max_size": 8}
    assert plan_with_head(lengths, keys, **kw) == [[0, 1, 2, 3]]
    assert plan_with_head(lengths, keys, **kw, call_tokens=50) == [[0, 1, 2], [3]]


def test_a_tie_goes_to_fewer_calls():
    """Texts of 10 and 30 tokens, a call worth 20: one call (20 + 2 x 30) or two (2 x 20 +
    10 + 30) cost 80 either way; the docstring's tie-break makes it one call."""
    assert plan_microbatches([10, 30], max_padded_tokens=4096, max_size=8,
                             call_tokens=20) == [[0, 1]]


# -- an express batch's head call carrying what follows ---------------------------------------


@given(lengths=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=10),
       first=st.integers(min_value=1, max_value=4),
       first_padded=st.integers(min_value=0, max_value=1500),
       call_tokens=st.floats(min_value=0.5, max_value=2000),
       max_padded_tokens=st.integers(min_value=1, max_value=1200),
       max_size=st.integers(min_value=4, max_value=6))
def test_the_cut_with_a_first_group_costs_least_of_every_such_cut(
        lengths, first, first_padded, call_tokens, max_padded_tokens, max_size):
    """``first``: the first texts stay in the first group, which holds more only within
    ``first_padded``; of every cut that keeps those rules, none costs less."""
    from worker.microbatch import _cheapest_cut

    first = min(first, len(lengths))
    stream = list(range(len(lengths)))
    groups = _cheapest_cut(stream, lengths, call_tokens, max_padded_tokens, max_size,
                           first=first, first_padded=first_padded)
    assert [i for g in groups for i in g] == stream
    assert len(groups[0]) >= first
    if len(groups[0]) > first:
        assert padded_tokens(groups[:1], lengths) <= min(first_padded, max_padded_tokens)
    for g in groups[1:]:
        assert len(g) <= max_size
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= max_padded_tokens
    best = math.inf
    for k in range(first, min(len(stream), max_size) + 1):
        opening = padded_tokens([stream[:k]], lengths)
        if k > first and opening > min(first_padded, max_padded_tokens):
            break
        rest = (_cheapest_by_brute_force(stream[k:], lengths, call_tokens, max_padded_tokens,
                                         max_size) if k < len(stream) else 0.0)
        best = min(best, call_tokens + opening + rest)
    assert _total(groups, lengths, call_tokens) == pytest.approx(best)


def test_an_express_head_call_carries_the_short_texts_after_it_within_one_call_more():
    """A fresh request of 40 tokens, then a top-up of five of 10 and four of 200: the
    head's call takes the five (6 x 40 padded, within its own 40 and one call's 200), a
    call fewer than the head alone; without a call cost the head runs alone as before."""
    lengths = [40] + [10] * 5 + [200] * 4
    keys = ["fresh"] + ["bulk"] * 9
    kw = {"max_padded_tokens": 4096, "max_size": 32, "express": True}
    alone = plan_with_head(lengths, keys, **kw)
    assert alone[0] == [0]
    cut = plan_with_head(lengths, keys, **kw, call_tokens=200)
    assert cut[0] == [1, 2, 3, 4, 5, 0]                    # sorted by length in its call
    assert padded_tokens(cut[:1], lengths) <= 40 + 200
    assert sorted(i for g in cut for i in g) == list(range(len(lengths)))
    separate = plan_microbatches([40], max_padded_tokens=4096, max_size=32, order="given",
                                 call_tokens=200) + [
        [1 + i for i in g] for g in plan_microbatches(lengths[1:], max_padded_tokens=4096,
                                                      max_size=32, order="given",
                                                      call_tokens=200)]
    assert len(cut) == len(separate) - 1
    assert _total(cut, lengths, 200) < _total(separate, lengths, 200)


@given(lengths=st.lists(st.integers(min_value=1, max_value=300), min_size=2, max_size=40),
       fresh=st.integers(min_value=1, max_value=5),
       call_tokens=st.floats(min_value=1, max_value=800))
def test_an_express_plan_runs_its_head_in_the_first_call_and_every_text_once(
        lengths, fresh, call_tokens):
    fresh = min(fresh, len(lengths) - 1)
    keys = [f"f{i}" for i in range(fresh)] + ["bulk"] * (len(lengths) - fresh)
    groups = plan_with_head(lengths, keys, max_padded_tokens=4096, max_size=32,
                            express=True, call_tokens=call_tokens)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    head = minority_head(keys, bulk=max(keys.count(k) for k in keys))
    assert set(range(head)) <= set(groups[0])
    alone = head * max(lengths[:head]) if head else 0
    if head and len(groups[0]) > head:
        assert padded_tokens(groups[:1], lengths) <= alone + call_tokens

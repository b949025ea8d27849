"""Length-sorted micro-batching under a padded-token budget, as a pure function.

A transformer encoder pads every text of a batch to the longest one, so a batch
costs ``len(batch) * max(length)`` token slots, not ``sum(length)``. On mixed
lengths (8..256 tokens) unsorted batches of 32 spend 2.6-3.4x the real tokens
on padding; sorting by length brings that to 1.07-1.3x (see the shared models
notes). ``SentenceTransformer.encode`` sorts only within one call, so a worker
that cuts a scheduler batch into several calls must sort across the batch
itself. A count limit alone is not enough either: 128 long texts use far more
memory and time than 128 short ones, hence a budget in padded tokens plus a
count cap.

This module plans the cut; it imports nothing but the standard library so the
scheduler, the simulator and the tests can use it without torch. Costs use
``min(length, max_seq_length)`` because the model truncates longer texts.

Two orders, one trade-off (padding against head-of-line wait):

``order="sorted"``
    Sort the whole batch by length, pack greedily. Least padding, so the most
    tokens per second. Micro-batches run shortest first, which is
    shortest-job-first across the batch: lowest mean completion time. But the
    request the fairness scheduler chose first (a higher tier, an earlier
    deadline) may be long and wait for every shorter micro-batch.

``order="given"``
    Keep the scheduler's order at the granularity of ``window`` requests:
    consecutive windows of the given order are each sorted by length and
    packed in turn, so every request of window k is in a micro-batch no later
    than any request of window k+1. The worker publishes each micro-batch's
    results as soon as they are ready, so the first-chosen requests come back
    first. Windows alternate ascending and descending order so that the long
    end of one window meets the long end of the next and a micro-batch
    straddling the seam pads little. A small window pads more (``window=1``
    is plain consecutive packing, no sorting at all); a window as large as the
    batch is ``"sorted"``.

Where to cut (``call_tokens``)
    Filling each call to the budget in turn lets one long text pad every
    short one before it. Given what a call's fixed cost is worth in padded
    tokens (:class:`worker.call_cost.CallCost` learns it from the worker's
    calls), the ordered texts are cut where ``calls * call_tokens + padded
    tokens`` is least instead (:func:`_cheapest_cut`, exact: 0.14 ms for 64
    texts, 12-15 ms for 4,096, against 0.03 and 2 ms filled, on this
    machine): on mixed lengths of 8-256 tokens 1.26x padded against 2.33x,
    a third less of the fake model's time (``docs/load.md``). The cut only
    chooses where consecutive texts part, so both orders keep their promise.

A single text whose capped length alone exceeds ``max_padded_tokens`` still gets
a micro-batch of its own: dropping it is not the planner's call.

The minority head (:func:`plan_with_head`)
    Under a burst most of a batch is one org's, and the scheduler hands it
    over with the orgs of fewest requests first (``scheduler.batch_order``).
    Packed as usual, a quiet org's one text shares its micro-batch with
    fifteen of the burst's and comes back after a quarter of the batch; cut
    off at the first text of a *bulk* key (one with at least ``max_size``
    texts in the batch), the texts ahead of it run in micro-batches of their
    own and come back after a call of their own size. The cut is made only
    when the rest still takes ``HEAD_MIN_REST_CALLS`` (3) micro-batches or
    more, where one small call more is a small share of the batch's time (on
    the CPU demo, 4 calls of 75-150 ms each and a head of 20-30 ms). A batch
    of one or two calls, as a GPU runs them, is left whole: there the extra
    call's fixed cost is a noticeable share of a batch of tens of ms, and it
    would save a quiet request a few ms (``bench/gpu_feed.py --quick``, two
    runs each way: 1,425 and 1,279 requests/s with the cut at two calls,
    1,462 and 1,569 without). An express batch's head always runs first; its
    call may carry the texts after it up to one call's worth more, where that
    saves a call (batches of 16 with a head, the fake at 2 ms + 0.01 ms a
    token: 47,451 tokens per model-second against 45,740 with the head alone,
    51,439 without a head).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any, Literal

__all__ = ["HEAD_MIN_REST_CALLS", "MicrobatchOrder", "express_head", "minority_head",
           "padded_tokens", "plan_microbatches", "plan_with_head"]

MicrobatchOrder = Literal["sorted", "given"]

#: The fewest micro-batches the rest of a batch must take for its minority
#: head to run on its own (:func:`plan_with_head`).
HEAD_MIN_REST_CALLS = 3


def _costs(lengths: Sequence[int], max_seq_length: int | None) -> list[int]:
    costs = []
    for length in lengths:
        if length < 0:
            raise ValueError(f"token lengths must be >= 0, got {length}")
        costs.append(length if max_seq_length is None else min(length, max_seq_length))
    return costs


def plan_microbatches(
    lengths: Sequence[int],
    *,
    max_padded_tokens: int,
    max_size: int,
    order: MicrobatchOrder = "sorted",
    max_seq_length: int | None = None,
    window: int | None = None,
    call_tokens: float = 0.0,
) -> list[list[int]]:
    """Cut a batch into micro-batches of indices into ``lengths``, in run order.

    Every index appears exactly once. Each micro-batch has at most ``max_size``
    indices, and ``len(group) * max(cost in group) <= max_padded_tokens`` unless
    the group is one text that alone exceeds the budget. Indices inside a
    micro-batch are sorted by (cost, index).

    ``order`` and ``window`` choose between least padding and keeping the
    scheduler's order; the module docstring explains the trade-off. ``window``
    (requests per window, only with ``order="given"``) defaults to ``max_size``.

    ``call_tokens``: what one call's fixed cost is worth in padded tokens
    (:class:`worker.call_cost.CallCost`). Above 0 the ordered texts are cut
    where the calls cost least in all, ``calls * call_tokens + padded tokens``
    (:func:`_cheapest_cut`); 0 fills each call to its budget in turn (greedy).
    """
    span = _span(len(lengths), max_padded_tokens=max_padded_tokens, max_size=max_size,
                 order=order, max_seq_length=max_seq_length, window=window,
                 call_tokens=call_tokens)
    costs = _costs(lengths, max_seq_length)
    n = len(costs)

    def by_cost(i: int) -> tuple[int, int]:
        return costs[i], i

    stream = _stream(costs, 0, n, span)
    if call_tokens > 0:
        return [sorted(g, key=by_cost) for g in
                _cheapest_cut(stream, costs, call_tokens, max_padded_tokens, max_size)]
    groups: list[list[int]] = []
    current: list[int] = []
    current_max = 0
    for i in stream:
        widest = max(current_max, costs[i])
        if current and (
            len(current) >= max_size or (len(current) + 1) * widest > max_padded_tokens
        ):
            groups.append(sorted(current, key=by_cost))
            current, widest = [], costs[i]
        current.append(i)
        current_max = widest
    if current:
        groups.append(sorted(current, key=by_cost))
    return groups


def _span(n: int, *, max_padded_tokens: int, max_size: int, order: MicrobatchOrder,
          max_seq_length: int | None, window: int | None, call_tokens: float) -> int:
    """The window the texts of a batch of ``n`` are sorted in (:func:`_stream`), once
    :func:`plan_microbatches`' arguments are checked (ValueError naming a bad one)."""
    if not call_tokens >= 0:  # NaN too
        raise ValueError(f"call_tokens must be >= 0, got {call_tokens}")
    if max_padded_tokens < 1:
        raise ValueError(f"max_padded_tokens must be >= 1, got {max_padded_tokens}")
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    if max_seq_length is not None and max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    if order == "sorted":
        if window is not None:
            raise ValueError("window applies only to order='given'")
        return max(n, 1)
    if order == "given":
        span = max_size if window is None else window
        if span < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        return span
    raise ValueError(f"order must be 'sorted' or 'given', got {order!r}")


def _stream(costs: Sequence[int], begin: int, end: int, span: int) -> list[int]:
    """Indices ``begin..end-1`` in windows of ``span``, each sorted by (cost, index),
    every other one reversed (the module docstring's ``"given"`` order)."""
    stream: list[int] = []
    for k, start in enumerate(range(begin, end, span)):
        chunk = sorted(range(start, min(start + span, end)), key=lambda i: (costs[i], i))
        if k % 2:
            chunk.reverse()
        stream.extend(chunk)
    return stream


def _cheapest_cut(stream: Sequence[int], costs: Sequence[int], call_tokens: float,
                  max_padded_tokens: int, max_size: int, *, first: int = 0,
                  first_padded: float = math.inf) -> list[list[int]]:
    """``stream`` cut into consecutive groups of least ``len(groups) * call_tokens +
    sum(len(g) * max cost in g)``, each within ``max_size`` and the padded budget
    (a text over the budget alone in its group).

    Dynamic programming over the cut points, O(len(stream) * max_size): the
    cheapest cut of the first ``j`` texts is the cheapest cut of the first
    ``i`` plus one group of texts ``i..j-1``, over every ``i`` a group allows.
    Ties go to the larger last group (fewer calls). ``first``: the first
    ``first`` texts of the stream are in the first group, whose padded tokens
    stay within ``first_padded`` where it holds more than them.
    """
    n = len(stream)
    c = [costs[k] for k in stream]
    best = [0.0] + [math.inf] * n
    start = [0] * (n + 1)
    # With ``first``: the first group's cost by where it ends (it starts at 0).
    opening: dict[int, float] = {}
    if first:
        widest = max(c[:first])
        for j in range(first, min(n, max_size) + 1):
            widest = max(widest, c[j - 1])
            padded = j * widest
            if j > first and (padded > first_padded or padded > max_padded_tokens):
                break
            opening[j] = call_tokens + padded
        best[first] = opening[first]
    for j in range(first + 1, n + 1):
        # The group of the last text alone always fits (one text over the budget too).
        widest = c[j - 1]
        here, at = best[j - 1] + call_tokens + widest, j - 1
        size = 1
        for i in range(j - 2, max(first - 1, j - 1 - max_size), -1):
            if c[i] > widest:  # noqa: PLR1730 - no call in the loop: it runs n x max_size times
                widest = c[i]
            size += 1
            padded = size * widest
            if padded > max_padded_tokens:
                break  # a longer group only widens: none fits
            total = best[i] + call_tokens + padded
            if total <= here:
                here, at = total, i
        if j in opening and opening[j] <= here:
            here, at = opening[j], 0
        best[j], start[j] = here, at
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(list(stream[start[j]:j]))
        j = start[j]
    groups.reverse()
    return groups


def minority_head(keys: Sequence[Hashable], *, bulk: int) -> int:
    """How many leading entries of ``keys`` come before the first entry of a bulk key.

    A bulk key has at least ``bulk`` entries in ``keys``. 0 when there is none,
    or when the first entry is one of a bulk key's (nothing to run ahead of it).
    """
    if bulk < 1:
        raise ValueError(f"bulk must be >= 1, got {bulk}")
    counts = Counter(keys)
    for i, key in enumerate(keys):
        if counts[key] >= bulk:
            return i
    return 0


def plan_with_head(
    lengths: Sequence[int],
    keys: Sequence[Hashable],
    *,
    max_padded_tokens: int,
    max_size: int,
    max_seq_length: int | None = None,
    window: int | None = None,
    express: bool = False,
    call_tokens: float = 0.0,
) -> list[list[int]]:
    """:func:`plan_microbatches` in ``"given"`` order, with the minority head run on its own.

    ``keys[i]`` is the owner of text ``i`` (its org), in the batch's run
    order. The texts ahead of the first text of a key with ``max_size`` or
    more texts are planned as micro-batches of their own, first, when the
    rest still needs ``HEAD_MIN_REST_CALLS`` micro-batches or more; otherwise this is
    :func:`plan_microbatches` of the whole. ``express`` (an express batch,
    :mod:`scheduler.dispatch`): the texts ahead of the first text of the key
    with the most texts, whatever the rest needs; with ``call_tokens`` above
    0 their call also carries the texts after them that fit within the
    head's own padded tokens plus ``call_tokens`` (one call's worth: the
    fresh requests wait about one call's fixed time more at most) where that
    costs least in all. ``call_tokens``: as for :func:`plan_microbatches`.
    Every index appears exactly once.
    """
    if len(keys) != len(lengths):
        raise ValueError(f"{len(keys)} keys for {len(lengths)} lengths")
    kw: dict[str, Any] = {"max_padded_tokens": max_padded_tokens, "max_size": max_size, "order": "given",
          "max_seq_length": max_seq_length, "window": window, "call_tokens": call_tokens}
    head = express_head(keys) if express else minority_head(keys, bulk=max_size)
    if head and express and call_tokens > 0:
        span = _span(len(lengths), **kw)
        costs = _costs(lengths, max_seq_length)
        alone = head * max(costs[:head])
        if head <= max_size and alone <= max_padded_tokens:
            # The head's call may carry what follows it while it costs one call's
            # worth more at most: a call fewer where the top-up is short texts.
            stream = _stream(costs, 0, head, span) + _stream(costs, head, len(costs), span)
            return [sorted(g, key=lambda i: (costs[i], i)) for g in _cheapest_cut(
                stream, costs, call_tokens, max_padded_tokens, max_size, first=head,
                first_padded=alone + call_tokens)]
    if head:
        rest = plan_microbatches(lengths[head:], **kw)
        if express or len(rest) >= HEAD_MIN_REST_CALLS:
            return plan_microbatches(lengths[:head], **kw) + [
                [head + i for i in group] for group in rest]
    return plan_microbatches(lengths, **kw)


def express_head(keys: Sequence[Hashable]) -> int:
    """An express batch's head: how many leading entries of ``keys`` come before the
    first entry of the key with the most entries (its fresh orgs' requests, ahead of
    its top-up); 0 where no key has more than one (one call for all of it)."""
    bulk = max(Counter(keys).values(), default=1)
    return minority_head(keys, bulk=bulk) if bulk > 1 else 0


def padded_tokens(
    groups: Sequence[Sequence[int]],
    lengths: Sequence[int],
    *,
    max_seq_length: int | None = None,
) -> int:
    """Token slots the model computes for ``groups``: sum of size * longest, capped.

    Compare with ``sum(min(length, max_seq_length))`` (the real tokens) for the
    padding overhead of a plan; the worker reports both as batch fill.
    """
    costs = _costs(lengths, max_seq_length)
    return sum(len(g) * max(costs[i] for i in g) for g in groups if g)

"""What one model call's fixed cost is worth in padded tokens, learned from the calls.

A call of ``n`` texts padded to the longest, ``padded = n * longest`` token
slots, takes about ``a + b * padded`` seconds: ``a`` the call's fixed cost
(kernel launches, tokenizer and framework overhead, the thread hand-off),
``b`` a padded token's. The micro-batch planner
(:func:`worker.microbatch.plan_microbatches`) cuts a batch where one call
more costs less than the padding it saves, so it needs ``a / b`` in tokens:
about 60 for MiniLM on two CPU cores (``../shared/MODELS.md``: 20 ms for one
text of 16 tokens, 45 ms for one of 128), 200 for the benches' fake model
(2 ms + 0.01 ms a token), hundreds to thousands on a GPU.

:class:`CallCost` fits ``a`` and ``b`` by least squares over the calls it is
told of, each weighing ``decay`` less than the next (an exponentially
weighted fit: a model that slows as it warms or as its device fills is
followed). It answers nothing until it has seen ``min_calls`` calls whose
sizes spread enough to tell ``a`` from ``b``, nor while the fit says a call
costs nothing or a token nothing: the planner then fills calls as before.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math

__all__ = ["CallCost", "worth"]


def worth(fixed: float, per_token: float, limit: float = math.inf) -> float:
    """A call's fixed cost in tokens, ``fixed / per_token`` within ``[0, limit]`` (any one
    unit of time for both); 0 where a token costs nothing (calls are then filled)."""
    if not per_token > 0:
        return 0.0
    return min(limit, max(0.0, fixed / per_token))


class CallCost:
    """An exponentially weighted least-squares fit of a call's seconds on its padded tokens."""

    __slots__ = ("_calls", "_decay", "_min_calls", "_n", "_x", "_xx", "_xy", "_y", "limit")

    def __init__(self, *, decay: float = 0.02, min_calls: int = 8, limit: float = math.inf):
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if min_calls < 2:
            raise ValueError(f"min_calls must be >= 2, got {min_calls}")
        self._decay = decay
        self._min_calls = min_calls
        #: The most :meth:`call_tokens` answers (a call's padded budget: a
        #: fixed cost above it would fill every call anyway).
        self.limit = limit
        self._calls = 0
        self._n = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, padded: int, seconds: float) -> None:
        """One call: its padded tokens and the seconds it took. Nonsense is ignored."""
        if padded <= 0 or not 0 <= seconds < math.inf:
            return
        keep = 1 - self._decay
        x = float(padded)
        self._n = self._n * keep + 1
        self._x = self._x * keep + x
        self._y = self._y * keep + seconds
        self._xx = self._xx * keep + x * x
        self._xy = self._xy * keep + x * seconds
        self._calls += 1

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)``: seconds a call, seconds a padded token; None until they can be told apart."""
        if self._calls < self._min_calls:
            return None
        mean_x, mean_y = self._x / self._n, self._y / self._n
        var = self._xx / self._n - mean_x * mean_x
        # Calls all of one size say nothing of a token's cost apart from the call's.
        if var <= (0.05 * mean_x) ** 2:
            return None
        b = (self._xy / self._n - mean_x * mean_y) / var
        a = mean_y - b * mean_x
        if not (b > 0 and a >= 0):
            return None
        return a, b

    def call_tokens(self) -> float:
        """``a / b`` within ``[0, limit]``; 0 while :meth:`fit` has no answer."""
        ab = self.fit()
        return 0.0 if ab is None else worth(*ab, self.limit)

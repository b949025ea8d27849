"""When a worker returns a batch's credit: as late as the round trip allows.

A batch's credit goes back to the scheduler during its last micro-batch, so
the next batch is on its way while that micro-batch runs and the model
never waits for it. Returned as the last micro-batch *starts*, the next
batch arrives a round trip later and then waits for the rest of that
micro-batch: on a CPU, where a micro-batch takes a quarter of a batch
(~75-150 ms on the build machine) and the round trip ~20-30 ms, a quiet
org's request chosen into that next batch found most of a micro-batch
ahead of it at the worker (the demo's "worker queue" stage, 50-125 ms p99
under a burst).

So the worker returns the credit once the last call has run for its
expected time less a *lead*: the scheduler's measured round trip to this
worker (it stamps its estimate on every batch, ``Batch.round_trip_ms``)
times ``factor``, plus ``margin_s``. The next batch then arrives about
when the call ends. When the lead covers the whole call (a GPU batch of
one call, tens of ms, against a round trip of ~10 ms), or either figure is
unknown (no round trip measured yet, a model that takes no time), the
credit goes back at the call's start, as before. A call that ends before
its timer returns the credit with its batch's end, as any batch does.

Pure: no clock, no I/O.
"""

from __future__ import annotations

__all__ = ["release_delay_s"]


def release_delay_s(expect_s: float | None, round_trip_ms: float | None, *,
                    factor: float = 1.5, margin_s: float = 0.010,
                    min_delay_s: float = 0.005) -> float:
    """Seconds after the last call's start to return the batch's credit (0: at once).

    ``expect_s``: the call's expected duration; ``round_trip_ms``: the
    scheduler's estimate of the round trip to this worker (its report out,
    the next batch back). A delay below ``min_delay_s`` is not worth a timer.
    """
    if expect_s is None or round_trip_ms is None or not (expect_s > 0) \
            or not (0 <= round_trip_ms < float("inf")):
        return 0.0
    delay = expect_s - (factor * round_trip_ms / 1000 + margin_s)
    return delay if delay >= min_delay_s else 0.0

"""When a worker returns a batch's credit: a round trip before it runs out of work.

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

Not only the last call: where a batch's last calls together take less
than the lead (a GPU batch of two 9 ms micro-batches against a lead of
~13 ms), the credit is due at the start of the first call after which
less than the lead is left (:func:`release_step`), and the timer runs
from there with the time left to the batch's end. Returned at the last
call's start there, the next batch had that one call, 9 ms, to cover a
round trip of ~8 ms: every slower round trip left the model idle
(``bench/gpu_feed.py --quick``: 386-444 ms of a 2.7-2.8 s burst in gaps
between calls, 31-118 ms after; busy 0.81-0.84 -> 0.93-0.97,
``docs/benchmarks.md``). The price is the lead's worth of work more at the
worker when the next batch arrives: a quiet request chosen into it waits
there for the rest of the running batch (the quiet org's worker-queue p99
in that bench 8-12 -> 17-31 ms) where it waited for the credit at the
scheduler before.

The lead is one round trip plus 5 ms. It is what the next batch needs to
arrive in time, and it is also work a quiet org's request can find at the
worker beyond the running batch: the next batch goes out a lead before the
running one ends, and a request that comes just after it waits for it.
The first rule was 1.5 round trips + 10 ms. Against it, five interleaved
pairs of ``python bench/isolation.py --quick`` put the quiet orgs'
worker-queue p99 under the larger burst at 9-12 ms instead of 19-42, and
7.6 of 12 orgs within their bound on average instead of 5.2; six pairs of
``bench/gpu_feed.py --quick`` kept one worker as busy (0.91-0.95 against
0.89-0.96) at the same rate (``docs/benchmarks.md``).

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["lead_s", "release_delay_s", "release_step"]

#: The lead's defaults: ``factor`` x the round trip + ``margin_s``.
FACTOR, MARGIN_S = 1.0, 0.005


def lead_s(round_trip_ms: float | None, *, factor: float = FACTOR,
           margin_s: float = MARGIN_S) -> float | None:
    """How long before the worker runs out of work its credit should be back (None: unknown)."""
    if round_trip_ms is None or not (0 <= round_trip_ms < float("inf")):
        return None
    return factor * round_trip_ms / 1000 + margin_s


def release_step(expects: Sequence[float | None], round_trip_ms: float | None, *,
                 factor: float = FACTOR, margin_s: float = MARGIN_S) -> tuple[int, float]:
    """The call at whose start a batch's credit is due, and the expected seconds after that call.

    ``expects``: each of the batch's calls' expected seconds, in run order
    (None: not known). Due at the first call after which the calls left
    are expected to take less than the lead; the last call where a figure
    is missing (as before the rule looked past it). The timer from that
    call's start is :func:`release_delay_s` of its own expected time plus
    the seconds returned.
    """
    last = len(expects) - 1
    lead = lead_s(round_trip_ms, factor=factor, margin_s=margin_s)
    if last < 0 or lead is None:
        return max(0, last), 0.0
    step, after = last, 0.0
    for n in range(last - 1, -1, -1):
        e = expects[n + 1]
        if e is None or not (e >= 0) or after + e >= lead:
            break
        step, after = n, after + e
    return step, after


def release_delay_s(expect_s: float | None, round_trip_ms: float | None, *,
                    factor: float = FACTOR, margin_s: float = MARGIN_S,
                    min_delay_s: float = 0.005) -> float:
    """Seconds after the releasing call's start to return the batch's credit (0: at once).

    ``expect_s``: the time expected from that call's start to the batch's
    end; ``round_trip_ms``: the scheduler's estimate of the round trip to
    this worker (its report out, the next batch back). A delay below
    ``min_delay_s`` is not worth a timer.
    """
    lead = lead_s(round_trip_ms, factor=factor, margin_s=margin_s)
    if expect_s is None or lead is None or not (expect_s > 0):
        return 0.0
    delay = expect_s - lead
    return delay if delay >= min_delay_s else 0.0

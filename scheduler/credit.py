"""Credit in time: how much work a worker should hold, measured, not configured.

Why. A batch the scheduler has sent is a batch every later request waits
behind, whatever its org, so the scheduler keeps as little as possible at
the workers. But a worker that finishes its batch and has nothing next sits
idle for a round trip (its report to the scheduler, the next batch back):
with a fast model that round trip is longer than a batch, and a fixed
count of slots either starved a fast worker or queued seconds of work
ahead of quiet orgs on a slow one. The right amount is a bandwidth-delay
product: enough work to cover the round trip at the worker's own speed,
plus the batch it is running, and no more.

What is measured, per worker, from its ``batch_done`` reports:

* ``ms_per_token``: the worker's service time per token of a batch (the
  time it had the model busy with it, divided by the batch's tokens), an
  exponential moving average;
* ``round_trip_ms``: the scheduler's own clock from sending a batch to
  reading its report, less the time the worker says it held the batch:
  the two hops and whatever both sides add, without the work itself;
* ``round_trip_dev_ms``: how far the round trip strays from its average
  (a moving mean deviation, as TCP's retransmission timer keeps it, RFC
  6298).

The rule (:meth:`Credit.room`), for a worker with ``n`` unreleased batches
outstanding of estimated total ``work`` ms:

* never more than ``cap`` unreleased batches (``service.worker_slots``);
* always room for one when none is outstanding (a worker with nothing to
  do gets work, whatever the estimates say);
* otherwise room while ``work < min(cover, max_outstanding_ms)`` where
  ``cover = round_trip + DEV_WEIGHT x round_trip_dev``: the batch the worker
  runs has returned its credit (see below), so what is unreleased is the
  work queued behind it, and a round trip of it is what keeps the worker
  from running dry while the next batch is on its way: the worker holds the
  batch it runs plus about a round trip of work. About: the next batch comes
  back in a round trip *this time*, not on average, and a worker covered for
  the average runs dry on every round trip longer than it. Two mean
  deviations above the average cover about 19 round trips in 20 (for a
  normal spread the mean deviation is ~0.8 sigma); the term vanishes where
  the round trip is steady. (TCP's retransmission timer takes 4 deviations,
  for a rarer event; with 4 here ``bench/gpu_feed.py --quick`` kept one
  worker busier, 0.82-0.83 against 0.76-0.78 with 2, but
  ``bench/isolation.py --quick`` found a second batch queued ahead of the
  quiet orgs: their worker-queue p99 under the larger burst 64-77 ms against
  30-37. ``docs/benchmarks.md`` has the runs.) Never beyond the configured
  ceiling, which bounds what a quiet org's request can find ahead of it.
  When the cover is shorter than a batch (a local network, a CPU batch of
  tens of ms or more) that is one batch queued behind the running one: a quiet
  request waits for at most the running batch, the queued one and its own,
  the bound ``bench/isolation.py`` checks. (The first rule counted a full
  batch on top of the round trip, which double counted the running batch:
  two batches queued, one more batch of wait, measured in
  ``docs/benchmarks.md``.)

A worker returns a batch's credit a lead before the batch's expected end
(it lists the batch as ``released``; :mod:`worker.credit_return`): as its
last micro-batch starts, or during it, or where the last micro-batches
together are shorter than the lead, as an earlier one starts; the next
batch is on its way while they run. Until a worker has reported a batch
it gets one batch at a time (nothing is known of its speed, and a slow
worker must not find ``cap`` batches queued); from its first report the
estimates decide, and an unmeasured round trip counts as zero. A worker that stops reporting loses everything with it after
``worker_timeout_ms`` (:mod:`scheduler.flow`).

Pure: no clock, no I/O; times are milliseconds passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DEV_WEIGHT", "Credit"]

#: Round-trip deviations a worker's queued work covers beyond the average.
DEV_WEIGHT = 2.0


@dataclass
class Credit:
    """One worker's measured speed and round trip, and the room they leave.

    Mutable only through :meth:`observe`; ``alpha`` is the weight of the
    newest sample in each moving average.
    """

    alpha: float = 0.2
    #: EMA of service milliseconds per token (None: not measured yet).
    ms_per_token: float | None = None
    #: EMA of the round trip without the worker's own time (None: not measured).
    round_trip_ms: float | None = None
    #: EMA of |round trip - its EMA| (0 until a second sample).
    round_trip_dev_ms: float = 0.0
    samples: int = 0

    def observe(self, *, tokens: int, service_ms: float, round_trip_ms: float | None) -> None:
        """One ``batch_done``: the batch's tokens, its service time and its measured round trip.

        Samples that cannot be right (no tokens, negative or infinite times)
        are ignored; a round trip measured below zero (clocks of one machine
        and rounding) counts as zero.
        """
        a = self.alpha
        if tokens > 0 and 0.0 <= service_ms < float("inf"):
            sample = service_ms / tokens
            self.ms_per_token = sample if self.ms_per_token is None else (
                (1 - a) * self.ms_per_token + a * sample)
            self.samples += 1
        if round_trip_ms is not None and round_trip_ms < float("inf"):
            rt = max(0.0, round_trip_ms)
            if self.round_trip_ms is not None:
                self.round_trip_dev_ms = ((1 - a) * self.round_trip_dev_ms
                                          + a * abs(rt - self.round_trip_ms))
                rt = (1 - a) * self.round_trip_ms + a * rt
            self.round_trip_ms = rt

    def cover_ms(self) -> float:
        """The round trip a worker's queued work should cover: average + deviations."""
        return (self.round_trip_ms or 0.0) + DEV_WEIGHT * self.round_trip_dev_ms

    def estimate_ms(self, tokens: int) -> float:
        """Estimated service time of a batch of ``tokens`` (0 until measured)."""
        return (self.ms_per_token or 0.0) * max(0, tokens)

    def room(self, unreleased_tokens: Iterable[int], *, cap: int,
             max_outstanding_ms: float) -> bool:
        """May one more batch go to this worker, holding ``unreleased_tokens`` batches now?"""
        held = list(unreleased_tokens)
        if len(held) >= cap:
            return False
        if not held:
            return True
        if self.ms_per_token is None:
            return False  # not measured yet: one batch at a time until its report
        work = sum(self.estimate_ms(t) for t in held)
        return work < min(self.cover_ms(), max_outstanding_ms)

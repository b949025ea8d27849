"""What a new leader needs to charge the same costs as the one it replaces.

A scheduler that takes over (see :mod:`scheduler.leader`) rebuilds its
queues from the tier topics' committed offsets, but the ``adaptive`` cost
model lives only in memory: the moving averages of seconds per token, the
endpoint's and each org's, fed by the workers' ``batch_done`` reports. A
standby reads those reports too, but only since it started (it seeks to
recent events), so without help it would charge an org that pads heavily
like any other until it has measured it again.

So the leader puts its measurements in every state snapshot
(:class:`~schemas.messages.SchedulerState` ``costs``), each lane's with a
*mark* per worker: the last report folded in. Every instance keeps the
recent reports it read (:meth:`CostHandover.seen`) and the newest snapshot
of another leader (:meth:`CostHandover.offer`, fed by
:mod:`plumbing.state_follower`). On election, :meth:`CostHandover.take_over`
restores the snapshot's averages and folds in, in the order the topic gave
them, the reports that came after the marks. The worker-events topic has one
partition, so every instance reads the reports in the same order, and the
result is what the old leader would have computed from the same reports:
the same costs.

What is deliberately not carried: DRR deficits and min_share credits. A new
leader replays every held request, so each org rejoins its ring afresh, with
no deficit, exactly the state the fairness bound is stated from; carrying a
deficit would let an org whose requests were served between the snapshot
and the takeover bank credit while idle, which DRR forbids. What an org
loses is at most what is left of one turn.

Pure: no I/O, no clock (times come from the messages).
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass

from scheduler.core import Scheduler
from schemas.messages import CostState, FeedbackMark, SchedulerState, WorkerEvent

__all__ = ["CostHandover", "TakeOver"]

#: batch_done reports kept for a takeover: snapshots come every few hundred
#: milliseconds, so only the last few reports are ever replayed.
RECENT_REPORTS = 4096
#: ... and at most this many per-request timings in them all: a report has one
#: per request of its batch, so a count of reports alone let 4,096 batches of
#: 256 keep a million (~200 MB). 32,768 is about a second of requests at the
#: most one scheduler moves (docs/benchmarks.md "Scale"), four snapshots'
#: worth; each costs ~100 bytes (a tuple, a float, an int; the org interned).
RECENT_SAMPLES = 32_768


@dataclass(frozen=True)
class TakeOver:
    """What :meth:`CostHandover.take_over` did, for the log."""

    from_epoch: int
    snapshot_ms: int
    lanes: tuple[str, ...]
    replayed: int


class CostHandover:
    """Marks and recent reports of this instance, and the newest snapshot of another leader."""

    def __init__(self, keep: int = RECENT_REPORTS, keep_samples: int = RECENT_SAMPLES):
        #: endpoint -> worker -> the last report folded into this instance's core
        self.marks: dict[str, dict[str, FeedbackMark]] = {}
        #: (endpoint, worker, mark, samples) in the order read: the newest
        #: ``keep`` reports, fewer where they hold more than ``keep_samples``
        #: timings (the newest report is kept whatever its size).
        self.recent: deque[tuple[str, str, FeedbackMark, list[tuple[str, int, float]]]] = deque()
        self.keep = keep
        self.keep_samples = keep_samples
        #: Timings in ``recent``.
        self.samples = 0
        self.latest: SchedulerState | None = None

    def seen(self, ev: WorkerEvent) -> None:
        """A ``batch_done`` whose timings were just fed to the core (``Scheduler.feedback``)."""
        mark = FeedbackMark(sent_ms=ev.sent_ms, batch_id=ev.batch_id)
        self.marks.setdefault(ev.endpoint, {})[ev.worker] = mark
        # Interned: a decoded report's org names are fresh strings, one per
        # request; kept as they are they were most of what a report held.
        samples = [(sys.intern(t.org), t.tokens, t.seconds) for t in ev.timings]
        self.recent.append((ev.endpoint, ev.worker, mark, samples))
        self.samples += len(samples)
        while len(self.recent) > 1 and (len(self.recent) > self.keep
                                        or self.samples > self.keep_samples):
            self.samples -= len(self.recent.popleft()[3])

    def export(self, core: Scheduler) -> dict[str, CostState]:
        """Every adaptive lane's measurements, with the marks, for the next snapshot."""
        out = {}
        for endpoint, lane in core.lanes.items():
            st = lane.cost_state()
            if st is None:
                continue
            lane_spt, org_spt = st
            out[endpoint] = CostState(lane_spt=lane_spt, org_spt=org_spt,
                                      marks=dict(self.marks.get(endpoint, {})))
        return out

    def offer(self, state: SchedulerState) -> None:
        """A snapshot read from the state topic: kept if it is the newest with costs."""
        if not state.costs:
            return
        best = self.latest
        if best is None or (state.epoch, state.sent_ms) >= (best.epoch, best.sent_ms):
            self.latest = state

    def take_over(self, core: Scheduler, epoch: int) -> TakeOver | None:
        """Newly leader with ``epoch``: continue the previous leader's costs (None: none known).

        Only a snapshot of an earlier epoch counts (an older leader's); each
        lane that is adaptive here too gets its averages, then the reports
        read after its marks, in order.
        """
        snap = self.latest
        if snap is None or snap.epoch >= epoch:
            return None
        restored = []
        replayed = 0
        for endpoint, cs in snap.costs.items():
            lane = core.lanes.get(endpoint)
            if lane is None or not lane.restore_cost(cs.lane_spt, dict(cs.org_spt)):
                continue
            restored.append(endpoint)
            for samples in self._after(endpoint, cs.marks):
                core.feedback(endpoint, samples)
                replayed += 1
        return TakeOver(from_epoch=snap.epoch, snapshot_ms=snap.sent_ms,
                        lanes=tuple(restored), replayed=replayed)

    def _after(self, endpoint: str,
               marks: dict[str, FeedbackMark]) -> list[list[tuple[str, int, float]]]:
        """The reports of ``endpoint`` read after the snapshot's marks.

        The snapshot folded in a prefix of the topic: up to the latest of its
        marked reports that this instance also read. Marked reports older
        than what is kept fall back to their time: a worker's later reports
        have later ``sent_ms``.
        """
        reports = [r for r in self.recent if r[0] == endpoint]
        end = -1
        for i, (_, worker, mark, _) in enumerate(reports):
            if marks.get(worker) == mark:
                end = i
        if end >= 0:
            return [samples for _, _, _, samples in reports[end + 1:]]
        newest = max((m.sent_ms for m in marks.values()), default=None)
        if newest is None:
            return [samples for _, _, _, samples in reports]
        return [samples for _, _, mark, samples in reports if mark.sent_ms > newest]

"""Request ids this worker has answered recently, so that it does not run one twice.

A batch can reach a worker again after its results were written: a
rebalance hands its partition over before its offset was committed, or a
scheduler that lost leadership while paused sends one its successor
replayed. Within ``window_s`` of writing a request's result, and among the
last ``max_ids`` answered, a worker knows the id and skips it
(:meth:`worker.service.WorkerService._take`); the client already has the
result. Pure: time is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["AnsweredIds"]


class AnsweredIds:
    """Ids answered within ``window_s`` (at most ``max_ids`` of them, oldest dropped first)."""

    def __init__(self, window_s: float, max_ids: int):
        if window_s < 0 or max_ids < 0:
            raise ValueError(f"window_s and max_ids must be >= 0, got {window_s}, {max_ids}")
        self.window_s = window_s
        self.max_ids = max_ids
        self._at: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._at)

    def add(self, ids: Iterable[str], now_s: float) -> None:
        """``ids`` were answered at ``now_s`` (a monotonic clock)."""
        if not self.window_s or not self.max_ids:
            return
        at = self._at
        for rid in ids:
            at[rid] = now_s
            at.move_to_end(rid)
        self._trim(now_s)

    def seen(self, rid: str, now_s: float) -> bool:
        """True when ``rid`` was answered within the window."""
        t = self._at.get(rid)
        return t is not None and now_s - t <= self.window_s

    def _trim(self, now_s: float) -> None:
        at = self._at
        while at and (len(at) > self.max_ids or now_s - next(iter(at.values())) > self.window_s):
            at.popitem(last=False)

"""Name a reader that is behind and gets nothing: a fetch that has stopped answering.

A consumer whose position is below the partition's high watermark should
get records on its next fetch. When fetch after fetch comes back empty
instead, the consumer waits for ever and says nothing: the embedded
broker does exactly that once a partition holds more batches than it can
list within the fetch's wait (docs/reliability.md, "A partition too long
to fetch from"), and a broker that keeps answering but serves no data
looks the same from here.

:class:`FetchWatch` is told, after each fetch, which partitions were
behind and got nothing; it answers which have been so for longer than
``after_s`` (once per episode) and which got going again. Pure: no Kafka,
no clock of its own.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

__all__ = ["FetchWatch", "Stall"]


@dataclass(frozen=True, slots=True)
class Stall:
    """A partition behind its high watermark with nothing fetched for ``seconds``."""

    tp: Hashable
    seconds: float


class FetchWatch:
    """Per partition, since when it has been behind with nothing fetched."""

    def __init__(self, after_s: float = 10.0) -> None:
        if after_s <= 0:
            raise ValueError(f"after_s must be > 0, got {after_s}")
        self.after_s = after_s
        self._since: dict[Hashable, float] = {}
        self._reported: set[Hashable] = set()

    def observe(self, starved: Iterable[Hashable], fed: Iterable[Hashable],
                now: float) -> tuple[list[Stall], list[Stall]]:
        """One fetch: ``starved`` were behind and got nothing, ``fed`` got records or caught up.

        Returns the stalls newly past ``after_s`` and the reported stalls
        that ended (with how long each lasted).
        """
        ended = []
        for tp in fed:
            since = self._since.pop(tp, None)
            if tp in self._reported:
                self._reported.discard(tp)
                ended.append(Stall(tp, now - since if since is not None else 0.0))
        began = []
        for tp in starved:
            since = self._since.setdefault(tp, now)
            if tp not in self._reported and now - since >= self.after_s:
                self._reported.add(tp)
                began.append(Stall(tp, now - since))
        return began, ended

    def forget(self, tp: Hashable) -> None:
        """Drop ``tp`` (no longer fetched: unassigned or paused)."""
        self._since.pop(tp, None)
        self._reported.discard(tp)

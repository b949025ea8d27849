"""Admission's pacing: an org whose backlog at the scheduler covers a while waits in the read-ahead.

Why. Admission decides a burst as fast as the broker hands it over, and
the scheduler takes it in as fast as admission writes it: thousands of
records relayed in the burst's first second, long before a worker can
serve them. Where the broker and the services share a few cores, that
second of full CPU is where every other org's records wait in the Kafka
hops: ``bench/isolation.py`` found most quiet requests over their bound
sent in a 20,000-request burst's first second, each losing 100-200 ms in
the hops (``docs/benchmarks.md``). A fixed rate per org
(:mod:`producer.shaping`) spreads that work, but caps what one org gets.

Pacing needs no rate: while the scheduler already holds ``limit_s``
seconds of service for an org (its measured rate, the scheduler's own
snapshot, plus what this instance admitted since:
:meth:`producer.throttle.ThrottleState.org_backlog_s`), the org's records
wait in the read-ahead, and are decided as that backlog drains. More of
them at the scheduler would not be served sooner: the lane serves its
orgs in turns, and one second of an org's work is several of its batches.
Only lanes that serve orgs in turns count (``LaneState.turns``); a FIFO
lane serves in arrival order, where holding an org back would reorder it.

What it costs, as shaping does (``AdmissionSettings.pace_backlog_s``, 0
turns it off):

* an org's records keep their order, so its request to another endpoint
  waits behind its own paced backlog;
* records waiting here are not committed, so an admission crash replays
  more of the partition;
* a paced request's refusal (the throttle's, from the time it waited) comes
  when it is decided, not when it was fetched.

Before a lane's rate is measured (its first batches are still running, or
its batches so far were too small to measure), the lane is taken to serve
``cold_batches`` full batches (``max_batch_tokens`` each) per ``limit_s``
(:func:`cold_rates`, ``AdmissionSettings.pace_cold_batches``): an org with
that much held waits, rather than a burst's whole first second being relayed
in the window before the first rate. That window is where
``bench/isolation.py`` found the quiet requests over their bound. Held
tokens only count: a lane whose batches are full by count holds fewer
requests than the assumed rate serves, so the guess errs on relaying more.
Without a fresh snapshot nothing is paced (a fresh pipeline, a failover): the
records are decided at once, as before.

Pure: no clock (the backlog is a function of the key), no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from schemas.config import Config

__all__ = ["RECHECK_S", "Pacer", "cold_rates"]

#: How long a paced org waits before its backlog is looked at again: a
#: fraction of the scheduler's snapshot interval (250 ms by default).
RECHECK_S = 0.05


def cold_rates(config: Config, limit_s: float, cold_batches: float) -> dict[str, float]:
    """Each endpoint's assumed rate (tokens per second) before one is measured: ``cold_batches``
    full batches per ``limit_s``, so an org is paced at ``cold_batches`` full batches held.
    Empty when ``cold_batches`` is 0 (nothing paced before a measured rate)."""
    if not cold_batches > 0 or not limit_s > 0:
        return {}
    return {name: cold_batches * ep.max_batch_tokens / limit_s
            for name, ep in config.endpoints.items()}


class Pacer:
    """Holds back the keys whose backlog is ``limit_s`` or more; :meth:`take` and
    :meth:`due_in` as :class:`producer.shaping.Shaper`'s, which it can wrap.
    One per choice of a step: each key's backlog is asked once and kept.

    ``backlog_s(org)``: seconds of service held for ``org`` (None: not
    known, never paced). Keys are the records' (bytes, the org's name);
    a key that is not UTF-8 is not paced. ``shaper``: also applied to
    the keys let through.
    """

    def __init__(self, backlog_s: Callable[[str], float | None], limit_s: float,
                 shaper=None) -> None:
        if not limit_s > 0:
            raise ValueError(f"pacing limit must be > 0 s, not {limit_s!r}")
        self._backlog_s = backlog_s
        self.limit_s = float(limit_s)
        self._shaper = shaper
        #: Each key's answer, asked once: a pacer lives for one step's choice.
        self._paced: dict[Hashable, bool] = {}

    def paced(self, key: Hashable) -> bool:
        """Whether ``key``'s org has ``limit_s`` of service held at the scheduler."""
        got = self._paced.get(key)
        if got is None:
            got = self._paced[key] = self._ask(key)
        return got

    def _ask(self, key: Hashable) -> bool:
        if isinstance(key, bytes):
            try:
                key = key.decode()
            except UnicodeDecodeError:
                return False
        if not isinstance(key, str):
            return False
        held = self._backlog_s(key)
        return held is not None and held >= self.limit_s

    def take(self, key: Hashable, now: float) -> bool:
        """False while ``key`` is paced; else the shaper's take, if any (which spends)."""
        if self.paced(key):
            return False
        return self._shaper is None or self._shaper.take(key, now)

    def due_in(self, key: Hashable, now: float) -> float:
        """Seconds until ``key`` is worth another look (0: now)."""
        if self.paced(key):
            return RECHECK_S
        return 0.0 if self._shaper is None else self._shaper.due_in(key, now)

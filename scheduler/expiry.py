"""Expiry: a held request whose deadline passed gets an ``expired`` result, not a batch.

The core returns expired entries from ``expire`` and ``next_batch``; this
turns each into the result its sender gets and takes it out of the backlog
counters. Pure: the clock is an argument; the service writes, logs and counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from scheduler.entry import Entry
from scheduler.snapshot import Backlog
from schemas.messages import AdmittedRequest, Result

__all__ = ["Expired", "expire"]


class Expired(NamedTuple):
    """One expired request: the request, its result, and how late it was (ms)."""

    request: AdmittedRequest
    result: Result
    tier: str
    late_ms: int


def expire(entries: Iterable[Entry], backlog: Backlog, now_ms: int) -> list[Expired]:
    """The ``expired`` result of each entry (each leaves the backlog counters)."""
    out = []
    for e in entries:
        req: AdmittedRequest = e.payload
        backlog.remove(req.endpoint, e.tier, e.org, e.tokens)
        late_ms = now_ms - (req.deadline_at_ms or now_ms)
        result = Result(id=req.id, status="expired", org=req.org, endpoint=req.endpoint,
                        reason="deadline_passed",
                        message=f"the deadline passed while the request waited "
                                f"({late_ms} ms ago)",
                        created_ms=req.created_ms, admitted_ms=req.admitted_ms,
                        fetched_ms=req.fetched_ms, received_ms=req.received_ms,
                        completed_ms=now_ms)
        out.append(Expired(req, result, e.tier, late_ms))
    return out

"""The scheduler's own fairness figures, sampled while a replay runs.

The scheduler exports its live fairness (``sf_scheduler_fairness_*``,
:mod:`scheduler.fairness_metrics`) as gauges over a sliding window. A
replay that started the pipeline itself can read them while it runs:
:class:`FairnessSampler` fetches the scheduler's ``/metrics`` every
``every_s`` and keeps, per endpoint and tier, the extremes (the largest gap
and its ratio to the bound, the longest wait, the lowest Jain's index over
two or more orgs), so the report says what the scheduler saw, next to what
the replay measured from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from plumbing.bounded import cancel_within, within

__all__ = ["FairnessSampler", "http_metrics"]

_P = "sf_scheduler_fairness_"


def http_metrics(port: int, host: str = "127.0.0.1") -> Callable[[], Awaitable[str]]:
    """A fetch of ``http://host:port/metrics`` (the services' one-request-per-connection server)."""

    async def fetch() -> str:
        reader, writer = await within(asyncio.open_connection(host, port), 2)
        try:
            writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            await writer.drain()
            reply = await within(reader.read(), 5)
        finally:
            writer.close()
        return reply.partition(b"\r\n\r\n")[2].decode(errors="replace")

    return fetch


class FairnessSampler:
    """Samples the fairness gauges of one scheduler; :meth:`summary` gives the extremes."""

    def __init__(self, fetch: Callable[[], Awaitable[str]], every_s: float = 0.5):
        self.fetch = fetch
        self.every_s = every_s
        self.samples = 0
        self.failed = 0
        #: (endpoint, tier) -> figure -> extreme so far
        self.worst: dict[tuple[str, str], dict[str, float]] = {}

    def observe(self, text: str) -> None:
        """One /metrics page."""
        got: dict[tuple[str, str], dict[str, float]] = {}
        for fam in text_string_to_metric_families(text):
            if not fam.name.startswith(_P):
                continue
            for s in fam.samples:
                key = (s.labels.get("endpoint", ""), s.labels.get("tier", ""))
                if key[1] and "org" not in s.labels:
                    got.setdefault(key, {})[s.name.removeprefix(_P)] = s.value
        self.samples += 1
        for key, v in got.items():
            w = self.worst.setdefault(key, {})
            gap, bound = v.get("gap_cost"), v.get("bound_cost")
            if gap is not None and bound:
                w["gap_cost"] = max(w.get("gap_cost", 0.0), gap)
                w["bound_cost"] = bound
                w["gap_over_bound"] = max(w.get("gap_over_bound", 0.0), gap / bound)
            if (x := v.get("longest_wait_seconds")) is not None:
                w["longest_wait_seconds"] = max(w.get("longest_wait_seconds", 0.0), x)
            if (j := v.get("jain_ratio")) is not None and v.get("jain_orgs", 0) >= 2:
                w["jain_min"] = min(w.get("jain_min", 1.0), j)

    async def run(self) -> None:
        """Sample until cancelled; a failed fetch is counted and retried."""
        while True:
            try:
                self.observe(await self.fetch())
            except (OSError, TimeoutError, ValueError):
                self.failed += 1
            await asyncio.sleep(self.every_s)

    async def around(self, work: Awaitable[Any]) -> Any:
        """Run ``work`` while sampling; one last sample once it is done."""
        task = asyncio.create_task(self.run())
        try:
            return await work
        finally:
            await cancel_within([task], 5.0, "the fairness sampler to end")
            with contextlib.suppress(OSError, TimeoutError, ValueError):
                self.observe(await self.fetch())

    def summary(self) -> dict[str, Any]:
        return {"samples": self.samples, "failed_fetches": self.failed, "every_s": self.every_s,
                "lanes": {f"{ep}/{tier}": {k: round(v, 6) for k, v in w.items()}
                          for (ep, tier), w in sorted(self.worst.items())}}

    def lines(self) -> str:
        """One line per endpoint/tier that had any figure, for the terminal."""
        out = []
        for (ep, tier), w in sorted(self.worst.items()):
            if "gap_cost" not in w:
                continue
            jain = w.get("jain_min")
            out.append(
                f"  {ep}/{tier}: largest gap {w['gap_cost']:,.0f} of bound "
                f"{w['bound_cost']:,.0f} ({w['gap_over_bound']:.2f}x); longest wait "
                f"{w.get('longest_wait_seconds', math.nan):,.2f} s; lowest Jain's index "
                + ("n/a (no two orgs waited together)" if jain is None else f"{jain:.4f}"))
        return "\n".join(out)

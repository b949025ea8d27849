"""A bursting org in a process of its own, as another team's service would be.

Why a process: a burst sent by the same client as the quiet orgs' requests
queues the quiet ones behind it in that client's own producer, before any
part of the pipeline sees them; a quiet org's latency would then measure the
benchmark's client. The benches that put a burst beside quiet orgs
(``bench/isolation.py``, ``bench/gpu_feed.py``) start it with
:func:`start_burst`: the child waits until ``start_at`` (epoch seconds),
replays ``burst`` requests of ``tokens`` tokens at once through the live
pipeline, and reports what it got back (:class:`BurstOutcome`).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from typing import NamedTuple

from plumbing.kafka import KafkaSettings
from plumbing.logs import configure_logging
from schemas.config import parse_config
from schemas.messages import Request
from tokens.counting import WhitespaceTokenCounter
from traffic.replay import ReplaySettings, replay
from traffic.replay_sources import ReplayItem
from traffic.textsynth import TextSynth

__all__ = ["BurstOutcome", "BurstProcess", "burst_items", "start_burst"]


def burst_items(org: str, burst: int, tokens: int) -> list[ReplayItem]:
    """``burst`` requests of ``tokens`` tokens from ``org``, all at time 0."""
    synth = TextSynth(WhitespaceTokenCounter())
    return [ReplayItem(ts=0.0, tokens=tokens, request=Request(
        id=f"b{i}", org=org, endpoint="embed",
        input=synth.make_input("embed", tokens, f"b{i}"))) for i in range(burst)]


class BurstOutcome(NamedTuple):
    """What the bursting org got: statuses, and when its burst was sent and last served."""

    statuses: dict[str, int]
    #: Epoch seconds: the first request created, the last ``ok`` result completed.
    first_created_s: float | None
    last_completed_s: float | None

    @property
    def ok(self) -> int:
        return self.statuses.get("ok", 0)


def _child(bootstrap: str, config_text: str, org: str, burst: int, tokens: int,
           start_at: float, timeout_s: float, nice: int, out) -> None:
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)

    async def go() -> BurstOutcome:
        config = parse_config(config_text)
        items = burst_items(org, burst, tokens)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        run = await replay(KafkaSettings(bootstrap=bootstrap), config, items, ReplaySettings(
            timeout_s=timeout_s, progress=False, samples=False, lead_s=0.0))
        statuses: dict[str, int] = {}
        for o in run.outcomes:
            statuses[o.status] = statuses.get(o.status, 0) + 1
        got = [g[0] for g in run.results if g is not None]
        created = [r.created_ms for r in got if r.created_ms is not None]
        completed = [r.completed_ms for r in got if r.status == "ok" and r.completed_ms]
        return BurstOutcome(statuses, min(created) / 1000 if created else None,
                            max(completed) / 1000 if completed else None)

    configure_logging("WARNING")
    out.put(tuple(asyncio.run(go())))


class BurstProcess:
    """The running child; :meth:`outcome` waits (bounded) for its report."""

    def __init__(self, process, queue, timeout_s: float):
        self._process, self._queue, self._timeout_s = process, queue, timeout_s

    async def outcome(self) -> BurstOutcome:
        """Its report; ``TimeoutError`` naming the burst if none came in time."""
        try:
            got = await asyncio.to_thread(self._queue.get, True, self._timeout_s + 30)
        except Exception as e:  # queue.Empty
            self._process.kill()
            raise TimeoutError(f"the bursting process sent no outcome within "
                               f"{self._timeout_s + 30:.0f} s") from e
        finally:
            self._process.join(10)
        return BurstOutcome(*got)


def start_burst(bootstrap: str, config_text: str, *, org: str, burst: int, tokens: int,
                start_at: float, timeout_s: float = 300.0, nice: int = 10) -> BurstProcess:
    """Start the bursting org's process; it sends at ``start_at`` (epoch seconds).

    At a lower CPU priority (``nice``, as the demo's bursting org,
    ``app/demo_burst.py``): it stands for another team's service on other
    machines, and here it shares two cores with the broker and the services
    being measured. It still sends as fast as the pipeline leaves it CPU for.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, daemon=True, args=(
        bootstrap, config_text, org, burst, tokens, start_at, timeout_s, nice, queue))
    process.start()
    return BurstProcess(process, queue, timeout_s)

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
import itertools
import multiprocessing
import os
import time
import uuid
from typing import NamedTuple

import msgspec

from plumbing.kafka import KafkaSettings
from plumbing.logs import configure_logging
from plumbing.topics import ensure_topics
from schemas.config import parse_config
from schemas.messages import Request
from schemas.topics import Topics
from tokens.counting import WhitespaceTokenCounter
from traffic.replay import ReplaySettings, replay
from traffic.replay_sources import ReplayItem
from traffic.textsynth import TextSynth

__all__ = ["BurstOutcome", "BurstProcess", "burst_items", "model_idle_ms", "start_burst"]


def burst_items(org: str, burst: int, tokens: int) -> list[ReplayItem]:
    """``burst`` requests of ``tokens`` tokens from ``org``, all at time 0."""
    synth = TextSynth(WhitespaceTokenCounter())
    return [ReplayItem(ts=0.0, tokens=tokens, request=Request(
        id=f"b{i}", org=org, endpoint="embed",
        input=synth.make_input("embed", tokens, f"b{i}"))) for i in range(burst)]


def model_idle_ms(stamps: list[tuple[int, int, int]]) -> tuple[float, float] | None:
    """(ramp, gaps) in ms from ``(created_ms, started_ms, completed_ms)`` of a burst's results.

    Its requests' ``started_ms`` group them by the model call that started
    them (one worker); a call ends about when its first result is completed
    (stamped on the worker's loop just after). ``ramp``: the first request
    created to the first call's start; ``gaps``: the sum of each call's start
    after the one before it ended, where it started later. With other orgs'
    calls beside the burst's (a quiet org at a light rate) some of a gap
    may be theirs; with several workers the calls interleave and the figure
    means little: 1 worker only.
    """
    if not stamps:
        return None
    ends: dict[int, int] = {}
    for _, started, completed in stamps:
        ends[started] = min(completed, ends.get(started, completed))
    starts = sorted(ends)
    gaps = sum(max(0, b - ends[a]) for a, b in itertools.pairwise(starts))
    return float(starts[0] - min(c for c, _, _ in stamps)), float(gaps)


class BurstOutcome(NamedTuple):
    """What the bursting org got: statuses, and when its burst was sent and last served."""

    statuses: dict[str, int]
    #: Epoch seconds: the first request created, the last ``ok`` result completed.
    first_created_s: float | None
    last_completed_s: float | None
    #: Where the model's time in the burst's span was not the burst's
    #: calls (:func:`model_idle_ms`): (before its first call, between its calls).
    idle_ms: tuple[float, float] | None = None
    #: Results that came twice (dropped by the client, or delivered twice).
    twice: int = 0

    @property
    def ok(self) -> int:
        return self.statuses.get("ok", 0)


def _child(bootstrap: str, config_text: str, org: str, burst: int, tokens: int,
           start_at: float | None, delay_s: float, timeout_s: float, nice: int,
           fetch_max_wait_ms: int | None, reply_partitions: int, max_in_flight: int | None,
           out) -> None:
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)

    async def go() -> BurstOutcome:
        config = parse_config(config_text)
        items = burst_items(org, burst, tokens)
        at = time.time() + delay_s if start_at is None else start_at
        out.put(("ready", at))
        await asyncio.sleep(max(0.0, at - time.time()))
        kafka = KafkaSettings(bootstrap=bootstrap)
        if fetch_max_wait_ms is not None:
            kafka = msgspec.structs.replace(kafka, fetch_max_wait_ms=fetch_max_wait_ms)
        run_id = f"burst{uuid.uuid4().hex[:8]}"
        if reply_partitions > 1:
            # The client follows every partition its reply topic has.
            topic = f"{Topics.of(config).reply_prefix(config)}replay-{run_id}"
            await ensure_topics(kafka, {topic: reply_partitions})
        run = await replay(kafka, config, items, ReplaySettings(
            timeout_s=timeout_s, progress=False, samples=False, lead_s=0.0, run_id=run_id,
            max_in_flight=max_in_flight))
        statuses: dict[str, int] = {}
        for o in run.outcomes:
            statuses[o.status] = statuses.get(o.status, 0) + 1
        got = [g[0] for g in run.results if g is not None]
        created = [r.created_ms for r in got if r.created_ms is not None]
        completed = [r.completed_ms for r in got if r.status == "ok" and r.completed_ms]
        stamps = [(r.created_ms, r.started_ms, r.completed_ms) for r in got
                  if r.status == "ok" and None not in (r.created_ms, r.started_ms,
                                                       r.completed_ms)]
        return BurstOutcome(statuses, min(created) / 1000 if created else None,
                            max(completed) / 1000 if completed else None,
                            model_idle_ms(stamps),
                            run.stats["duplicate_results"] + run.stats["delivered_twice"])

    configure_logging("WARNING")
    out.put(tuple(asyncio.run(go())))


class BurstProcess:
    """The running child; :meth:`outcome` waits (bounded) for its report."""

    def __init__(self, process, queue, timeout_s: float):
        self._process, self._queue, self._timeout_s = process, queue, timeout_s
        self._start_at: float | None = None

    async def ready(self, timeout_s: float = 600.0) -> float:
        """When it sends (epoch seconds), once its requests are built (a million take a
        while); ``TimeoutError`` naming the burst if it did not say so in time."""
        if self._start_at is None:
            try:
                got = await asyncio.to_thread(self._queue.get, True, timeout_s)
            except Exception as e:  # queue.Empty
                self._process.kill()
                raise TimeoutError(f"the bursting process did not build its requests within "
                                   f"{timeout_s:.0f} s") from e
            self._start_at = got[1]
        return self._start_at

    async def outcome(self) -> BurstOutcome:
        """Its report; ``TimeoutError`` naming the burst if none came in time."""
        await self.ready()
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
                start_at: float | None = None, delay_s: float = 0.0, timeout_s: float = 300.0,
                nice: int = 10, fetch_max_wait_ms: int | None = None,
                reply_partitions: int = 1, max_in_flight: int | None = None) -> BurstProcess:
    """Start the bursting org's process; it sends at ``start_at`` (epoch seconds), or
    when None ``delay_s`` after its requests are built (:meth:`BurstProcess.ready` says
    when). ``fetch_max_wait_ms``: its client's, where not the default (a long run on the
    embedded broker, docs/reliability.md). ``reply_partitions``: its reply topic's (a
    million results in one partition are more batches than the embedded broker lists).

    At a lower CPU priority (``nice``, as the demo's bursting org,
    ``app/demo_burst.py``): it stands for another team's service on other
    machines, and here it shares two cores with the broker and the services
    being measured. It still sends as fast as the pipeline leaves it CPU for.
    ``max_in_flight``: its replay's bound on requests sent and not answered
    (:class:`traffic.replay.ReplaySettings`); None: the whole burst at once.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, daemon=True, args=(
        bootstrap, config_text, org, burst, tokens, start_at, delay_s, timeout_s, nice,
        fetch_max_wait_ms, reply_partitions, max_in_flight, queue))
    process.start()
    return BurstProcess(process, queue, timeout_s)

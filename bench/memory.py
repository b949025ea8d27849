"""Memory per request held by the scheduler *service*, beyond the request itself.

Why: the scheduler holds every admitted request in memory until a worker has
room (``service.max_held_requests``, 100,000 by default; a burst can fill
it). What one held request costs decides how far that limit can go. Target:
at most 1 KB per held request beyond its payload.

What is measured, on the service's own intake path
(:meth:`scheduler.intake.TierIntake._take`, called with records as the tier
consumer delivers them, no Kafka needed): the decoded
:class:`~schemas.messages.AdmittedRequest` (the *payload*: its size depends
on the texts), the core's :class:`~scheduler.entry.Entry` and its places in
the org heap and the deadline heap, the held-id set, the offset tracker's
held offsets, the id -> (partition, offset) map for commits, and the per-org
backlog counters (:class:`~scheduler.snapshot.Backlog`). The payload alone
is measured by decoding the same records into a list; the rest is the
service's overhead, and a step-by-step rebuild of the same structures says
where its bytes go. ``tracemalloc`` counts Python allocations exactly
(``--requests``, default 100,000); the 1,000,000-request run (``--million``)
reads the process's resident memory instead (tracemalloc would slow it ~3x)
and also times the intake.

Run: ``python bench/memory.py`` (~1 min on 2 cores) or ``--quick`` (~10 s,
20,000 requests, no million). Interleaved rounds (payload, service, payload,
service...), the smallest of each kept.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import write_json
from plumbing.kafka import KafkaSettings
from scheduler.service import SchedulerService
from schemas.build import build_config
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, EmbedInput

__all__ = ["main"]

_codec = codec_for(AdmittedRequest)
_MSGPACK = [("content-type", b"application/msgpack")]

#: Three tiers and one endpoint; no orgs (none is needed to hold requests).
CONFIG = build_config(max_held_requests=2000000, tier_partitions=8,
                      tiers=["enterprise", "standard", "free"]).config


class _Record(NamedTuple):
    """What the tier consumer hands the intake (the fields it reads)."""

    topic: str
    partition: int
    offset: int
    value: bytes
    headers: list
    timestamp: int
    key: bytes | None = None


class _TP(NamedTuple):
    topic: str
    partition: int


def records(n: int, *, orgs: int, text_chars: int, seed: int = 0) -> list[_Record]:
    """``n`` admitted requests as msgpack records: one text, ``orgs`` orgs, 3 tiers, 8 partitions."""
    now = 1_700_000_000_000
    text = ("lorem ipsum dolor sit amet " * (text_chars // 27 + 1))[:text_chars]
    tiers = ("enterprise", "standard", "free")
    out = []
    for i in range(n):
        org = f"org-{(i * 7919 + seed) % orgs}"
        req = AdmittedRequest(
            id=f"req-{seed}-{i:08d}", org=org, endpoint="embed", tier=tiers[i % 3],
            input=EmbedInput(texts=(text,)), tokens=64, priority=i % 4,
            deadline_at_ms=now + 60_000 if i % 2 else None, created_ms=now, admitted_ms=now,
            reply_to="sf.replies.client-0123456789ab")
        out.append(_Record("sf.requests." + req.tier, i % 8, i // 8, _codec.encode(req),
                           _MSGPACK, now))
    return out


def service() -> SchedulerService:
    """A scheduler service, constructed but never started: its intake works without Kafka."""
    return SchedulerService(CONFIG, KafkaSettings(bootstrap="unused:9092"))


async def hold_all(svc: SchedulerService, recs: list[_Record]) -> None:
    take = svc.intake._take
    for rec in recs:
        await take(_TP(rec.topic, rec.partition), rec)


def measure_payload(recs: list[_Record]) -> int:
    """Bytes that the decoded requests alone keep alive."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = [_codec.decode(r.value, "msgpack") for r in recs]
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del kept
    return used


def measure_service(recs: list[_Record]) -> tuple[int, int]:
    """Bytes the service keeps for ``recs`` held (payload included), and how many it holds."""
    svc = service()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    asyncio.run(hold_all(svc, recs))
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    held = svc.core.held
    del svc
    return used, held


def breakdown(recs: list[_Record]) -> dict[str, float]:
    """Bytes per request of each structure, built step by step as the intake builds them."""
    from plumbing.offsets import OffsetTracker
    from scheduler.core import Scheduler
    from scheduler.entry import NO_DEADLINE, Entry
    from scheduler.snapshot import Backlog

    config = CONFIG
    core, offsets, backlog = Scheduler(config), OffsetTracker(), Backlog()
    origin: dict[str, tuple[_TP, int]] = {}
    tps = {(r.topic, r.partition): _TP(r.topic, r.partition) for r in recs}
    gc.collect()
    tracemalloc.start()
    last = tracemalloc.get_traced_memory()[0]
    out: dict[str, float] = {}

    def step(name: str) -> None:
        nonlocal last
        now = tracemalloc.get_traced_memory()[0]
        out[name] = (now - last) / len(recs)
        last = now

    reqs = [_codec.decode(r.value, "msgpack") for r in recs]
    step("payload: decoded AdmittedRequest")
    entries = [Entry(q.id, q.org, q.tier, q.tokens, priority=q.priority,
                     deadline=(NO_DEADLINE if q.deadline_at_ms is None
                               else q.deadline_at_ms / 1000),
                     arrival=time.time(), payload=q) for q in reqs]
    step("core: Entry")
    for q, e in zip(reqs, entries, strict=True):
        core.push(q.endpoint, e)
    step("core: held ids, org heap, DRR ring, deadline heap")
    for r in recs:
        offsets.hold(tps[(r.topic, r.partition)], r.offset)
    step("offset tracker: held offsets")
    for q, r in zip(reqs, recs, strict=True):
        origin[q.id] = (tps[(r.topic, r.partition)], r.offset)
    step("id -> (partition, offset) for commits")
    for q in reqs:
        backlog.add(q.endpoint, q.tier, q.org, q.tokens)
    step("per-org backlog counters")
    tracemalloc.stop()
    del reqs, entries  # the structures above keep what they hold
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def million(n: int, orgs: int, text_chars: int) -> dict:
    """Hold ``n`` requests; resident memory before and after, and intake time."""
    chunk = 100_000
    svc = service()
    gc.collect()
    before = rss_bytes()
    took = 0.0
    for start in range(0, n, chunk):
        recs = records(min(chunk, n - start), orgs=orgs, text_chars=text_chars, seed=start)
        t0 = time.perf_counter()
        asyncio.run(hold_all(svc, recs))
        took += time.perf_counter() - t0
        del recs
    gc.collect()
    after = rss_bytes()
    return {"held": svc.core.held, "rss_mib": (after - before) / 2**20,
            "rss_per_request": (after - before) / svc.core.held,
            "intake_s": took, "intake_per_s": svc.core.held / took}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="20,000 requests, 2 rounds, no million run")
    parser.add_argument("--requests", type=int, default=None, help="traced (default 100,000)")
    parser.add_argument("--orgs", type=int, default=1000, help="distinct orgs (default 1,000)")
    parser.add_argument("--text-chars", type=int, default=300,
                        help="characters of the request's one text (default 300, ~64 tokens)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the smallest counts")
    parser.add_argument("--million", type=int, default=None,
                        help="requests for the resident-memory run (default 1,000,000; "
                             "0 skips it; quick: 0)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    n = args.requests or (20_000 if args.quick else 100_000)
    big = args.million if args.million is not None else (0 if args.quick else 1_000_000)

    recs = records(n, orgs=args.orgs, text_chars=args.text_chars)
    wire = sum(len(r.value) for r in recs) / n
    payload = service_total = float("inf")
    held = 0
    for _ in range(args.repeat):
        payload = min(payload, measure_payload(recs))
        used, held = measure_service(recs)
        service_total = min(service_total, used)
    per_payload = payload / n
    per_total = service_total / held
    overhead = per_total - per_payload
    print(f"{n:,} held requests, {args.orgs:,} orgs, 3 tiers, 8 partitions, one text of "
          f"{args.text_chars} characters (msgpack record {wire:.0f} B); tracemalloc, smallest "
          f"of {args.repeat} rounds")
    print(f"{'':<34}{'bytes/request':>14}")
    print(f"{'payload (decoded AdmittedRequest)':<34}{per_payload:>14.0f}")
    print(f"{'service total (payload included)':<34}{per_total:>14.0f}")
    print(f"{'overhead beyond the payload':<34}{overhead:>14.0f}")
    print(f"ratio service total / payload: {per_total / per_payload:.2f}x; overhead "
          f"{overhead:.0f} B vs target <= 1024 B: {'met' if overhead <= 1024 else 'NOT met'}")
    parts = breakdown(recs)
    print("where the bytes go (built step by step, one round):")
    for name, b in parts.items():
        print(f"  {name:<52}{b:>8.0f}")
    print(f"  {'sum beyond the payload':<52}"
          f"{sum(b for k, b in parts.items() if not k.startswith('payload')):>8.0f}")
    figures = {"requests": n, "orgs": args.orgs, "text_chars": args.text_chars,
               "record_bytes": wire, "payload_bytes": per_payload, "total_bytes": per_total,
               "overhead_bytes": overhead, "breakdown": parts}
    if big:
        m = million(big, args.orgs, args.text_chars)
        print(f"{m['held']:,} held: resident memory +{m['rss_mib']:,.0f} MiB "
              f"({m['rss_per_request']:.0f} B/request, payload included); intake "
              f"{m['intake_s']:.1f} s ({m['intake_per_s']:,.0f} requests/s, decode + hold)")
        figures["million"] = m
    write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main()

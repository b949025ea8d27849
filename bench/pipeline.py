"""Pipeline overhead: requests/s end to end with a free model vs raw Kafka produce + consume.

Why: with a model that takes no time, what is left is the pipeline itself:
four Kafka hops (ingress, tier topic, batch topic, reply topic) and three
services deciding, holding, batching and answering. The baseline is the
least any Kafka pipeline pays: the same number of messages of the same size
produced and consumed once with aiokafka on the same broker.

- ``raw``: one producer sends N request-sized messages (``send()`` without
  waiting, then all acknowledgements), one consumer (no group) reads them;
  time from the first send to the last message read.
- ``pipeline``: admission, scheduler and one worker with the fake model at
  zero service time (:class:`plumbing.stack.Stack`, in this process) on the
  same broker; N requests of 16 tokens from five orgs sent at once with
  :func:`producer.replay.replay`; time from the first send to the last
  result produced. Every request must come back ``ok``.

Both run in this one process on the same event loop, so on a 2-core
machine the broker (a separate process) and this process share the cores.
Rounds interleave (raw, pipeline, raw, pipeline...) and each side's best
round counts. ``--profile FILE`` runs one more pipeline round under
cProfile and prints where the time went.

Run: ``python bench/pipeline.py`` (N = 10,000, 3 rounds) or ``--quick``
(N = 2,000, 2 rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from aiokafka.structs import TopicPartition

from plumbing.kafka import (
    KafkaSettings,
    add_kafka_arguments,
    kafka_endpoint,
    make_consumer,
    make_producer,
    settings_from_args,
)
from plumbing.logs import configure_logging
from plumbing.stack import Stack
from plumbing.topics import delete_topics, describe_topics, ensure_topics
from producer.replay import ReplaySettings, replay
from producer.replay_sources import ReplayItem
from producer.textsynth import TextSynth
from schemas.codec import codec_for
from schemas.config import Config, parse_config
from schemas.messages import Request
from worker.tokenizer import WhitespaceTokenCounter

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
ORGS = ("acme", "bulkcorp", "quiet-1", "quiet-2", "searchco")
_codec = codec_for(Request)


def bench_config(prefix: str) -> Config:
    text = (ROOT / "examples" / "config.toml").read_text()
    return parse_config(text.replace('topic_prefix = "sf."', f'topic_prefix = "{prefix}"'))


def make_items(n: int, tokens: int) -> list[ReplayItem]:
    synth = TextSynth(WhitespaceTokenCounter())
    return [ReplayItem(ts=0.0, tokens=tokens, request=Request(
        id=f"r{i}", org=ORGS[i % len(ORGS)], endpoint="embed",
        input=synth.make_input("embed", tokens, f"r{i}"))) for i in range(n)]


async def raw_round(kafka: KafkaSettings, values: list[bytes], keys: list[bytes]) -> float:
    """Seconds to produce ``values`` and read them all back, on a fresh 4-partition topic."""
    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, {topic: 4})
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    producer = make_producer(kafka)
    await producer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        n = len(values)

        async def read() -> None:
            seen = 0
            while seen < n:
                got = await consumer.getmany(timeout_ms=100)
                seen += sum(len(r) for r in got.values())

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.2)  # the consumer's first fetch is out
        t0 = time.perf_counter()
        futures = [await producer.send(topic, v, key=k) for v, k in zip(values, keys, strict=True)]
        await asyncio.gather(*futures)
        await reader
        return time.perf_counter() - t0
    finally:
        await producer.stop()
        await consumer.stop()
        await delete_topics(kafka, [topic])


async def pipeline_round(kafka: KafkaSettings, config: Config, items: list[ReplayItem]) -> float:
    """Seconds from the first send to the last result produced; every request must be ok."""
    run = await replay(kafka, config, items, ReplaySettings(
        timeout_s=120, progress=False, samples=False, lead_s=0.05))
    bad = [o for o in run.outcomes if o.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} requests not ok, e.g. {bad[0]}")
    start = min(o.arrival_s for o in run.outcomes)
    end = max(o.completed_s for o in run.outcomes)
    return end - start


def profile_summary(profiler: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return "\n".join(lines[start:start + top + 1])


async def amain(args: argparse.Namespace) -> dict:
    n = args.requests or (2_000 if args.quick else 10_000)
    repeat = args.repeat or (2 if args.quick else 3)
    kafka = settings_from_args(args)
    embedded = kafka.bootstrap is None
    async with kafka_endpoint(kafka) as bootstrap:
        kafka = msgspec.structs.replace(kafka, bootstrap=bootstrap)
        if embedded:
            # Our own broker: short sessions make group joins take ~1 s, not 3.
            kafka = msgspec.structs.replace(kafka, session_timeout_ms=2000,
                                            heartbeat_interval_ms=500)
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        config = bench_config(prefix)
        items = make_items(n, args.tokens)
        sample = [msgspec.structs.replace(it.request, reply_to=f"{prefix}replies.x",
                                          created_ms=int(time.time() * 1000))
                  for it in items]
        values = [_codec.encode(r, "json") for r in sample]
        keys = [r.org.encode() for r in sample]
        raw: list[float] = []
        pipe: list[float] = []
        try:
            async with Stack(config, kafka, model="fake", endpoints=["embed"]):
                await pipeline_round(kafka, config, items[:200])  # warm-up
                for _ in range(repeat):
                    raw.append(await raw_round(kafka, values, keys))
                    pipe.append(await pipeline_round(kafka, config, items))
                profile = None
                if args.profile:
                    profiler = cProfile.Profile()
                    profiler.enable()
                    await pipeline_round(kafka, config, items)
                    profiler.disable()
                    profiler.dump_stats(args.profile)
                    profile = profile_summary(profiler, 15)
        finally:
            await delete_topics(kafka, await describe_topics(kafka, prefix))
    raw_rps = n / min(raw)
    pipe_rps = n / min(pipe)
    size = sum(len(v) for v in values) / n
    print(f"{n:,} requests of {args.tokens} tokens ({size:.0f} B as JSON), 5 orgs; best of "
          f"{repeat} interleaved rounds; broker {'embedded Tansu' if embedded else bootstrap}")
    print(f"{'':<44}{'seconds':>9}{'msgs/s':>10}")
    print(f"{'raw aiokafka produce + consume (1 hop)':<44}{min(raw):>9.2f}{raw_rps:>10,.0f}")
    print(f"{'pipeline end to end, fake model at 0 ms':<44}{min(pipe):>9.2f}{pipe_rps:>10,.0f}")
    print(f"ratio pipeline / raw: {pipe_rps / raw_rps:.3f} ({raw_rps / pipe_rps:.1f}x slower); "
          f"rounds raw {', '.join(f'{x:.2f}' for x in raw)} s, pipeline "
          f"{', '.join(f'{x:.2f}' for x in pipe)} s")
    figures = {"requests": n, "tokens": args.tokens, "message_bytes": size, "raw_s": raw,
               "pipeline_s": pipe, "raw_rps": raw_rps, "pipeline_rps": pipe_rps,
               "ratio": pipe_rps / raw_rps}
    if profile:
        print(f"\ncProfile of one more pipeline round (tottime, top 15; full stats in "
              f"{args.profile}):\n{profile}")
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 requests, 2 rounds")
    parser.add_argument("--requests", type=int, default=None, help="default 10,000")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per request")
    parser.add_argument("--repeat", type=int, default=None, help="rounds (default 3, quick 2)")
    parser.add_argument("--profile", metavar="FILE", help="profile one more pipeline round")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging("WARNING")  # the services log every batch at INFO
    figures = asyncio.run(amain(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()

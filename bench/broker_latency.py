"""Broker start time and produce->consume latency with our client settings.

Why: the latency defaults in ``plumbing.kafka`` (linger 5 ms, fetch wait
10 ms) were chosen from measurements on the embedded Tansu broker; this
re-measures them, and measures any ``--bootstrap`` cluster the same way.

    python bench/broker_latency.py                      # our defaults, embedded
    python bench/broker_latency.py --aiokafka-defaults  # the baseline
    python bench/broker_latency.py --rate 5000 --size 4096 --seconds 10

One process, one event loop: the producer sends at a fixed rate, a consumer
(no group) reads, and each record carries its send time. Latency therefore
includes the consumer loop's own scheduling delay, as in a real service.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plumbing.broker import EmbeddedBroker
from plumbing.kafka import (
    add_kafka_arguments,
    kafka_endpoint,
    make_consumer,
    make_producer,
    settings_from_args,
)
from plumbing.topics import delete_topics, ensure_topics
from traffic.percentile import percentile

__all__ = ["main"]

_STAMP = struct.Struct(">q")


def broker_start_times(runs: int) -> dict[str, float]:
    """Start-to-answering time of the embedded broker, in ms."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        with EmbeddedBroker():
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"p50_ms": round(statistics.median(times), 1), "max_ms": round(times[-1], 1)}


async def latency(args: argparse.Namespace) -> dict[str, object]:
    settings = settings_from_args(args)
    if args.aiokafka_defaults:
        settings = msgspec.structs.replace(
            settings, linger_ms=0, fetch_max_wait_ms=500, max_batch_size=16384
        )
    async with kafka_endpoint(settings) as bootstrap:
        settings = msgspec.structs.replace(settings, bootstrap=bootstrap)
        topic = f"bench.latency.{uuid.uuid4().hex[:8]}"
        await ensure_topics(settings, {topic: args.partitions})
        consumer = make_consumer(settings, topic)
        producer = make_producer(settings)
        await consumer.start()
        await producer.start()
        total = int(args.rate * args.seconds)
        latencies: list[float] = []
        try:
            reader = asyncio.create_task(_read(consumer, total, latencies))
            padding = b"x" * max(0, args.size - _STAMP.size)
            t0 = time.perf_counter()
            for i in range(total):
                # Pace against the schedule, not the previous send, so a slow
                # moment is caught up instead of lowering the rate.
                delay = t0 + i / args.rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await producer.send(
                    topic, _STAMP.pack(time.perf_counter_ns()) + padding, key=str(i % 64).encode()
                )
            await producer.flush()
            sent_s = time.perf_counter() - t0
            await asyncio.wait_for(reader, timeout=30)
        finally:
            await producer.stop()
            await consumer.stop()
            await delete_topics(settings, [topic])
    latencies.sort()
    return {
        "linger_ms": settings.linger_ms,
        "fetch_max_wait_ms": settings.fetch_max_wait_ms,
        "rate_msg_s": args.rate,
        "achieved_rate_msg_s": round(total / sent_s),
        "size_b": args.size,
        "messages": total,
        "p50_ms": round(percentile(latencies, 50), 1),
        "p90_ms": round(percentile(latencies, 90), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(latencies[-1], 1),
    }


async def _read(consumer, total: int, out: list[float]) -> None:
    while len(out) < total:
        batches = await consumer.getmany(timeout_ms=1000)
        now = time.perf_counter_ns()
        for records in batches.values():
            for r in records:
                out.append((now - _STAMP.unpack_from(r.value)[0]) / 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=5, help="how long to send")
    parser.add_argument("--size", type=int, default=200, help="message bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--start-runs", type=int, default=10, help="broker starts to time")
    parser.add_argument(
        "--aiokafka-defaults", action="store_true",
        help="linger 0 ms, fetch wait 500 ms, 16 KB batches: the baseline",
    )  # fmt: skip
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    result: dict[str, object] = {}
    if args.start_runs:
        result["broker_start"] = broker_start_times(args.start_runs)
    result["latency"] = asyncio.run(latency(args))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

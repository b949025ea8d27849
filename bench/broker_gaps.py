"""Does a consumer skip records the broker acknowledged? aiokafka's against ours, side by side.

Why: Tansu reserves a produce's offsets before it stores the batch, and a
fetch between the two steps, once a later produce has stored its batch, is
answered with that later batch. aiokafka takes the jump for compaction and
never reads the earlier batch (``plumbing/contiguity.py``). This provokes
it the way the pipeline does on a small machine (many small produces to one
partition, every core busy) and reads the partition with both consumers at
once:

    python bench/broker_gaps.py                  # 90 s, 3 producer processes, 2 busy loops
    python bench/broker_gaps.py --seconds 30 --json out/gaps.json

Producer processes each run ``--producers`` producers that send one record
and await its acknowledgement, over and over; one more process reads the
partition from offset 0 with ``--consumers`` plain ``AIOKafkaConsumer`` and
as many ``plumbing.kafka.Consumer``. ``--hogs`` processes spin, so the
broker's threads are preempted as they are when the services share its
cores. Every record delivered is checked against the one before it (a
partition's offsets are contiguous: nothing here compacts or uses
transactions). Prints one line per kind of consumer and one JSON object;
the JSON keys: ``acknowledged``, ``aiokafka`` and ``ours`` (each
``delivered``, ``jumps``, ``jumped_offsets``), ``ours_refetched``,
``ours_skipped``. Any jump is timing: a run may see none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from plumbing.broker import EmbeddedBroker
from plumbing.kafka import Consumer, KafkaSettings
from plumbing.topics import ensure_topics

__all__ = ["main"]

_TOPIC = "gaps"


def _produce(bootstrap: str, producers: int, seconds: float, out: mp.Queue) -> None:
    async def one() -> int:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
        await p.start()
        n, end = 0, time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                await (await p.send(_TOPIC, b"x" * 100, partition=0))
                n += 1
        finally:
            await p.stop()
        return n

    async def run() -> int:
        return sum(await asyncio.gather(*(one() for _ in range(producers))))

    out.put(asyncio.run(run()))


def _consume(bootstrap: str, consumers: int, seconds: float, out: mp.Queue) -> None:
    async def one(consumer: AIOKafkaConsumer) -> dict:
        await consumer.start()
        tp = TopicPartition(_TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        last, delivered, jumps, jumped = -1, 0, 0, 0
        end = time.monotonic() + seconds + 5
        try:
            while time.monotonic() < end:
                got = await consumer.getmany(timeout_ms=100)
                for rec in got.get(tp, []):
                    delivered += 1
                    if rec.offset != last + 1:
                        jumps += 1
                        jumped += rec.offset - last - 1
                    last = rec.offset
        finally:
            await consumer.stop()
        return {"delivered": delivered, "jumps": jumps, "jumped_offsets": jumped,
                "refetched": getattr(consumer, "gaps_refetched", 0),
                "skipped": getattr(consumer, "gaps_skipped", 0)}

    async def run() -> dict:
        kwargs = {"bootstrap_servers": bootstrap, "enable_auto_commit": False,
                  "fetch_max_wait_ms": 5}
        plain = [AIOKafkaConsumer(**kwargs) for _ in range(consumers)]
        ours = [Consumer(**kwargs) for _ in range(consumers)]
        results = await asyncio.gather(*(one(c) for c in plain + ours))
        return {"aiokafka": results[:consumers], "ours": results[consumers:]}

    out.put(asyncio.run(run()))


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _total(rows: list[dict]) -> dict:
    return {k: sum(r[k] for r in rows) for k in ("delivered", "jumps", "jumped_offsets")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--producer-processes", type=int, default=3)
    ap.add_argument("--producers", type=int, default=4, help="producers per process")
    ap.add_argument("--consumers", type=int, default=3, help="consumers of each kind")
    ap.add_argument("--hogs", type=int, default=2, help="busy processes beside the broker")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    with EmbeddedBroker() as broker:
        asyncio.run(ensure_topics(KafkaSettings(bootstrap=broker.bootstrap), {_TOPIC: 1}))
        produced: mp.Queue = mp.Queue()
        consumed: mp.Queue = mp.Queue()
        procs = [mp.Process(target=_produce, args=(broker.bootstrap, args.producers,
                                                   args.seconds, produced))
                 for _ in range(args.producer_processes)]
        procs.append(mp.Process(target=_consume, args=(broker.bootstrap, args.consumers,
                                                       args.seconds, consumed)))
        procs += [mp.Process(target=_spin, args=(args.seconds,)) for _ in range(args.hogs)]
        for p in procs:
            p.start()
        acknowledged = sum(produced.get(timeout=args.seconds + 60)
                           for _ in range(args.producer_processes))
        result = consumed.get(timeout=args.seconds + 60)
        for p in procs:
            p.join(timeout=30)

    plain, ours = _total(result["aiokafka"]), _total(result["ours"])
    refetched = sum(r["refetched"] for r in result["ours"])
    skipped = sum(r["skipped"] for r in result["ours"])
    print(f"acknowledged {acknowledged} records to one partition in {args.seconds:.0f} s")
    print(f"{'consumer':<30}{'delivered':>11}{'jumps':>7}{'offsets jumped':>16}")
    print(f"{'aiokafka AIOKafkaConsumer':<30}{plain['delivered']:>11}{plain['jumps']:>7}"
          f"{plain['jumped_offsets']:>16}")
    print(f"{'plumbing.kafka.Consumer':<30}{ours['delivered']:>11}{ours['jumps']:>7}"
          f"{ours['jumped_offsets']:>16}   (fetched again {refetched}, passed over {skipped})")
    report = {"acknowledged": acknowledged, "seconds": args.seconds, "aiokafka": plain,
              "ours": ours, "ours_refetched": refetched, "ours_skipped": skipped}
    print(json.dumps(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if ours["jumps"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

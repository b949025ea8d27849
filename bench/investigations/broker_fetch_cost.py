"""What a fetch at a partition's end costs on the embedded broker, against how many batches it holds.

Why: Tansu's memory store answers a fetch by listing every batch the
partition holds, from its first, and stops listing when the fetch's
``max_wait`` runs out; a consumer at the end of a long partition then gets
nothing back, however long it waits (docs/reliability.md, "A partition too
long to fetch from"). This writes one-record batches to one partition and,
at each size, times fetches at the end with our ``fetch_max_wait_ms`` and
with ten times it, side by side:

    python bench/investigations/broker_fetch_cost.py         # 1,000 / 10,000 / 30,000 batches
    python bench/investigations/broker_fetch_cost.py --sizes 1000,5000 --json out/fetch_cost.json

Each row: batches held, then per max wait the p50 of ``--fetches`` fetches
of the last record (ms; ``none`` when no fetch returned it within
``--give-up-s``) and how many returned it. JSON: ``rows``, each with
``batches`` and, per max wait in ms, ``p50_ms`` and ``answered``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from plumbing.topics import ensure_topics

__all__ = ["main"]

_TOPIC = "long"


async def _tail_fetches(bootstrap: str, wait_ms: int, at: int, fetches: int,
                        give_up_s: float) -> tuple[float | None, int]:
    tp = TopicPartition(_TOPIC, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=wait_ms)
    await consumer.start()
    consumer.assign([tp])
    times: list[float] = []
    try:
        for _ in range(fetches):
            consumer.seek(tp, at)
            t0 = time.perf_counter()
            got = await consumer.getmany(tp, timeout_ms=int(give_up_s * 1000))
            if got.get(tp):
                times.append((time.perf_counter() - t0) * 1000)
    finally:
        await consumer.stop()
    return (round(statistics.median(times), 1) if times else None), len(times)


async def _run(sizes: list[int], waits: list[int], fetches: int, give_up_s: float) -> list[dict]:
    rows = []
    with EmbeddedBroker() as broker:
        await ensure_topics(KafkaSettings(bootstrap=broker.bootstrap), {_TOPIC: 1})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        await producer.start()
        held = 0
        try:
            for size in sizes:
                while held < size:  # one record per produce: one stored batch each
                    await (await producer.send(_TOPIC, b"x" * 100, partition=0))
                    held += 1
                row: dict = {"batches": held}
                for wait in waits:
                    p50, answered = await _tail_fetches(broker.bootstrap, wait, held - 1,
                                                        fetches, give_up_s)
                    row[str(wait)] = {"p50_ms": p50, "answered": answered}
                rows.append(row)
                print(_line(row, waits, fetches), flush=True)
        finally:
            await producer.stop()
    return rows


def _line(row: dict, waits: list[int], fetches: int) -> str:
    cells = []
    for wait in waits:
        r = row[str(wait)]
        p50 = "none" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}"
        cells.append(f"{p50:>8} ({r['answered']}/{fetches})")
    return f"{row['batches']:>9,}" + "".join(f"{c:>22}" for c in cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,30000",
                    help="batches held at each measurement, rising (default 1000,10000,30000)")
    ap.add_argument("--fetches", type=int, default=10)
    ap.add_argument("--give-up-s", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    waits = [KafkaSettings().fetch_max_wait_ms, 10 * KafkaSettings().fetch_max_wait_ms]
    print("one-record batches in one partition; a fetch of the last record, p50 ms (answered)")
    print(f"{'batches':>9}" + "".join(f"{f'max wait {w} ms':>22}" for w in waits))
    rows = asyncio.run(_run(sizes, waits, args.fetches, args.give_up_s))
    report = {"waits_ms": waits, "fetches": args.fetches, "rows": rows}
    print(json.dumps(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The most `bench/pipeline.py` can reach: four raw Kafka hops chained, against one.

Why: the pipeline is four hops (ingress, tier topic, batch topic, reply
topic) with a service between each two; ``ratio`` and ``ratio_processes``
in ``bench/pipeline.py`` compare it with one raw produce + consume hop.
Take the services' logic away and what is left is three relays that read a
record and write it on: the same four hops with nothing decided, held or
answered. That chain is the ceiling of those ratios on this machine and
this broker, whatever the services do. Side by side, rounds interleaved:

- ``raw``: one producer sends N messages of the pipeline's request size
  (``send()`` without waiting, then every acknowledgement), one consumer
  (no group) reads them; first send to last read;
- ``chain in one process``: the same producer and reader with three relays
  between them (each a group consumer and a producer, as
  ``bench/service_rounds.py``'s raw relay: a fetch's records sent on, then
  acknowledged and committed), all on this process's event loop, as
  ``app.stack.Stack`` runs the services;
- ``chain, each relay its own process``: the three relays in three
  processes, as ``app.processes.ProcessStack`` runs the services.

Run: ``python bench/raw_chain.py`` (N = 10,000, 3 rounds) or ``--quick``
(N = 2,000, 2 rounds); ``--json OUT`` writes ``chain_ratio`` (one process)
and ``chain_ratio_processes``, each the best chain round's rate over the
best raw round's, and the seconds of every round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import uuid
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hops import produce_and_read

from plumbing.broker import EmbeddedBroker
from plumbing.kafka import EMBEDDED_SESSION, KafkaSettings, make_consumer, make_producer
from plumbing.logs import configure_logging
from plumbing.topics import ensure_topics

__all__ = ["main"]

HOPS = 4
PARTITIONS = 4
#: The size of one of bench/pipeline.py's requests as JSON (16 tokens).
VALUE_BYTES = 225


async def _relay(kafka: KafkaSettings, src: str, dst: str, stop: asyncio.Event | None,
                 ready=None) -> None:
    """Read ``src`` (as a group) and write every record on to ``dst``, until ``stop``."""
    consumer = make_consumer(kafka, src, group_id=f"chain-{src}")
    await consumer.start()
    producer = make_producer(kafka)
    await producer.start()
    try:
        async with asyncio.timeout(30):
            while not consumer.assignment():
                await asyncio.sleep(0.05)
        if ready is not None:
            ready()
        while stop is None or not stop.is_set():
            got = await consumer.getmany(timeout_ms=100, max_records=500)
            futures = [await producer.send(dst, rec.value, key=rec.key)
                       for recs in got.values() for rec in recs]
            if futures:
                await asyncio.gather(*futures)
                await consumer.commit()
    finally:
        await producer.stop()
        await consumer.stop()


def _relay_process(bootstrap: str, src: str, dst: str, conn) -> None:
    """A relay in a process of its own; runs until its parent kills it."""
    configure_logging("WARNING")
    asyncio.run(_relay(KafkaSettings(bootstrap=bootstrap), src, dst, None,
                       ready=lambda: conn.send("ready")))


async def _timed(kafka: KafkaSettings, first: str, last: str, n: int) -> float:
    """Seconds from the first send to ``first`` until all ``n`` records are read from ``last``."""
    return await produce_and_read(kafka, first, last, PARTITIONS, [b"x" * VALUE_BYTES] * n,
                                  [f"org-{i % 5}".encode() for i in range(n)])


async def _topics(kafka: KafkaSettings, count: int) -> list[str]:
    names = [f"chain-{uuid.uuid4().hex[:8]}-{i}" for i in range(count)]
    await ensure_topics(kafka, dict.fromkeys(names, PARTITIONS))
    return names


async def raw_round(kafka: KafkaSettings, n: int) -> float:
    (topic,) = await _topics(kafka, 1)
    return await _timed(kafka, topic, topic, n)


async def chain_round(kafka: KafkaSettings, n: int) -> float:
    topics = await _topics(kafka, HOPS)
    stop = asyncio.Event()
    ready = asyncio.Event()
    joined = 0

    def one_ready() -> None:
        nonlocal joined
        joined += 1
        if joined == HOPS - 1:
            ready.set()

    relays = [asyncio.create_task(_relay(kafka, src, dst, stop, ready=one_ready))
              for src, dst in pairwise(topics)]
    try:
        async with asyncio.timeout(60):
            await ready.wait()
        return await _timed(kafka, topics[0], topics[-1], n)
    finally:
        stop.set()
        await asyncio.gather(*relays, return_exceptions=True)


async def chain_processes_round(kafka: KafkaSettings, n: int) -> float:
    topics = await _topics(kafka, HOPS)
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    try:
        for src, dst in pairwise(topics):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_relay_process, args=(kafka.bootstrap, src, dst, child),
                            daemon=True)
            p.start()
            procs.append(p)
            conns.append(parent)
        for conn in conns:
            if not await asyncio.to_thread(conn.poll, 60):
                raise RuntimeError("a relay process did not join its group within 60 s")
            conn.recv()
        return await _timed(kafka, topics[0], topics[-1], n)
    finally:
        for p in procs:
            p.kill()
            p.join(5)


async def amain(n: int, repeat: int) -> dict:
    sides = {"raw": raw_round, "chain": chain_round, "chain_processes": chain_processes_round}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    with EmbeddedBroker() as broker:
        kafka = KafkaSettings(bootstrap=broker.bootstrap, **EMBEDDED_SESSION)
        await raw_round(kafka, min(n, 500))  # warm-up
        for _ in range(repeat):
            for name, fn in sides.items():
                seconds[name].append(await fn(kafka, n))
    rate = {name: n / min(s) for name, s in seconds.items()}
    return {
        "requests": n, "value_bytes": VALUE_BYTES, "hops": HOPS, "repeat": repeat,
        "seconds": seconds, "rate": rate,
        "chain_ratio": rate["chain"] / rate["raw"],
        "chain_ratio_processes": rate["chain_processes"] / rate["raw"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2,000, 2 rounds")
    parser.add_argument("--requests", type=int, help="messages per round (default 10,000)")
    parser.add_argument("--repeat", type=int, help="rounds per side (default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    n = args.requests or (2_000 if args.quick else 10_000)
    repeat = args.repeat or (2 if args.quick else 3)
    f = asyncio.run(amain(n, repeat))
    print(f"{n:,} messages of {VALUE_BYTES} B, {PARTITIONS} partitions per topic; best of "
          f"{repeat} interleaved rounds; broker embedded Tansu; {os.cpu_count()} CPUs")
    print(f"{'':<52}{'seconds':>9}{'rate':>12}")
    rows = (("raw aiokafka produce + consume (1 hop)", "raw"),
            (f"{HOPS} hops, 3 raw relays in one process", "chain"),
            (f"{HOPS} hops, each raw relay its own process", "chain_processes"))
    for label, key in rows:
        print(f"{label:<52}{min(f['seconds'][key]):>9.2f}{f['rate'][key]:>12,.0f} msgs/s")
    print(f"  chain_ratio (one process / raw): {f['chain_ratio']:.3f}   "
          f"bench/pipeline.py's ratio target: 0.2")
    print(f"  chain_ratio_processes: {f['chain_ratio_processes']:.3f}   "
          f"bench/pipeline.py's ratio_processes target: 0.3")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(f, indent=2) + "\n")
    return f


if __name__ == "__main__":
    main()

"""How many GPUs one scheduler feeds: a fleet of stub GPUs at an H200's speed, each kept how busy.

Why: ``bench/pipeline.py``'s "scheduler alone" feeds stub workers that report
every batch done the moment they read it: it measures the most requests a
second one scheduler moves, and ``docs/benchmarks.md`` divided that by one
H200's rate to say how many GPUs it feeds. That is an estimate; with the
shipped ``worker_slots`` (16) such an infinitely fast fleet of 4 is also
bound by its credit's round trip, not by the scheduler. This asks the
question directly: ``N`` stub GPUs, each serving its batches one at a time
for the time one H200 takes (``--overhead-ms`` + ``--ms-per-token`` x the
batch's tokens: 64 MiniLM-shaped requests of 60 tokens in 15.4 ms at the
default 0.004, ``docs/deployment.md``), fed by the real scheduler with a
backlog waiting on the tier topics. ``busy`` = the stub GPUs' service time
over ``N`` x the span from the moment the whole backlog is written (this
process writes it, on the event loop the scheduler and the stubs share) to
the last batch's end: 1.0 is a fleet the scheduler never left waiting
(``busy_whole``: from the first batch's start, the writing included). Beside it, where the idle
time went: the longest wait of a GPU with nothing in hand, and the share of
the idle time in waits over 10 ms (stalls of the scheduler, such as a
garbage collection, rather than a round trip of credit a little late).

The stubs behave towards the scheduler as workers do: they announce
themselves and one batch partition each (the endpoint has ``--partitions``),
return a batch's credit as its call starts (a worker does where one call
is shorter than its lead, ``worker/credit_return.py``), and report it done
with their service and hold times, so the scheduler's credit
(``scheduler/credit.py``) measures them as it would real ones. Each stub's
GPU runs on a timeline of its own: a batch starts when it is in hand and
the one before it has ended, whatever this process's event loop was doing
at that instant; what the loop delays is only when a batch is read and
when the reports go out, as on a loaded worker host.

The scheduler is the service itself, in this process (as in
``bench/pipeline.py``), beside the stubs; the broker is the embedded one
or ``--bootstrap``'s. On a 2-core machine the broker, the scheduler and
the stubs share the cores.

Run: ``python bench/fleet.py`` (fleets of 4, 8, 12 and 16; 3 s of each
fleet's capacity) or ``--quick`` (4 and 8, 1 s); ``--json FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from bench import service_rounds
from bench.figures import run_quietly
from plumbing.bounded import bounded
from plumbing.heap import settle
from plumbing.kafka import (
    KafkaSettings,
    add_kafka_arguments,
    kafka_connected,
    make_producer,
    settings_from_args,
)
from plumbing.topics import delete_topics
from scheduler.service import SchedulerService
from schemas.build import build_config
from schemas.codec import codec_for
from schemas.config import Config
from schemas.messages import WorkerEvent
from schemas.topics import Topics

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
#: How often each stub says it is alive (a worker's default heartbeat is 1 s).
BEAT_S = 0.2


@dataclass
class _Gpu:
    """One stub worker: the batches in hand, in order, and its GPU's timeline."""

    name: str
    partitions: list[int]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    #: batch id -> when it was read (perf_counter seconds).
    in_hand: dict[str, float] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    free_at: float = 0.0
    #: (start, end) of each batch served since the last reset, perf_counter seconds.
    calls: list[tuple[float, float]] = field(default_factory=list)
    requests: int = 0

    def reset(self) -> None:
        self.calls, self.requests = [], 0

    def busy_s(self, since: float, until: float) -> float:
        """Service time within ``[since, until]``."""
        return sum(max(0.0, min(b, until) - max(a, since)) for a, b in self.calls)

    def gaps(self, since: float) -> list[float]:
        """Each wait with nothing in hand between two calls, the part of it after
        ``since`` (seconds): the idle time :meth:`busy_s` leaves, in pieces."""
        return [a2 - max(b1, since) for (_, b1), (a2, _) in itertools.pairwise(self.calls)
                if a2 > max(b1, since)]


class StubFleet:
    """``workers`` stub GPUs of ``slots``, the endpoint's batch partitions dealt among them."""

    def __init__(self, kafka: KafkaSettings, config: Config, workers: int, slots: int,
                 ms_per_token: float, overhead_ms: float):
        self.kafka, self.topics, self.slots = kafka, Topics.of(config), slots
        self.partitions = config.endpoints["embed"].partitions
        n = max(1, min(workers, self.partitions))  # a partition has one owner
        self.gpus = {f"gpu-{i}": _Gpu(f"gpu-{i}", [p for p in range(self.partitions)
                                                    if p % n == i]) for i in range(n)}
        self.ms_per_token, self.overhead_ms = ms_per_token, overhead_ms
        self._head = msgspec.msgpack.Decoder(service_rounds.BatchHead)
        self._event = codec_for(WorkerEvent)

    @property
    def requests(self) -> int:
        return sum(g.requests for g in self.gpus.values())

    def reset(self) -> None:
        for g in self.gpus.values():
            g.reset()

    def service_s(self, tokens: int) -> float:
        return (self.overhead_ms + self.ms_per_token * tokens) / 1000

    def _send(self, gpu: _Gpu, kind: str, **fields) -> None:
        unreleased = sum(1 for b in gpu.in_hand if b not in gpu.released)
        ev = WorkerEvent(worker=gpu.name, endpoint="embed", kind=kind, partitions=gpu.partitions,
                         slots=self.slots, free_slots=max(0, self.slots - unreleased),
                         sent_ms=int(time.time() * 1000), in_flight=list(gpu.in_hand),
                         released=[b for b in gpu.in_hand if b in gpu.released], **fields)
        self._pending.append(asyncio.ensure_future(self.producer.send(
            self.topics.worker_events, self._event.encode(ev), key=gpu.name.encode(),
            headers=service_rounds.MSGPACK)))

    async def __aenter__(self) -> Self:
        self._pending: list[asyncio.Future] = []
        self.consumer = await service_rounds.batch_reader(self.kafka, self.topics,
                                                          self.partitions)
        self.producer = make_producer(self.kafka, linger_ms=0)
        await self.producer.start()
        for gpu in self.gpus.values():
            self._send(gpu, "hello")
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._beat()),
                      *(asyncio.create_task(self._serve(g)) for g in self.gpus.values())]
        return self

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            for gpu in self.gpus.values():
                self._send(gpu, "heartbeat")
            self._pending = [f for f in self._pending if not f.done()]

    async def _read(self) -> None:
        while True:
            got = await self.consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for recs in got.values():
                for rec in recs:
                    head = self._head.decode(rec.value)
                    if not head.requests:
                        continue  # a new leader's fence: nothing to serve
                    gpu = self.gpus.get(head.worker)
                    if gpu is None:
                        raise RuntimeError(f"batch {head.id} for {head.worker!r}, not a stub")
                    gpu.in_hand[head.id] = now
                    gpu.queue.put_nowait((head.id, head.tokens, len(head.requests)))

    async def _serve(self, gpu: _Gpu) -> None:
        """Run ``gpu``'s batches back to back on its own timeline; credit back at each
        call's start, the report at its end."""
        while True:
            batch_id, tokens, requests = await gpu.queue.get()
            # The GPU takes it as soon as it is both read and free, not when this
            # task wakes up: a late wake-up is the loop's, not the GPU's.
            now = time.perf_counter()
            start = max(gpu.in_hand[batch_id], gpu.free_at)
            if start > now:
                await asyncio.sleep(start - now)
            gpu.released.add(batch_id)
            self._send(gpu, "heartbeat")
            took = self.service_s(tokens)
            gpu.free_at = start + took
            gpu.calls.append((start, gpu.free_at))
            await asyncio.sleep(max(0.0, gpu.free_at - time.perf_counter()))
            taken = gpu.in_hand.pop(batch_id)
            gpu.released.discard(batch_id)
            gpu.requests += requests
            self._send(gpu, "batch_done", batch_id=batch_id, batch_requests=requests,
                       batch_tokens=tokens, inference_ms=took * 1000, service_ms=took * 1000,
                       held_ms=(gpu.free_at - taken) * 1000)

    async def __aexit__(self, *exc) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self.producer.stop()
        await self.consumer.stop()


async def fleet_round(kafka: KafkaSettings, config: Config, workers: int, args) -> dict:
    """One fleet of ``workers`` fed a backlog of ``args.seconds`` of its capacity."""
    words, per_batch = args.tokens, config.endpoints["embed"].max_batch_size
    per_batch = min(per_batch, config.endpoints["embed"].max_batch_tokens // words)
    batch_s = (args.overhead_ms + args.ms_per_token * per_batch * words) / 1000
    capacity = workers * per_batch / batch_s
    n = int(capacity * args.seconds)
    records = service_rounds.tier_records(config, n, words)
    service = SchedulerService(config, kafka)
    await service.start()
    task = asyncio.create_task(service.run())
    # As a scheduler process does once started (and this bench's own requests, made
    # above, with it): what the collector walks from here on is what the scheduler holds.
    settle()
    try:
        async with StubFleet(kafka, config, workers, config.service.worker_slots,
                             args.ms_per_token, args.overhead_ms) as fleet:
            await bounded(service_rounds.until(lambda: service.readiness()[0]
                                 and len(service.flow.workers) >= len(fleet.gpus)), 30,
                          f"the scheduler to be ready and hear from all {workers} stub GPUs")
            warm = workers * per_batch * 4
            await service_rounds.send_all_tiers(
                kafka, service_rounds.tier_records(config, warm, words))
            await bounded(service_rounds.until(lambda: fleet.requests >= warm), 60,
                          f"the {workers} stub GPUs to serve the {warm:,} warm-up requests")
            fleet.reset()
            t0 = time.perf_counter()
            await service_rounds.send_all_tiers(kafka, records)
            sent = time.perf_counter()
            await bounded(service_rounds.until(lambda: fleet.requests >= n), 60 + 20 * args.seconds,
                          f"the {workers} stub GPUs to serve all {n:,} requests")
            gpus = list(fleet.gpus.values())
            first = min(g.calls[0][0] for g in gpus if g.calls)
            last = max(g.calls[-1][1] for g in gpus if g.calls)
            # From the moment the whole backlog is written: before it, this process's
            # own sender shares the event loop with the scheduler and the stubs.
            since = max(sent, first)
            window = last - since
            busy = [g.busy_s(since, last) / window for g in gpus]
            gaps = [d for g in gpus for d in g.gaps(since)]
            idle = sum(gaps)
            return {"workers": len(gpus), "requests": n, "batch_ms": batch_s * 1000,
                    "capacity_rps": capacity, "served_rps": n / (last - first),
                    "busy": sum(busy) / len(busy), "busy_min": min(busy), "busy_max": max(busy),
                    "busy_whole": sum(g.busy_s(first, last) for g in gpus)
                    / (len(gpus) * (last - first)),
                    "window_s": window, "send_s": sent - t0,
                    "first_start_ms": (first - t0) * 1000,
                    "idle_s": idle, "longest_gap_ms": 1000 * max(gaps, default=0.0),
                    "idle_in_gaps_over_10ms": (sum(d for d in gaps if d > 0.01) / idle
                                               if idle else 0.0)}
    finally:
        service.request_stop()
        await asyncio.wait_for(task, 30)
        await service.stop()
        await delete_topics(kafka, list(Topics.of(config).all(config)))


async def amain(args: argparse.Namespace) -> dict:
    fleets = [int(x) for x in (args.fleets or ("4,8" if args.quick else "4,8,12,16")).split(",")]
    if args.quick and args.seconds is None:
        args.seconds = 1.0
    args.seconds = args.seconds or 3.0
    partitions = max(args.partitions, *fleets)
    kafka = settings_from_args(args)
    broker = "embedded Tansu" if kafka.bootstrap is None else kafka.bootstrap
    rows: dict[str, dict] = {}
    for workers in fleets:
        # A broker of its own for each fleet, where embedded, so no round runs on
        # what the rounds before it left there (a fleet of 16 after three others:
        # 0.46-0.95 busy on one broker, 0.76-0.98 on its own, 0.91-0.98 run alone).
        async with kafka_connected(kafka) as connected:
            config = build_config(
                base=(ROOT / "examples" / "config.toml").read_text(),
                prefix=f"fleet{uuid.uuid4().hex[:6]}.",
                endpoints={"embed": {"partitions": partitions}}).config
            rows[str(workers)] = await fleet_round(connected, config, workers, args)
    fed = [int(w) for w, r in rows.items() if r["busy"] >= args.busy_target]
    figures = {"ms_per_token": args.ms_per_token, "overhead_ms": args.overhead_ms,
               "tokens": args.tokens, "seconds": args.seconds, "partitions": partitions,
               "busy_target": args.busy_target, "fleets": rows,
               "largest_fleet_at_target": max(fed) if fed else 0}
    first = next(iter(rows.values()))
    print(f"stub GPUs at {args.ms_per_token} ms per token + {args.overhead_ms} ms a call: "
          f"a batch of {first['batch_ms']:.1f} ms; requests of "
          f"{args.tokens} tokens; a backlog of {args.seconds:g} s of each fleet's capacity; "
          f"{partitions} batch partitions; broker {broker}")
    print(f"{'GPUs':>5}{'requests':>10}{'capacity/s':>12}{'served/s':>11}{'busy':>7}"
          f"{'min':>7}{'max':>7}{'whole':>7}{'longest gap ms':>16}{'idle in gaps >10 ms':>21}")
    for r in rows.values():
        print(f"{r['workers']:>5}{r['requests']:>10,}{r['capacity_rps']:>12,.0f}"
              f"{r['served_rps']:>11,.0f}{r['busy']:>7.3f}{r['busy_min']:>7.3f}"
              f"{r['busy_max']:>7.3f}{r['busy_whole']:>7.3f}{r['longest_gap_ms']:>16.1f}"
              f"{r['idle_in_gaps_over_10ms']:>21.0%}")
    print(f"largest fleet kept busy >= {args.busy_target}: "
          f"{figures['largest_fleet_at_target']} (busy: from the backlog written; whole: "
          f"from the first batch, its writing included)")
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fleets of 4 and 8, 1 s each")
    parser.add_argument("--fleets", help="comma-separated fleet sizes (default 4,8,12,16)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="backlog per fleet, in seconds of its capacity (default 3)")
    parser.add_argument("--tokens", type=int, default=60, help="tokens per request")
    parser.add_argument("--ms-per-token", type=float, default=0.004,
                        help="stub GPU time per token (H200, MiniLM-shaped: 0.0035-0.004)")
    parser.add_argument("--overhead-ms", type=float, default=0.0,
                        help="stub GPU time per call beside its tokens")
    parser.add_argument("--partitions", type=int, default=16,
                        help="the endpoint's batch partitions (at least the largest fleet)")
    parser.add_argument("--busy-target", type=float, default=0.9,
                        help="the busy fraction a fleet counts as fed at")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    return run_quietly(amain, parser.parse_args(argv))


if __name__ == "__main__":
    main()

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
  zero service time (:class:`app.stack.Stack`, in this process) on the
  same broker; N requests of 16 tokens from five orgs sent at once with
  :func:`traffic.replay.replay`; time from the first send to the last
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
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
import service_rounds
from hops import produce_and_read

from app.processes import ProcessStack
from app.stack import Stack
from bench.figures import run_quietly
from plumbing.kafka import (
    EMBEDDED_SESSION_ENV,
    KafkaSettings,
    add_kafka_arguments,
    kafka_connected,
    settings_from_args,
)
from plumbing.topics import delete_topics, describe_topics, ensure_topics
from schemas.build import Built, build_config
from schemas.codec import codec_for
from schemas.config import Config
from schemas.messages import Request
from tokens.counting import WhitespaceTokenCounter
from traffic.replay import ReplaySettings, replay
from traffic.replay_sources import ReplayItem
from traffic.textsynth import TextSynth

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
ORGS = ("acme", "bulkcorp", "quiet-1", "quiet-2", "searchco")
_codec = codec_for(Request)


def bench_config(prefix: str, **changes) -> Built:
    """The shipped example configuration under ``prefix``, with ``changes`` (build_config's)."""
    return build_config(base=(ROOT / "examples" / "config.toml").read_text(), prefix=prefix,
                        **changes)


def make_items(n: int, tokens: int) -> list[ReplayItem]:
    synth = TextSynth(WhitespaceTokenCounter())
    return [ReplayItem(ts=0.0, tokens=tokens, request=Request(
        id=f"r{i}", org=ORGS[i % len(ORGS)], endpoint="embed",
        input=synth.make_input("embed", tokens, f"r{i}"))) for i in range(n)]


async def raw_round(kafka: KafkaSettings, values: list[bytes], keys: list[bytes]) -> float:
    """Seconds to produce ``values`` and read them all back, on a fresh 4-partition topic."""
    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka, {topic: 4})
    try:
        return await produce_and_read(kafka, topic, topic, 4, values, keys)
    finally:
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


async def stack_rounds(kafka: KafkaSettings, items: list[ReplayItem], raw_args, repeat: int):
    """(raw, pipeline) seconds per round, the pipeline in this process."""
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    config = bench_config(prefix).config
    raw: list[float] = []
    pipe: list[float] = []
    try:
        async with Stack(config, kafka, model="fake", endpoints=["embed"]):
            await pipeline_round(kafka, config, items[:200])  # warm-up
            for _ in range(repeat):
                raw.append(await raw_round(kafka, *raw_args))
                pipe.append(await pipeline_round(kafka, config, items))
    finally:
        await delete_topics(kafka, await describe_topics(kafka, prefix))
    return raw, pipe, config


async def process_rounds(kafka: KafkaSettings, items: list[ReplayItem], raw_args, repeat: int,
                         embedded: bool):
    """(raw, pipeline) seconds per round, each service in a process of its own."""
    prefix = f"benchp{uuid.uuid4().hex[:6]}."
    built = bench_config(prefix)
    config = built.config
    env = {"SF_LOG_LEVEL": "WARNING"}
    if embedded:
        env |= EMBEDDED_SESSION_ENV
    raw: list[float] = []
    pipe: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(built.text)
        try:
            async with ProcessStack(path, kafka.require_bootstrap(), endpoints=["embed"],
                                    model="fake", env=env, extra_args={
                                        "admission": ["--token-counter", "fake"]}):
                await pipeline_round(kafka, config, items[:200])  # warm-up
                for _ in range(repeat):
                    raw.append(await raw_round(kafka, *raw_args))
                    pipe.append(await pipeline_round(kafka, config, items))
        finally:
            await delete_topics(kafka, await describe_topics(kafka, prefix))
    return raw, pipe


def _phase_line(phases: list[service_rounds.Phases]) -> str:
    """The scheduler's fastest round, phase by phase (ms from its first record sent)."""
    p = min(phases, key=lambda p: p.all_read_ms)
    return (f"  fastest round: first request held at {p.first_held_ms:.0f} ms, all held at "
            f"{p.all_held_ms:.0f}, all in acknowledged batches at {p.all_dispatched_ms:.0f}, "
            f"all read by the stub fleet at {p.all_read_ms:.0f}")


def _row(name: str, seconds: list[float], n: int, unit: str = "msgs/s") -> str:
    return f"{name:<52}{min(seconds):>9.2f}{n / min(seconds):>12,.0f} {unit}"


async def amain(args: argparse.Namespace) -> dict:
    n = args.requests or (2_000 if args.quick else 10_000)
    repeat = args.repeat or (2 if args.quick else 3)
    parts = set(args.parts.split(","))
    kafka = settings_from_args(args)
    embedded = kafka.bootstrap is None
    figures: dict = {"requests": n, "tokens": args.tokens, "repeat": repeat}
    lines: list[str] = []
    async with kafka_connected(kafka) as kafka:
        items = make_items(n, args.tokens)
        sample = [msgspec.structs.replace(it.request, reply_to="x.replies.x",
                                          created_ms=int(time.time() * 1000))
                  for it in items]
        values = [_codec.encode(r, "json") for r in sample]
        keys = [r.org.encode() for r in sample]
        figures["message_bytes"] = sum(len(v) for v in values) / n
        raw_all: list[float] = []
        profile = None
        if "stack" in parts:
            raw, pipe, config = await stack_rounds(kafka, items, (values, keys), repeat)
            raw_all += raw
            figures |= {"raw_s": raw, "pipeline_s": pipe, "raw_rps": n / min(raw),
                        "pipeline_rps": n / min(pipe), "ratio": min(raw) / min(pipe)}
            lines += [_row("raw aiokafka produce + consume (1 hop)", raw, n),
                      _row("pipeline in one process, fake model at 0 ms", pipe, n, "req/s"),
                      f"  ratio: {figures['ratio']:.3f}"]
            if args.profile:
                # Profiling slows every call ~2x: a latency target long enough
                # that the throttle refuses nothing in the profiled round.
                prefix = f"benchq{uuid.uuid4().hex[:6]}."
                config = bench_config(
                    prefix, endpoints={"embed": {"latency_target_ms": 600_000}}).config
                async with Stack(config, kafka, model="fake", endpoints=["embed"]):
                    await pipeline_round(kafka, config, items[:200])
                    profiler = cProfile.Profile()
                    profiler.enable()
                    await pipeline_round(kafka, config, items)
                    profiler.disable()
                await delete_topics(kafka, await describe_topics(kafka, prefix))
                profiler.dump_stats(args.profile)
                profile = profile_summary(profiler, 25)
        if "processes" in parts:
            raw, pipe = await process_rounds(kafka, items, (values, keys), repeat, embedded)
            raw_all += raw
            figures |= {"raw_processes_s": raw, "pipeline_processes_s": pipe,
                        "pipeline_processes_rps": n / min(pipe),
                        "ratio_processes": min(raw) / min(pipe)}
            lines += [_row("raw aiokafka produce + consume (1 hop)", raw, n),
                      _row("pipeline, each service its own process", pipe, n, "req/s"),
                      f"  ratio_processes: {figures['ratio_processes']:.3f}"]
        if "services" in parts:
            def fresh() -> Config:
                return bench_config(f"benchs{uuid.uuid4().hex[:6]}.").config
            fleet = max(1, args.stub_workers)
            fleets = (fleet,) if fleet == 1 else (fleet, 1)

            phases: dict[int, list[service_rounds.Phases]] = {}

            async def scheduler() -> tuple[list[float], list[float]]:
                relay, by_fleet = await service_rounds.scheduler_rounds(
                    kafka, fresh, n, args.tokens, repeat, args.stub_slots, fleets, phases,
                    args.scheduler_warm_up)
                figures["scheduler_phases_ms"] = [p._asdict() for p in phases[fleet]]
                figures["scheduler_warm_up"] = args.scheduler_warm_up
                if fleet != 1:  # the bench before 387a862 fed one stub worker: shown beside
                    one = by_fleet[1]
                    figures.update(scheduler_one_worker_s=one,
                                   scheduler_one_worker_rps=n / min(one),
                                   scheduler_one_worker_ratio=min(relay) / min(one))
                return relay, by_fleet[fleet]

            for name, rounds in (
                    ("admission", lambda: service_rounds.admission_rounds(
                        kafka, fresh, n, args.tokens, repeat)),
                    ("scheduler", scheduler),
                    ("worker", lambda: service_rounds.worker_rounds(
                        kafka, fresh, n, args.tokens, repeat, args.worker_slots))):
                relay, service = await rounds()
                figures |= {f"{name}_relay_s": relay, f"{name}_s": service,
                            f"{name}_rps": n / min(service),
                            f"{name}_ratio": min(relay) / min(service)}
                alone = (f"{name} alone" if name != "scheduler" else
                         f"scheduler alone, {fleet} stub workers x {args.stub_slots}")
                lines += [_row(f"raw relay, {name}'s records", relay, n),
                          _row(alone, service, n, "req/s"),
                          f"  {name}_ratio: {figures[f'{name}_ratio']:.3f}"]
                if name == "scheduler":
                    lines.append(_phase_line(phases[fleet]))
                if name == "scheduler" and "scheduler_one_worker_s" in figures:
                    lines += [_row(f"scheduler alone, 1 stub worker x {args.stub_slots}",
                                   figures["scheduler_one_worker_s"], n, "req/s"),
                              "  scheduler_one_worker_ratio: "
                              + f"{figures['scheduler_one_worker_ratio']:.3f}"]
    print(f"{n:,} requests of {args.tokens} tokens ({figures['message_bytes']:.0f} B as JSON), "
          f"5 orgs; best of {repeat} interleaved rounds; broker "
          f"{'embedded Tansu' if embedded else kafka.bootstrap}")
    print(f"{'':<52}{'seconds':>9}{'rate':>12}")
    print("\n".join(lines))
    if profile:
        print(f"\ncProfile of one more pipeline round (tottime, top 25; full stats in "
              f"{args.profile}):\n{profile}")
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 requests, 2 rounds")
    parser.add_argument("--requests", type=int, default=None, help="default 10,000")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per request")
    parser.add_argument("--repeat", type=int, default=None, help="rounds (default 3, quick 2)")
    parser.add_argument("--profile", metavar="FILE", help="profile one more pipeline round")
    parser.add_argument("--parts", default="stack,processes,services",
                        help="comma-separated: stack (in one process), processes, services")
    parser.add_argument("--stub-slots", type=int, default=16,
                        help="batches each of the scheduler's stub workers takes at once "
                             "(the configuration's worker_slots)")
    parser.add_argument("--stub-workers", type=int, default=4,
                        help="stub workers the scheduler feeds, one batch partition each "
                             "(4: every partition of the shipped configuration; 1: one worker, "
                             "as the bench was before 387a862)")
    parser.add_argument("--scheduler-warm-up", type=int, default=service_rounds.WARM_UP,
                        help="requests each scheduler serves, untimed, before its round, so "
                             "its credit for the stub workers is measured (0: a cold start, "
                             "as the bench was before 2026-12-07)")
    parser.add_argument("--worker-slots", type=int, default=4,
                        help="batches the worker alone takes at once")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    return run_quietly(amain, args)


if __name__ == "__main__":
    main()

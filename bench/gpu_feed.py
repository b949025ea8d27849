"""Keeping a GPU fed: worker busy time and a quiet org's latency at an H200's speed.

Why: the pipeline exists to keep accelerators busy while a quiet org's
requests still get through quickly. This runs the pipeline as deployed
(admission, scheduler and workers each in their own process, on the
embedded broker) with a **fake model at the speed measured on one H200**
(``docs/deployment.md``: 64 MiniLM-shaped texts in ~30 ms, 0.0035-0.004 ms
per padded token; default ``--ms-per-token 0.004``), so what limits the
run is the pipeline, not this machine's CPU doing inference.

Two phases per worker count (1 and 2 by default):

1. **unloaded**: the quiet org alone at a light rate (``--quiet-rps``) for
   ``--quiet-s`` seconds: its p99 with nothing in the way;
2. **saturated**: the bursting org offers ``--burst`` requests at once (far
   above what the workers serve in the time), the quiet org at the same
   light rate throughout.

Printed side by side, per worker count: the workers' busy fraction while the
burst was being served (model seconds over worker-seconds, from each
worker's ``sf_worker_inference_seconds``), requests/s served against the
model's capacity for full batches, a full batch's time, the round trip
flow control measured (``sf_scheduler_flow_round_trip_seconds``), and the
quiet org's p99 against its unloaded p99 and the bound
``unloaded p99 + 2 x batch + 1 round trip``.

``--json OUT`` writes, per worker count, ``busy``, ``served_rps``,
``capacity_rps``, ``quiet_p99_ms``, ``quiet_unloaded_p99_ms``, ``batch_ms``,
``round_trip_ms``, ``bound_ms``; with 1 worker also where the model was
not running the burst (``idle_ramp_ms``: before its first call,
``idle_gaps_ms``: between its calls; ``bench/burst.py``'s
``model_idle_ms``); and ``over_bound``: how many of the quiet org's
requests took longer than the bound, each stage's time beyond its p50
with no burst, summed over them (``traffic.stages.excess_by_stage``), and
when they were sent, in seconds after the burst's first request
(``sent_after_burst_s``); and the requests admission wrote to its backlog
topic and read back (``backlog_written``, ``backlog_read``: what moving a
burst there costs the quiet org is in ``docs/load.md``). ``--burst-in-flight N``: the
bursting org's client keeps at most N requests unanswered (a bulk job's client,
``docs/design.md``) instead of sending all at once.

Run: ``python bench/gpu_feed.py`` (workers 1 and 2), ``--quick`` (1 worker,
a smaller burst).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.processes import ProcessStack
from bench.burst import start_burst
from bench.figures import run_quietly
from bench.scrape import scrape
from plumbing.kafka import (
    EMBEDDED_SESSION_ENV,
    KafkaSettings,
    add_kafka_arguments,
    kafka_connected,
    settings_from_args,
)
from plumbing.topics import delete_topics, describe_topics
from schemas.build import Built, build_config
from schemas.messages import Request
from tokens.counting import WhitespaceTokenCounter
from traffic.replay import ReplaySettings, replay
from traffic.replay_outcomes import late_requests, results_ms, sent_after, sent_line
from traffic.replay_sources import ReplayItem
from traffic.report import percentile
from traffic.stages import (
    excess_by_stage,
    excess_line,
    request_stages,
    stage_line,
    stage_times,
    usual_stage_ms,
)
from traffic.textsynth import TextSynth

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
BURST_ORG, QUIET_ORG = "bulkcorp", "quiet-1"


def bench_config(prefix: str, latency_target_ms: int) -> Built:
    """The example configuration under ``prefix``, with a bulk job's latency target.

    A burst far above capacity would otherwise be throttled at admission
    (the example's 5 s target): the point here is the scheduler keeping the
    workers busy with a long queue, so the bulk endpoint accepts minutes.
    """
    target = {"latency_target_ms": latency_target_ms}
    return build_config(base=(ROOT / "examples" / "config.toml").read_text(), prefix=prefix,
                        endpoints={"embed": target, "rerank": target})


def items(quiet_rps: float, quiet_s: float, tokens: int) -> list[ReplayItem]:
    """The quiet org's requests, one every 1/quiet_rps s."""
    synth = TextSynth(WhitespaceTokenCounter())
    n = int(quiet_rps * quiet_s)
    return [ReplayItem(ts=i / quiet_rps, tokens=tokens, request=Request(
        id=f"q{i}", org=QUIET_ORG, endpoint="embed",
        input=synth.make_input("embed", tokens, f"q{i}"))) for i in range(n)]


def model_seconds(stack: ProcessStack) -> float:
    """Model time of every worker so far (their inference histograms' sums)."""
    total = 0.0
    for name, (_, port) in stack.procs.items():
        if name.startswith("worker"):
            total += scrape(port).get('sf_worker_inference_seconds_sum{endpoint="embed"}', 0.0)
    return total


def p99_ms(run, org: str) -> float:
    """``org``'s p99 latency (ms) over ALL its requests: one not ``ok`` (refused, expired,
    missing) counts as a miss, an infinite latency, not as left out; nan for none."""
    lat = sorted((o.completed_s - o.arrival_s) * 1000
                 if o.status == "ok" and o.completed_s is not None else math.inf
                 for o in run.outcomes if o.org == org)
    if not lat:
        return math.nan
    # Interpolated as before, where no miss is at the 99th position's either side.
    pos = (len(lat) - 1) * 0.99
    lo, hi = int(pos), min(int(pos) + 1, len(lat) - 1)
    if math.isinf(lat[lo]) or (pos > lo and math.isinf(lat[hi])):
        return math.inf
    return percentile(lat, 99)


async def one(kafka: KafkaSettings, args, workers: int) -> dict:
    prefix = f"gpu{uuid.uuid4().hex[:6]}."
    built = bench_config(prefix, 600_000)
    config = built.config
    model = f"fake:ms_per_token={args.ms_per_token},dim=32"
    env = {"SF_LOG_LEVEL": "WARNING"}
    if args.embedded:
        env |= EMBEDDED_SESSION_ENV
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(built.text)
        try:
            async with ProcessStack(path, kafka.require_bootstrap(), endpoints=["embed"],
                                    model=model, workers=workers, env=env,
                                    extra_args={"admission": ["--token-counter", "fake"]}) as st:
                settings = ReplaySettings(timeout_s=120, progress=False, samples=False,
                                          lead_s=1.0)
                await replay(kafka, config, items(args.quiet_rps, 2, args.tokens), settings)
                unloaded = await replay(kafka, config, items(args.quiet_rps, args.quiet_s,
                                                             args.tokens), settings)
                before = model_seconds(st)
                # The burst from a process of its own (another team's client),
                # 0.5 s into the quiet org's run.
                child = start_burst(kafka.require_bootstrap(), built.text, org=BURST_ORG,
                                    burst=args.burst, tokens=args.tokens,
                                    max_in_flight=args.burst_in_flight,
                                    start_at=time.time() + settings.lead_s + 0.5)
                loaded_items = items(args.quiet_rps, args.quiet_s, args.tokens)
                loaded = await replay(kafka, config, loaded_items, settings)
                burst = await child.outcome()
                busy_s = model_seconds(st) - before
                sched = next(p for n, (_, p) in st.procs.items() if n.startswith("scheduler"))
                flow = scrape(sched)
                admission = [scrape(p) for n, (_, p) in st.procs.items()
                             if n.startswith("admission")]
        finally:
            await delete_topics(kafka, await describe_topics(kafka, prefix))
    if burst.first_created_s is None or burst.last_completed_s is None:
        raise RuntimeError(f"the burst got no result served: {burst.statuses}")
    span = burst.last_completed_s - burst.first_created_s
    full_tokens = config.endpoints["embed"].max_batch_size * args.tokens
    batch_ms = full_tokens * args.ms_per_token
    capacity = workers * config.endpoints["embed"].max_batch_size / (batch_ms / 1000)
    round_trip_ms = flow.get('sf_scheduler_flow_round_trip_seconds{endpoint="embed"}', 0) * 1000
    quiet_unloaded = p99_ms(unloaded, QUIET_ORG)
    quiet = p99_ms(loaded, QUIET_ORG)
    bound = quiet_unloaded + 2 * batch_ms + round_trip_ms
    missing = sum(o.status != "ok" for o in loaded.outcomes) + args.burst - burst.ok
    quiet_results = results_ms(g for it, g in zip(loaded_items, loaded.results, strict=True)
                                if it.request.org == QUIET_ORG)
    stages = stage_times(quiet_results)
    print(stage_line(stages, label=f"{workers} worker(s), {QUIET_ORG} under the burst"))
    # The quiet requests that took longer than the bound, and where that time went.
    usual = usual_stage_ms(results_ms(unloaded.results))
    late_got = late_requests(loaded.outcomes, loaded.results, {QUIET_ORG: bound})
    late = [request_stages(r, ms) for r, ms in late_got]
    excess = excess_by_stage(late, usual)
    after = sent_after(late_got, burst.first_created_s)
    print(excess_line(excess, len(late), label=f"{workers} worker(s), {QUIET_ORG} over the bound")
          + sent_line(after))
    # What went through admission's backlog topic (docs/load.md: its cost to a quiet org).
    written = sum(m.get("sf_admission_backlog_written_total", 0) for m in admission)
    read_back = sum(m.get("sf_admission_backlog_read_total", 0) for m in admission)
    print(f"{workers} worker(s): {written:,.0f} requests written to admission's backlog topic, "
          f"{read_back:,.0f} read back")
    ramp_ms, gaps_ms = burst.idle_ms if workers == 1 and burst.idle_ms else (None, None)
    if ramp_ms is not None:
        print(f"1 worker: the model not running the burst in its span of {span * 1000:,.0f} ms: "
              f"{ramp_ms:,.0f} ms before its first call, {gaps_ms:,.0f} ms between its calls")
    return {"stages_p99_ms": {k: sorted(v)[int(0.99 * (len(v) - 1))] if v else None
                              for k, v in stages.items()},
            "workers": workers, "busy": busy_s / (workers * span), "served_rps": burst.ok / span,
            "capacity_rps": capacity, "quiet_p99_ms": quiet, "quiet_unloaded_p99_ms":
            quiet_unloaded, "batch_ms": batch_ms, "round_trip_ms": round_trip_ms,
            "bound_ms": bound, "burst": args.burst, "burst_in_flight": args.burst_in_flight,
            "not_ok": missing, "span_s": span,
            "quiet_not_ok": sum(o.status != "ok" for o in loaded.outcomes if o.org == QUIET_ORG),
            "quiet_unloaded_not_ok": sum(o.status != "ok" for o in unloaded.outcomes
                                         if o.org == QUIET_ORG),
            "idle_ramp_ms": ramp_ms, "idle_gaps_ms": gaps_ms,
            "backlog_written": written, "backlog_read": read_back,
            "over_bound": {"requests": len(late), "excess_ms": excess,
                           "sent_after_burst_s": after}}


def quiet_within(r: dict) -> bool:
    """The quiet org's p99 (misses counted) within a bound made of finite figures."""
    return math.isfinite(r["bound_ms"]) and r["quiet_p99_ms"] <= r["bound_ms"]


async def amain(args) -> dict:
    kafka = settings_from_args(args)
    args.embedded = kafka.bootstrap is None
    results = {}
    async with kafka_connected(kafka) as kafka:
        for w in args.workers:
            results[str(w)] = await one(kafka, args, w)
    print(f"fake model at {args.ms_per_token} ms per padded token (one H200, MiniLM-shaped), "
          f"requests of {args.tokens} tokens, burst {args.burst:,} + {QUIET_ORG} at "
          f"{args.quiet_rps:g}/s; each service its own process"
          + (f"; the burst's client keeps {args.burst_in_flight:,} in flight"
             if args.burst_in_flight else ""))
    print(f"{'workers':>8}{'busy':>8}{'served/s':>10}{'capacity/s':>12}{'batch ms':>10}"
          f"{'round trip':>11}{'quiet p99':>11}{'unloaded':>10}{'bound':>8}  verdict")
    for r in results.values():
        verdict = ("busy >= 0.9" if r["busy"] >= 0.9 else "BUSY < 0.9") + ", " + (
            "quiet within bound" if quiet_within(r) else "QUIET OVER BOUND")
        print(f"{r['workers']:>8}{r['busy']:>8.2f}{r['served_rps']:>10,.0f}"
              f"{r['capacity_rps']:>12,.0f}{r['batch_ms']:>10.1f}{r['round_trip_ms']:>11.1f}"
              f"{r['quiet_p99_ms']:>11.0f}{r['quiet_unloaded_p99_ms']:>10.0f}"
              f"{r['bound_ms']:>8.0f}  {verdict}; not ok: {r['not_ok']}")
    print("bound = quiet unloaded p99 + 2 x batch + 1 round trip; busy = model seconds / "
          "(workers x the burst's span)")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 worker, burst 8,000")
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")],
                        default=None, help="worker counts to run, e.g. 1,2 (default)")
    parser.add_argument("--burst", type=int, default=None, help="default 20,000 (quick 8,000)")
    parser.add_argument("--tokens", type=int, default=60, help="tokens per request")
    parser.add_argument("--ms-per-token", type=float, default=0.004,
                        help="fake model time per padded token (H200: 0.0035-0.004)")
    parser.add_argument("--burst-in-flight", type=int, default=None, metavar="N",
                        help="the bursting org's client keeps at most N requests sent and "
                             "not answered (`replay --max-in-flight`); default: all at once")
    parser.add_argument("--quiet-rps", type=float, default=20.0, help="the quiet org's rate")
    parser.add_argument("--quiet-s", type=float, default=6.0,
                        help="how long the quiet org sends, in each phase")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    args.workers = args.workers or ([1] if args.quick else [1, 2])
    args.burst = args.burst or (8_000 if args.quick else 20_000)
    return run_quietly(amain, args)


if __name__ == "__main__":
    main()

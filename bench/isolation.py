"""Isolation on a multi-org trace: a burst must not become any quiet org's latency.

Twelve quiet orgs send a steady mix (Poisson arrivals, token counts drawn
from a long-tailed distribution, the shape of production embedding traffic)
for ``--seconds``; one org bursts ``--burst`` requests of 256 tokens at
once, five seconds in, from a process and a producer of its own (another
team's service: one shared producer made the quiet orgs' sends wait behind
the burst's in the client itself). The trace is replayed through the pipeline as
deployed (admission, scheduler and a worker each in its own process, on the
embedded broker) with a fake model at GPU-like speed (2 ms + 0.01 ms per
padded token), three times: without the burst, with it, and with a burst
``--factor`` times larger.

What must hold, per quiet org: its p99 with a burst <= its p99 without +
three full-batch times (the batches a worker may hold ahead of it, and its
own), where a full batch is the run's own fitted batch time
(:func:`traffic.replay_outcomes.fit_batch_time`) at ``max_batch_tokens``.
Ingress is keyed by org, and an org whose key lands on the bursting org's
partition used to wait behind the whole burst at admission; so each
**layout** (``--layouts``) names the quiet orgs afresh, and every layout
puts some of them on the bursting org's ingress partition. The table marks
those orgs (``shares``). ``--shape-org-per-s R`` runs admission with
``shape_org_per_s = R`` (``producer/shaping.py``; off by default). Admission
paces as deployed (``pace_backlog_s``, ``producer/pacing.py``); to measure
without it, run with ``SF_ADMISSION_PACE_BACKLOG_S=0`` in the environment
(the services inherit it), and without pacing before the first measured
rate only, ``SF_ADMISSION_PACE_COLD_BATCHES=0``.

Prints per layout and org: p99 without / with the burst / with the larger
burst, the margin to the bound, and the quiet orgs' stage split (p99) under
each burst; then, for the quiet requests that took longer than their org's
bound, where that time went: each stage's time beyond its p50 without the
burst, summed over them (``over_bound`` in the JSON), and when they were
sent, in seconds after the burst's first request (``sent_after_burst_s``).
``--json OUT`` writes the figures. Exit 1 if any org is over.

Run: ``python bench/isolation.py`` (two layouts, bursts of 5,000 and 20,000;
a few minutes on 2 cores); ``--quick`` (one layout, 2,000 and 8,000).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.processes import ProcessStack
from bench.burst import start_burst
from bench.sustained import peak_rss_mib, reset_peak
from plumbing.kafka import (
    EMBEDDED_SESSION_ENV,
    KafkaSettings,
    add_kafka_arguments,
    kafka_connected,
    settings_from_args,
)
from plumbing.logs import configure_logging
from plumbing.outbox import partition_for_key
from plumbing.topics import delete_topics, describe_topics
from schemas.build import Built, build_config
from schemas.messages import Request
from tokens.counting import WhitespaceTokenCounter
from traffic.replay import ReplaySettings, replay
from traffic.replay_outcomes import (
    fit_batch_time,
    late_requests,
    results_ms,
    sent_after,
    sent_line,
)
from traffic.replay_sources import ReplayItem
from traffic.stages import (
    excess_by_stage,
    excess_line,
    percentile_ms,
    request_stages,
    stage_line,
    stage_times,
    usual_stage_ms,
)
from traffic.textsynth import TextSynth

__all__ = ["main"]

BURST_ORG = "bulkcorp"
MODEL = "fake:ms_per_batch=2,ms_per_token=0.01"
INGRESS_PARTITIONS = 16


def bench_config(prefix: str, quiet: list[str], max_batch_size: int = 64) -> Built:
    """One embed endpoint, the quiet orgs and the bursting org in one tier."""
    return build_config(
        prefix=prefix, ingress_partitions=INGRESS_PARTITIONS, heartbeat_ms=250,
        state_interval_ms=100, tiers=["standard"],
        # A bulk job accepts minutes of queueing: the scheduler, not the throttle, is measured.
        endpoints={"embed": {"quantum": 2048, "max_batch_tokens": 4096, "max_batch_size": max_batch_size,
                             "max_request_tokens": 2048, "latency_target_ms": 600000}},
        orgs=dict.fromkeys([*quiet, BURST_ORG], "standard"))


def layout(seed: int, n: int = 12, sharing: int = 4) -> list[str]:
    """``n`` quiet org names, ``sharing`` of them on the bursting org's ingress partition."""
    home = partition_for_key(BURST_ORG.encode(), INGRESS_PARTITIONS)
    rng = random.Random(seed)
    same, other = [], []
    while len(same) < sharing or len(other) < n - sharing:
        name = f"org-{rng.randrange(10**6):06d}"
        (same if partition_for_key(name.encode(), INGRESS_PARTITIONS) == home else other)\
            .append(name)
    return same[:sharing] + other[:n - sharing]


def trace(quiet: list[str], seconds: float, rate: float, seed: int) -> list[ReplayItem]:
    """Poisson arrivals per quiet org, long-tailed token counts."""
    rng = random.Random(seed)
    synth = TextSynth(WhitespaceTokenCounter())
    out: list[ReplayItem] = []
    for org in quiet:
        t = rng.expovariate(rate)
        i = 0
        while t < seconds:
            tokens = max(8, min(256, int(rng.lognormvariate(3.8, 0.6))))
            rid = f"{org}-{i}"
            out.append(ReplayItem(ts=t, tokens=tokens, request=Request(
                id=rid, org=org, endpoint="embed", input=synth.make_input("embed", tokens, rid))))
            t += rng.expovariate(rate)
            i += 1
    return sorted(out, key=lambda it: it.ts)


def _bursts(text: str) -> list[tuple[str, int, int]]:
    """``--bursts``: (label, requests, tokens) per item of ``N[:TOKENS],...``."""
    out = []
    for item in text.split(","):
        n, _, tokens = item.strip().partition(":")
        try:
            size, per = int(n), int(tokens or 256)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r}: a burst is N or N:TOKENS, two integers") from None
        if size < 1 or per < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: both must be >= 1")
        out.append((f"+{size:,}" + (f":{per}" if tokens else ""), size, per))
    return out


def p99_by_org(run) -> dict[str, float | None]:
    """Each org's p99 latency (ms) over ALL its requests: one not ``ok`` (refused,
    expired, missing) counts as a miss, an infinite latency, never as left out (left
    out, a quiet request that never came back would improve its org's p99)."""
    lat: dict[str, list[float]] = {}
    for o in run.outcomes:
        ok = o.status == "ok" and o.completed_s is not None
        lat.setdefault(o.org, []).append(
            (o.completed_s - o.arrival_s) * 1000 if ok else math.inf)
    return {org: percentile_ms(v, 99) for org, v in lat.items()}


async def one_layout(kafka: KafkaSettings, args, seed: int) -> dict:
    quiet = layout(seed)
    home = partition_for_key(BURST_ORG.encode(), INGRESS_PARTITIONS)
    prefix = f"iso{uuid.uuid4().hex[:6]}."
    built = bench_config(prefix, quiet, args.max_batch_size)
    text, config = built.text, built.config
    env = {"SF_LOG_LEVEL": "WARNING"}
    if args.shape_org_per_s:
        env["SF_ADMISSION_SHAPE_ORG_PER_S"] = str(args.shape_org_per_s)
    if args.embedded:
        env |= EMBEDDED_SESSION_ENV
    runs = {}
    burst_runs: dict[str, dict[str, int]] = {}
    burst_began: dict[str, float | None] = {}
    burst_twice: dict[str, int] = {}
    #: The burst's first request sent and last result, seconds into the quiet traffic.
    burst_span: dict[str, list[float | None]] = {}
    #: Each service's peak resident memory (MiB) in each run.
    peaks: dict[str, dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(text)
        try:
            async with ProcessStack(path, kafka.require_bootstrap(), endpoints=["embed"],
                                    model=MODEL, env=env,
                                    extra_args={"admission": ["--token-counter", "fake"]}) as st:
                settings = ReplaySettings(timeout_s=180, progress=False, samples=False,
                                          lead_s=1.0)
                await replay(kafka, config, trace(quiet, 2, args.rate, seed), settings)
                for label, burst, tokens in (("none", 0, 0), *args.bursts):
                    items = trace(quiet, args.seconds, args.rate, seed)
                    for proc, _ in st.procs.values():
                        reset_peak(proc.pid)
                    child = None
                    began_s = time.time()
                    if burst:
                        # Five seconds into the quiet traffic, however long its requests
                        # take to build (a million: a minute or more).
                        child = start_burst(kafka.require_bootstrap(), text, org=BURST_ORG,
                                            burst=burst, tokens=tokens, delay_s=2.0,
                                            timeout_s=args.burst_timeout_s,
                                            # A bulk job's client: its results come in
                                            # minutes, and a long reply topic is listed
                                            # further in a longer fetch on the embedded
                                            # broker (docs/reliability.md).
                                            fetch_max_wait_ms=max(500,
                                                                  kafka.fetch_max_wait_ms),
                                            reply_partitions=8,
                                            max_in_flight=args.burst_in_flight)
                        began_s = await child.ready() - settings.lead_s - 5.0
                        await asyncio.sleep(max(0.0, began_s - time.time()))
                    run = await replay(kafka, config, items, settings)
                    if child is not None:
                        got = await child.outcome()
                        burst_runs[label], burst_began[label] = got.statuses, got.first_created_s
                        burst_twice[label] = got.twice
                        burst_span[label] = [
                            None if t is None else round(t - began_s - settings.lead_s, 1)
                            for t in (got.first_created_s, got.last_completed_s)]
                    shared = {o for o in quiet
                              if partition_for_key(o.encode(), INGRESS_PARTITIONS) == home}
                    split = {k: [g for g in results_ms(run.results)
                                 if (g[0].org in shared) == (k == "sharing")]
                             for k in ("sharing", "others")}
                    runs[label] = (run, {k: stage_times(v) for k, v in split.items()})
                    peaks[label] = {name: peak_rss_mib(proc.pid)
                                    for name, (proc, _) in st.procs.items()}
        finally:
            await delete_topics(kafka, await describe_topics(kafka, prefix))
    fits = [f for r, _ in runs.values()
            if (f := fit_batch_time(g[0] for g in r.results if g is not None))]
    fit = max(fits, key=lambda f: f["batches"])
    full_ms = fit["overhead_ms"] + fit["ms_per_token"] * config.endpoints["embed"].max_batch_tokens
    p99 = {label: p99_by_org(r) for label, (r, _) in runs.items()}
    labels = [label for label, _, _ in args.bursts]
    rows = []
    for org in quiet:
        base = p99["none"].get(org)
        bound = None if base is None else base + 3 * full_ms
        worst = max((p99[k].get(org) or math.inf) for k in labels)
        rows.append({"org": org, "shares": partition_for_key(org.encode(), INGRESS_PARTITIONS)
                     == home, "p99_none_ms": base,
                     "p99_ms": {k: p99[k].get(org) for k in labels}, "bound_ms": bound,
                     # A miss in the baseline makes no bound: not within.
                     "within": bound is not None and math.isfinite(bound) and worst <= bound})
    bounds = {r["org"]: r["bound_ms"] for r in rows}
    late_got = {label: late_requests(runs[label][0].outcomes, runs[label][0].results, bounds)
                for label in labels}
    late = {label: [request_stages(r, ms) for r, ms in got] for label, got in late_got.items()}
    after = {label: sent_after(got, burst_began.get(label)) for label, got in late_got.items()}
    usual = usual_stage_ms(results_ms(runs["none"][0].results))
    excess = {label: excess_by_stage(v, usual) for label, v in late.items()}
    not_ok = {label: sum(o.status != "ok" for o in r.outcomes) for label, (r, _) in runs.items()}
    not_ok |= {f"{label} (bursting org)": sum(n for st, n in statuses.items() if st != "ok")
               for label, statuses in burst_runs.items()}
    return {"seed": seed, "shape_org_per_s": args.shape_org_per_s,
            "burst_in_flight": args.burst_in_flight, "full_batch_ms": full_ms,
            "peak_rss_mb": peaks, "burst_span_s": burst_span, "bursts": [[label, n, t] for label, n, t in args.bursts],
            "fit": fit, "orgs": rows, "not_ok": not_ok,
            "twice": {f"{label} (bursting org)": n for label, n in burst_twice.items()}
            | {label: r.stats["duplicate_results"] + r.stats["delivered_twice"]
               for label, (r, _) in runs.items()},
            "stages": {f"{label}, {k}": stage_line(st[k], label=f"{label}, {k}")
                       for label, (_, st) in runs.items() for k in ("sharing", "others")},
            "over_bound": {label: {"requests": len(late[label]), "excess_ms": excess[label],
                                   "sent_after_burst_s": after[label],
                                   "line": excess_line(excess[label], len(late[label]),
                                                       label=f"over the bound, {label}")
                                   + sent_line(after[label])}
                           for label in late}}


async def amain(args) -> list[dict]:
    kafka = settings_from_args(args)
    args.embedded = kafka.bootstrap is None
    out = []
    async with kafka_connected(kafka) as kafka:
        for seed in range(1, args.layouts + 1):
            out.append(await one_layout(kafka, args, seed))
    def ms(x):
        return "-" if x is None else f"{x:,.0f}"

    if args.shape_org_per_s:
        print(f"\nadmission shapes each org to {args.shape_org_per_s:g} records/s")
    if args.burst_in_flight:
        print(f"\nthe bursting org's client keeps at most {args.burst_in_flight:,} requests "
              "in flight")
    for lay in out:
        print(f"\nlayout {lay['seed']}: full batch {lay['full_batch_ms']:.1f} ms (fit "
              f"{lay['fit']['overhead_ms']:.2f} ms + {lay['fit']['ms_per_token']:.5f} ms/token, "
              f"{lay['fit']['batches']} batches); not ok: {lay['not_ok']}; twice: {lay['twice']}")
        labels = [label for label, _, _ in args.bursts]
        print(f"{'org':<12}{'shares':>7}{'p99 none':>10}"
              + "".join(f"{label:>10}" for label in labels)
              + f"{'bound':>8}{'margin':>9}  verdict")
        for r in lay["orgs"]:
            worst = max(v or 0 for v in r["p99_ms"].values())
            margin = None if r["bound_ms"] is None else r["bound_ms"] - worst
            print(f"{r['org']:<12}{'yes' if r['shares'] else '':>7}{ms(r['p99_none_ms']):>10}"
                  + "".join(f"{ms(r['p99_ms'][label]):>10}" for label in labels)
                  + f"{ms(r['bound_ms']):>8}{ms(margin):>9}  {'ok' if r['within'] else 'OVER'}")
        for label, (first, last) in lay["burst_span_s"].items():
            print(f"  burst {label}: first sent {first} s into the quiet traffic "
                  f"({args.seconds:g} s of it), last served at {last} s")
        for label, peaks in lay["peak_rss_mb"].items():
            print(f"  peak RSS (MiB), {label}: "
                  + ", ".join(f"{k} {v:,.0f}" for k, v in peaks.items() if v is not None))
        for line in lay["stages"].values():
            print(" ", line)
        for over in lay["over_bound"].values():
            print(" ", over["line"])
    bad = [(lay["seed"], r["org"]) for lay in out for r in lay["orgs"] if not r["within"]]
    print("\nbound: p99 without the burst + 3 full batches; "
          + ("every quiet org within it" if not bad else f"OVER for {bad}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one layout, bursts 2,000 / 8,000")
    parser.add_argument("--bursts", type=_bursts, default=None,
                        help="comma-separated burst sizes, each N or N:TOKENS (tokens per "
                             "request, default 256); default 5000,20000 (quick 2000,8000); "
                             "for a million, short requests keep a run within minutes: "
                             "5000,100000:64,1000000:8")
    parser.add_argument("--max-batch-size", type=int, default=64,
                        help="the endpoint's max_batch_size: 256 keeps a million short "
                             "requests to ~4,000 batches, within what the embedded broker "
                             "lists per partition (docs/reliability.md)")
    parser.add_argument("--burst-timeout-s", type=float, default=300.0,
                        help="how long the bursting org waits for its last result")
    parser.add_argument("--burst-in-flight", type=int, default=None, metavar="N",
                        help="the bursting org's client keeps at most N requests sent and "
                             "not answered (a bulk job's client, `replay --max-in-flight`); "
                             "default: the whole burst at once")
    parser.add_argument("--layouts", type=int, default=None, help="default 2 (quick 1)")
    parser.add_argument("--seconds", type=float, default=20.0, help="quiet traffic, per run")
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s per quiet org")
    parser.add_argument("--shape-org-per-s", type=float, default=0.0,
                        help="admission's shape_org_per_s (producer/shaping.py); default 0: off")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    args.bursts = args.bursts or _bursts("2000,8000" if args.quick else "5000,20000")
    args.layouts = args.layouts or (1 if args.quick else 2)
    configure_logging("WARNING")
    out = asyncio.run(amain(args))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    within = all(r["within"] for lay in out for r in lay["orgs"])
    # Nothing lost, nothing twice: the bursting org too (its latency target is minutes).
    whole = all(n == 0 for lay in out for n in (*lay["not_ok"].values(), *lay["twice"].values()))
    return 0 if within and whole else 1


if __name__ == "__main__":
    sys.exit(main())

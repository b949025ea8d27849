"""Sustained load: a busy fleet on a bursty multi-org trace, live and simulated.

Why (issue 49, "Sustained load"): under long high load the model should be
what limits, and express batches should cost nothing when the fleet is busy.
Measured there on 2 cores: at about 80 % of the fake model's capacity the
busiest org (a third of the traffic) had a p99 of 5.4 s live with express
batches on, 4.9 s with them off, against 1.5 s in ``simulate`` at the model's
nominal speed. This bench makes that measurement repeatable.

**The trace**: twelve orgs for ``--seconds`` (default 60), one of them
(``busy``) a third of the requests, the other eleven (``light-01`` ..
``light-11``) the rest in Zipf-like shares. Each org sends in bursts: it
alternates between on periods (mean 1 s, at 2.5 times its mean rate) and
off periods (mean 2 s, at a quarter of its mean rate), Poisson within each,
so the offered load swings above the model's capacity for seconds at a time
with no single large burst. Tokens per request are long-tailed
(log-normal, median ~45) between 8 and 256. It is built as
:class:`traffic.trace.TraceRecord` lines (``serving-fairness trace`` has no
such scenario); ``--keep DIR`` writes each load's trace and configuration,
so ``serving-fairness simulate --config DIR/config.toml --trace
DIR/trace-80.jsonl --overhead-ms 2 --ms-per-token 0.01`` reruns a simulated
run and ``serving-fairness replay`` a live one.

**Load**: ``--loads`` percentages (default 50, 80, 95) of the fake model's
capacity for this trace's token mix, as the worker runs it: requests/s it
serves in full batches (``max_batch_size`` requests or ``max_batch_tokens``,
whichever comes first) cut into the worker's micro-batches
(:func:`worker.microbatch.plan_microbatches`, 32 texts / 4,096 padded
tokens, the scheduler's order sorted by windows of 32, cut where a call
more costs less than the padding it saves at the call's worth the worker
learns, ``CALL_TOKENS``) at 2 ms per call + 0.01 ms per padded token. On
this mix that pads about 1.26x (2.3x before 2026-12-07, when each call was
filled to its budget: ``SF_WORKER_MICROBATCH_CALL_TOKENS=0`` runs the worker
that way, but the capacity, and so the offered load, stays the new one), so
the simulator at the same nominal speed, which charges a batch's real tokens
in one call, has about 1.5 times that capacity (2.4 before): both are
printed. ``--loads 52.17`` offers what ``--loads 80`` offered before the
change (about 605 requests/s).

**The model**: ``fake:ms_per_batch=2,ms_per_token=0.01`` (issue 49's
setting, ``bench/isolation.py``'s), one endpoint, one tier, a latency target
of ``--target-ms`` (10 minutes) so that nothing is throttled.

Each load runs these ways (``--modes``) on the same trace:

* ``live_on`` / ``live_off``: the pipeline as deployed (admission, scheduler
  and one worker each a process of its own, :class:`app.processes.ProcessStack`,
  on an embedded broker started afresh for the run), the trace sent at its
  pace by :func:`traffic.replay.replay` after the trace's first ``--warm-s``
  seconds as a warm-up; ``off`` runs the services with
  ``SF_SCHEDULER_EXPRESS_BATCHES=false``;
* ``sim_on`` / ``sim_off``: :func:`traffic.simulate.simulate` with the
  settings ``serving-fairness simulate --overhead-ms 2 --ms-per-token 0.01
  [--no-express]`` builds (1 worker, 1 slot, no calibration: a pipeline that
  adds nothing);
* ``simpad_on`` / ``simpad_off``: the same at 0.01 ms x the mix's padding
  per token, a rough stand-in for the fake as the worker pads (a small
  batch pads less than a full one).

Printed per load and mode: mean batch fill (tokens / ``max_batch_tokens``,
:func:`traffic.report.summarize`), the share of batches that were express,
tokens served per second of model time (live: the results' ``inference_ms``
summed; simulated: each batch's service time), the model's busy share of the
run's span (first send to last result), the busiest org's p99 and the worst
light org's, requests not ``ok``, and each process's peak resident memory
(``VmHWM``, started afresh for the run where Linux lets it: the bench's own
process holds the replay's client; the broker is Tansu). Then every org's
p99 per load, and the two ratios issue 49's "Done when" names at 80 %:
``express_ratio_80`` = the busiest org's live p99 with express on / off
(target <= 1.10) and ``live_vs_sim_80`` = its live p99 with express on / its
``sim_on`` p99 (target <= 2); ``live_vs_sim_off_80`` pairs ``live_off`` with
``sim_off``, ``live_vs_simpad_80`` ``live_on`` with ``simpad_on``. A p99
counts a request not ``ok`` as infinite. Each run records the load average
(1, 5, 15 min) before and after it.

``--json OUT`` writes ``loads.<pct>.{capacity_rps, sim_capacity_rps,
padding, offered_rps, requests, <mode>.{busiest_p99_ms, worst_light_p99_ms,
worst_light_org, express_share, batch_fill, tokens_per_model_s, model_busy,
batches, not_ok, org_p99_ms, loadavg}}`` (live modes also ``peak_rss_mib``
by process, ``send_lag_p99_ms``, ``busiest_stages_p99_ms``: the busiest
org's p99 per stage, :mod:`traffic.stages`, also printed with its p50, and
``light_stages_p99_ms``: the same over the light orgs' requests together,
and ``model_calls`` / ``joined_calls``: the worker's model calls, the
warm-up's included, and those in which an express batch's call rode in the
call waiting next, :class:`worker.model_thread.Joinable`) and
the four ratios above (None where a run they need is not among ``--loads`` /
``--modes``).

Run: ``python bench/sustained.py`` (three loads of 60 s: about 10 minutes on
2 cores); ``--loads 80`` for one; ``--quick`` (80 % for 4 s, for the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.processes import ProcessStack
from bench.figures import run_quietly
from bench.scrape import scrape
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import (
    EMBEDDED_SESSION,
    EMBEDDED_SESSION_ENV,
    KafkaSettings,
    add_kafka_arguments,
    settings_from_args,
)
from plumbing.service_settings import SchedulerSettings
from plumbing.settings import from_env
from plumbing.topics import delete_topics, describe_topics
from scheduler.service import ENV_PREFIX as SCHEDULER_ENV
from schemas.build import Built, build_config
from schemas.config import Endpoint
from tokens.counting import WhitespaceTokenCounter
from traffic.percentile import percentile
from traffic.replay import ReplaySettings, replay
from traffic.replay_outcomes import results_ms
from traffic.replay_sources import items_from_trace
from traffic.report import Outcome, summarize
from traffic.simulate import ServiceModel, SimSettings, simulate
from traffic.stages import stage_line, stage_times
from traffic.textsynth import TextSynth
from traffic.trace import TraceRecord, write_trace
from worker.microbatch import padded_tokens, plan_microbatches

__all__ = ["bursty_trace", "capacity_rps", "main"]

OVERHEAD_MS, MS_PER_TOKEN = 2.0, 0.01
MODEL = f"fake:ms_per_batch={OVERHEAD_MS:g},ms_per_token={MS_PER_TOKEN:g}"
BUSY = "busy"
LIGHT = [f"light-{k:02d}" for k in range(1, 12)]
#: The busiest org's share of the requests; the light orgs share the rest.
BUSY_SHARE = 1 / 3
#: Bursts: on periods at this multiple of an org's mean rate, off periods at
#: OFF_RATE of it, lasting these many seconds on average.
ON_RATE, OFF_RATE, ON_S, OFF_S = 2.5, 0.25, 1.0, 2.0
#: The worker's micro-batches (plumbing.service_settings: microbatch_size, _tokens).
MICRO_SIZE, MICRO_TOKENS = 32, 4096
#: What the worker learns a call of the fake is worth in padded tokens
#: (worker/call_cost.py): its fixed 2 ms over 0.01 ms a token. The worker cuts
#: a batch where a call more costs less than the padding it saves.
CALL_TOKENS = OVERHEAD_MS / MS_PER_TOKEN
MODES = ("live_on", "live_off", "sim_on", "sim_off", "simpad_on", "simpad_off")


def bench_config(prefix: str, target_ms: int) -> Built:
    """One embed endpoint (``bench/isolation.py``'s), every org in one tier."""
    return build_config(
        prefix=prefix, heartbeat_ms=250, state_interval_ms=100, tiers=["standard"],
        endpoints={"embed": {"quantum": 2048, "max_batch_tokens": 4096, "max_batch_size": 64,
                             "max_request_tokens": 2048, "latency_target_ms": target_ms}},
        orgs=dict.fromkeys([BUSY, *LIGHT], "standard"))


def draw_tokens(rng: random.Random) -> int:
    """One request's tokens: log-normal (median ~45), 8 to 256."""
    return max(8, min(256, int(rng.lognormvariate(3.8, 0.6))))


def capacity_rps(tokens: Sequence[int], ep: Endpoint) -> dict[str, float]:
    """Requests/s the fake model serves of this token mix in full scheduler batches:
    ``live``, each batch cut into the worker's micro-batches and timed as the fake
    times them (padded to each micro-batch's longest text); ``sim``, one model call
    per batch on its real tokens, as :class:`traffic.simulate.ServiceModel` times it.
    ``padding``: the padded tokens over the real ones."""
    batches: list[list[int]] = [[]]
    for t in tokens:
        b = batches[-1]
        if b and (len(b) >= ep.max_batch_size or sum(b) + t > ep.max_batch_tokens):
            batches.append(b := [])
        b.append(t)
    live_s = sim_s = 0.0
    padded = 0
    service = ServiceModel(OVERHEAD_MS, MS_PER_TOKEN)
    for b in batches:
        plan = plan_microbatches(b, max_padded_tokens=MICRO_TOKENS, max_size=MICRO_SIZE,
                                 order="given", call_tokens=CALL_TOKENS)
        pad = padded_tokens(plan, b)
        padded += pad
        live_s += (len(plan) * OVERHEAD_MS + MS_PER_TOKEN * pad) / 1000
        sim_s += service.batch_s(sum(b))
    return {"live": len(tokens) / live_s, "sim": len(tokens) / sim_s,
            "padding": padded / sum(tokens)}


def org_rates(rps: float) -> dict[str, float]:
    """Mean requests/s per org: ``busy`` a third, the light orgs Zipf-like shares of the rest."""
    weights = [1 / (k ** 0.8) for k in range(1, len(LIGHT) + 1)]
    rest = rps * (1 - BUSY_SHARE)
    return {BUSY: rps * BUSY_SHARE} | {org: rest * w / sum(weights)
                                       for org, w in zip(LIGHT, weights, strict=True)}


def bursty_trace(rps: float, seconds: float, seed: int) -> list[TraceRecord]:
    """Twelve orgs at ``rps`` requests/s in all, each on/off bursty (module docstring).

    Each org's on and off periods are drawn first, then its two rates scaled so
    that its mean over the trace is its share of ``rps`` exactly (60 s hold
    only some twenty periods: left to chance, the load would miss its mark by
    10 %)."""
    rng = random.Random(seed)
    duty = ON_S / (ON_S + OFF_S)
    out: list[TraceRecord] = []
    for org, mean in org_rates(rps).items():
        periods: list[tuple[float, float, bool]] = []
        t, on = 0.0, rng.random() < duty
        while t < seconds:
            end = min(seconds, t + rng.expovariate(1 / (ON_S if on else OFF_S)))
            periods.append((t, end, on))
            t, on = end, not on
        weight = sum((b - a) * (ON_RATE if on else OFF_RATE) for a, b, on in periods)
        i = 0
        for a, b, on in periods:
            rate = mean * seconds * (ON_RATE if on else OFF_RATE) / weight
            at = a + rng.expovariate(rate)
            while at < b:
                out.append(TraceRecord(ts=round(at, 6), org=org, endpoint="embed",
                                       tokens=draw_tokens(rng), id=f"{org}-{i}"))
                i += 1
                at += rng.expovariate(rate)
    out.sort(key=lambda r: r.ts)
    return out


# -- what a run's outcomes say ------------------------------------------------------------


def p99_by_org(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """Each org's p99 (ms) over all its requests; one not ``ok`` counts as infinite."""
    lat: dict[str, list[float]] = {}
    for o in outcomes:
        lat.setdefault(o.org, []).append(
            o.latency_s * 1000 if o.latency_s is not None else math.inf)
    return {org: percentile(v, 99) for org, v in sorted(lat.items())}


def figures(outcomes: Sequence[Outcome], model_s: float) -> dict[str, Any]:
    """The per-mode figures of one run (``model_s``: the model's seconds for it)."""
    summary = summarize(outcomes)
    b = summary["batches"]
    p99 = p99_by_org(outcomes)
    light = {o: v for o, v in p99.items() if o != BUSY}
    worst = max(light, key=lambda o: light[o]) if light else None
    tokens = sum(o.tokens for o in outcomes if o.status == "ok")
    span = summary["makespan_s"]
    return {"busiest_p99_ms": p99.get(BUSY), "worst_light_org": worst,
            "worst_light_p99_ms": light.get(worst), "batches": b["count"],
            "express_share": b["express"] / b["count"] if b["count"] else 0.0,
            "batch_fill": b["mean_fill"], "tokens_per_model_s": tokens / model_s if model_s
            else None, "model_busy": model_s / span if span else None,
            "not_ok": summary["totals"]["requests"] - summary["totals"]["completed"],
            "org_p99_ms": p99}


def simulated(built: Built, records: Sequence[TraceRecord], express: bool,
              ms_per_token: float = MS_PER_TOKEN) -> dict[str, Any]:
    """The trace through the core on a virtual clock, as ``serving-fairness simulate
    --overhead-ms 2 --ms-per-token 0.01 [--no-express]`` runs it, its express batches
    filled and held back as the live scheduler's (``SF_SCHEDULER_EXPRESS_FILL``,
    ``SF_SCHEDULER_EXPRESS_HORIZON`` where set)."""
    live = from_env(SchedulerSettings, env_prefix=SCHEDULER_ENV)
    service = ServiceModel(OVERHEAD_MS, ms_per_token)
    result = simulate(built.config, records, SimSettings(
        policy="drr", workers=1, slots=1, service=service, express=express,
        express_fill=live.express_fill, express_horizon=live.express_horizon))
    batch_tokens = {o.batch_id: o.batch_tokens for o in result.outcomes
                    if o.batch_id is not None and o.batch_tokens is not None}
    return figures(result.outcomes, sum(service.batch_s(t) for t in batch_tokens.values()))


# -- live -----------------------------------------------------------------------------------


def peak_rss_mib(pid: int | None) -> float | None:
    """A process's peak resident memory (``VmHWM``) in MiB; None where it cannot be read."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def reset_peak(pid: int) -> bool:
    """Start ``pid``'s peak resident memory afresh (Linux ``clear_refs`` 5); False if not."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextlib.asynccontextmanager
async def broker_for(kafka: KafkaSettings) -> AsyncIterator[tuple[KafkaSettings, int | None]]:
    """The given cluster, or an embedded broker of this run's own (its pid for its memory)."""
    if kafka.bootstrap is not None:
        yield kafka, None
        return
    async with EmbeddedBroker() as broker:
        yield msgspec.structs.replace(kafka, bootstrap=broker.bootstrap,
                                      **EMBEDDED_SESSION), broker.pid


async def live(kafka: KafkaSettings, records: Sequence[TraceRecord], express: bool,
               args) -> dict[str, Any]:
    """The trace through the pipeline as processes (express batches on or off)."""
    own_reset = reset_peak(os.getpid())
    load_before = os.getloadavg()
    async with broker_for(kafka) as (connected, broker_pid):
        kafka = connected
        built = bench_config(f"sus{uuid.uuid4().hex[:6]}.", args.target_ms)
        synth = TextSynth(WhitespaceTokenCounter())
        items = items_from_trace(records, built.config, lambda _ep: synth)
        warm = [it for it in items if it.ts < args.warm_s]
        env = {"SF_LOG_LEVEL": "WARNING"}
        if broker_pid is not None:
            env |= EMBEDDED_SESSION_ENV
        if not express:
            env["SF_SCHEDULER_EXPRESS_BATCHES"] = "false"
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.toml"
            path.write_text(built.text)
            try:
                async with ProcessStack(path, kafka.require_bootstrap(), endpoints=["embed"],
                                        model=MODEL, env=env, extra_args={
                                            "admission": ["--token-counter", "fake"]}) as st:
                    settings = ReplaySettings(timeout_s=args.timeout_s, progress=False,
                                              samples=False, lead_s=1.0)
                    await replay(kafka, built.config, warm, settings)
                    run = await replay(kafka, built.config, items, settings)
                    rss = {name: peak_rss_mib(proc.pid) for name, (proc, _) in st.procs.items()}
                    worker = await asyncio.to_thread(scrape, st.procs["worker-embed"][1])
            finally:
                await delete_topics(kafka, await describe_topics(kafka, built.config.service
                                                                 .topic_prefix))
        rss["broker"] = peak_rss_mib(broker_pid)
    rss["bench (replay client)"] = peak_rss_mib(os.getpid()) if own_reset else None
    model_s = sum(g[0].inference_ms or 0.0 for g in run.results
                  if g is not None and g[0].status == "ok") / 1000
    out = figures(run.outcomes, model_s)
    out["peak_rss_mib"] = rss
    out["loadavg"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    out["send_lag_p99_ms"] = run.stats["send_lag_ms"]["p99"]
    # The worker's model calls (the warm-up's included), and those an express
    # batch's call rode in (worker/model_thread.py's Joinable).
    out["model_calls"] = int(worker.get('sf_worker_inference_seconds_count{endpoint="embed"}', 0))
    out["joined_calls"] = int(worker.get('sf_worker_joined_calls_total{endpoint="embed"}', 0))
    # Where the busiest org's time went, stage by stage (the stamps its results carry).
    stages = stage_times(results_ms(g for it, g in zip(items, run.results, strict=True)
                                    if it.request.org == BUSY))
    out["busiest_stages_p99_ms"] = {k: percentile(v, 99) for k, v in stages.items()}
    out["busiest_stage_line"] = stage_line(stages, label=BUSY)
    # And the light orgs' together: what a tenant below its share waits for.
    stages = stage_times(results_ms(g for it, g in zip(items, run.results, strict=True)
                                    if it.request.org != BUSY))
    out["light_stages_p99_ms"] = {k: percentile(v, 99) for k, v in stages.items()}
    out["light_stage_line"] = stage_line(stages, label="light orgs")
    return out


# -- the runs and the table --------------------------------------------------------------


async def amain(args) -> dict[str, Any]:
    kafka = settings_from_args(args)
    built = bench_config("sus.", args.target_ms)
    ep = built.config.endpoints["embed"]
    mix = random.Random(args.seed + 1)
    cap = capacity_rps([draw_tokens(mix) for _ in range(20_000)], ep)
    capacity = cap["live"]
    loads: dict[str, dict[str, Any]] = {}
    for load in args.loads:
        rps = capacity * load / 100
        records = bursty_trace(rps, args.seconds, args.seed)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / "config.toml").write_text(built.text)
            write_trace(args.keep / f"trace-{load:g}.jsonl", records)
        row: dict[str, Any] = {"capacity_rps": capacity, "sim_capacity_rps": cap["sim"],
                               "padding": cap["padding"], "requests": len(records),
                               "offered_rps": len(records) / args.seconds}
        for mode in args.modes:
            t0 = time.monotonic()
            express = mode.endswith("_on")
            if mode.startswith("sim"):
                # simpad: the fake's padding on this mix charged as more time per token.
                per_token = MS_PER_TOKEN * (cap["padding"] if mode.startswith("simpad") else 1)
                row[mode] = simulated(built, records, express, per_token)
                row[mode]["loadavg"] = [round(x, 2) for x in os.getloadavg()]
            else:
                row[mode] = await live(kafka, records, express, args)
            print(f"{load:g} %, {mode}: {len(records):,} requests, busiest p99 "
                  f"{row[mode]['busiest_p99_ms']:,.0f} ms ({time.monotonic() - t0:.0f} s, "
                  f"load average {' '.join(map(str, row[mode]['loadavg']))})", flush=True)
        loads[f"{load:g}"] = row
    out: dict[str, Any] = {"seconds": args.seconds, "model": MODEL, "seed": args.seed,
                           "loads": loads}
    r80 = loads.get("80", {})

    def ratio(a: str, b: str) -> float | None:
        x, y = r80.get(a, {}).get("busiest_p99_ms"), r80.get(b, {}).get("busiest_p99_ms")
        return x / y if x is not None and y else None

    out["express_ratio_80"] = ratio("live_on", "live_off")
    out["live_vs_sim_80"] = ratio("live_on", "sim_on")
    out["live_vs_sim_off_80"] = ratio("live_off", "sim_off")
    out["live_vs_simpad_80"] = ratio("live_on", "simpad_on")
    print_table(out, args)
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else "inf" if math.isinf(x) else f"{x:,.0f}"


def print_table(out: dict[str, Any], args) -> None:
    first = next(iter(out["loads"].values()))
    print(f"\n{MODEL}, 1 worker; {args.seconds:g} s of a bursty 12-org trace per run ({BUSY} "
          f"a third); capacity for this token mix: {first['capacity_rps']:,.0f} requests/s "
          f"as the worker runs the fake (padded {first['padding']:.2f}x), "
          f"{first['sim_capacity_rps']:,.0f} in the simulator at nominal speed (unpadded); "
          f"simpad: the simulator at {MS_PER_TOKEN:g} x {first['padding']:.2f} ms per token")
    print(f"{'load':>5} {'mode':<11}{'req/s':>7}{'fill':>6}{'express':>8}{'tok/model-s':>12}"
          f"{'busy':>6}{'busiest p99':>12}{'worst light p99':>22}{'not ok':>7}  peak RSS MiB")
    for load, row in out["loads"].items():
        for mode in args.modes:
            r = row[mode]
            fill = "-" if r["batch_fill"] is None else f"{r['batch_fill']:.2f}"
            tps = "-" if r["tokens_per_model_s"] is None else f"{r['tokens_per_model_s']:,.0f}"
            busy = "-" if r["model_busy"] is None else f"{r['model_busy']:.2f}"
            rss = ", ".join(f"{k.split(' ')[0]} {v:.0f}" for k, v in
                            r.get("peak_rss_mib", {}).items() if v is not None)
            light = f"{_ms(r['worst_light_p99_ms'])} ({r['worst_light_org']})"
            print(f"{load + ' %':>5} {mode:<11}{row['offered_rps']:>7,.0f}{fill:>6}"
                  f"{100 * r['express_share']:>7.0f}%{tps:>12}{busy:>6}"
                  f"{_ms(r['busiest_p99_ms']):>12}{light:>22}{r['not_ok']:>7}  {rss}")
    for load, row in out["loads"].items():
        for mode in args.modes:
            for key in ("busiest_stage_line", "light_stage_line"):
                if line := row[mode].get(key):
                    print(f"{load} %, {mode}: {line}")
            if calls := row[mode].get("model_calls"):
                joined = row[mode]["joined_calls"]
                print(f"{load} %, {mode}: {calls:,} model calls (the warm-up's included), "
                      f"{joined:,} of them an express batch's call joined to the next "
                      f"({100 * joined / calls:.0f} %)")
    for load, row in out["loads"].items():
        orgs = list(row[args.modes[0]]["org_p99_ms"])
        print(f"\np99 ms per org at {load} %: " + " ".join(f"{m:>10}" for m in args.modes))
        for org in orgs:
            print(f"  {org:<22}" + " ".join(f"{_ms(row[m]['org_p99_ms'].get(org)):>10}"
                                            for m in args.modes))

    def show(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    print(f"\nat 80 %: busiest p99 live express on / off = {show(out['express_ratio_80'])} "
          f"(target <= 1.10); live / simulated (express on) = {show(out['live_vs_sim_80'])} "
          f"(target <= 2; express off: {show(out['live_vs_sim_off_80'])}; against the "
          f"simulation charged for padding: {show(out['live_vs_simpad_80'])})")
    print("fill: batch tokens / max_batch_tokens; express: share of batches; tok/model-s: "
          "tokens served per second of model time; busy: model time / the run's span")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="80 %% for 4 s (a smoke run)")
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")],
                        default=None, help="percentages of capacity (default 50,80,95)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="trace length per run (default 60, quick 4)")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES),
                        help=f"which runs (default {','.join(MODES)})")
    parser.add_argument("--warm-s", type=float, default=None,
                        help="the trace's first seconds replayed before each live run "
                             "(default 3, quick 1)")
    parser.add_argument("--target-ms", type=int, default=600_000,
                        help="the endpoint's latency target (long: nothing throttled)")
    parser.add_argument("--timeout-s", type=float, default=180.0,
                        help="after the last send, how long a live run waits for results")
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--keep", type=Path, help="write each load's trace and the config here")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    args.loads = args.loads or ([80.0] if args.quick else [50.0, 80.0, 95.0])
    args.seconds = args.seconds or (4.0 if args.quick else 60.0)
    args.warm_s = args.warm_s if args.warm_s is not None else (1.0 if args.quick else 3.0)
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"--modes: unknown {sorted(unknown)}; known: {', '.join(MODES)}")
    return run_quietly(amain, args)


if __name__ == "__main__":
    main()

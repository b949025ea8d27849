"""Added latency: what the scheduler adds to a request's time at 50 % of capacity.

Why: fairness must not cost latency. At moderate load a request should
reach the worker almost as soon as both it and a free worker exist.
Target: the scheduler's added latency at most 5 ms at p50.

Setup: admission, the scheduler and one worker in this process
(:class:`app.stack.Stack`) on the embedded broker (or ``--bootstrap``);
the fake model with a fixed service time (``--service-ms``, default 20 ms
per call) and ``max_batch_size = 1``, so each request is one batch and the
worker's capacity is ``1000 / service_ms`` requests/s. Requests arrive as a
Poisson process at ``--load`` (default 0.5) of that capacity from five
orgs, sent on schedule by :func:`traffic.replay.replay`.

Per request, on one clock (this process's ``time.time()``), recorded by
wrapping the scheduler core's ``push``/``next_batch`` and the model's
``encode``:

- ``avail``: the scheduler took the request from its tier topic;
- ``dispatch``: the scheduler put it in a batch;
- ``start``/``end``: the worker's model call on it (``end - start`` is the
  worker's own time);
- ``free``: when the worker finished its previous call.

**Scheduler added** = ``start - max(avail, free)``: from the moment the
request could have started (the scheduler has it *and* the worker is free)
to the moment it did: the scheduler's decision, the batch's Kafka hop and
the worker's fetch. Waiting for a busy worker is unavoidable and not
counted. Also printed: end-to-end latency (send to result) against the
worker's own time, and the parts ``dispatch - avail`` and ``start -
dispatch``.

Run: ``python bench/latency.py`` (2 rounds of 1,000 requests, ~90 s) or
``--quick`` (2 rounds of 300).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.stack import Stack
from bench.figures import run_quietly
from plumbing.kafka import add_kafka_arguments, kafka_connected, settings_from_args
from plumbing.topics import delete_topics, describe_topics
from schemas.build import build_config
from schemas.config import Config
from schemas.messages import EmbedInput, Request
from traffic.replay import ReplaySettings, replay
from traffic.replay_sources import ReplayItem
from traffic.report import percentile

__all__ = ["main"]

ORGS = ("org-a", "org-b", "org-c", "org-d", "org-e")


def bench_config(prefix: str) -> Config:
    """One tier, the five orgs, one request a batch, a latency target no load here reaches."""
    return build_config(prefix=prefix, worker_slots=2, tiers=["standard"],
                        endpoints={"embed": {"max_batch_size": 1, "latency_target_ms": 3600000}},
                        orgs=dict.fromkeys(ORGS, "standard")).config


class Probe:
    """Timestamps per request id from the scheduler core and the worker's model.

    Each wrapper passes on every argument it is given: a keyword added to
    what it wraps must not break it (two did, ``next_batch``'s
    ``in_run_order`` and ``encode``'s ``options``, and the bench died with
    every request missing).
    """

    def __init__(self, stack: Stack):
        self.avail: dict[str, float] = {}
        self.dispatch: dict[str, float] = {}
        self.calls: dict[str, tuple[float, float, float]] = {}  # id -> (free, start, end)
        self._free = 0.0
        core = stack.scheduler.core
        push, next_batch = core.push, core.next_batch

        def probed_push(endpoint, entry, **kw):
            self.avail.setdefault(entry.id, entry.arrival)
            return push(endpoint, entry, **kw)

        def probed_next_batch(endpoint, now, **kw):
            d = next_batch(endpoint, now, **kw)
            for e in d.batch:
                self.dispatch[e.id] = now
            return d

        core.push, core.next_batch = probed_push, probed_next_batch
        model = stack.workers[0].model
        encode = model.encode

        def probed_encode(texts, **kw):
            start = time.time()
            try:
                return encode(texts, **kw)
            finally:
                end = time.time()
                for t in texts:  # each text starts with its request id
                    self.calls[t.split()[0]] = (self._free, start, end)
                self._free = end

        model.encode = probed_encode


def poisson_items(n: int, rate: float, run_id: str, seed: int) -> list[ReplayItem]:
    rng = random.Random(seed)
    t = 0.0
    items = []
    for i in range(n):
        items.append(ReplayItem(ts=round(t, 6), tokens=4, request=Request(
            id=f"q{i}", org=ORGS[i % len(ORGS)], endpoint="embed",
            input=EmbedInput(texts=(f"{run_id}-{i} some words here",)))))
        t += rng.expovariate(rate)
    return items


def pct(xs: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max in ms; None for each with no data (never 0.0, which looks "met")."""
    xs = sorted(xs)
    return {k: None if (v := percentile(xs, q)) is None else round(1000 * v, 2)
            for k, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))}


async def amain(args: argparse.Namespace) -> dict:
    n = args.requests or (300 if args.quick else 1000)
    capacity = 1000.0 / args.service_ms
    rate = args.load * capacity
    kafka = settings_from_args(args)
    rows: dict[str, list[float]] = {k: [] for k in
                                    ("added", "added_idle", "added_busy", "e2e", "own",
                                     "e2e_minus_own", "hold", "hop", "busy_wait")}
    per_round: list[float] = []
    async with kafka_connected(kafka) as kafka:
        prefix = f"benchl{uuid.uuid4().hex[:6]}."
        config = bench_config(prefix)
        try:
            async with Stack(config, kafka, model=f"fake:ms_per_batch={args.service_ms}",
                             endpoints=["embed"]) as stack:
                probe = Probe(stack)
                for r in range(args.repeat):
                    run_id = f"lat{r}"
                    items = poisson_items(n, rate, run_id, args.seed + r)
                    run = await replay(kafka, config, items, ReplaySettings(
                        run_id=run_id, timeout_s=60, progress=False, samples=False))
                    bad = [o for o in run.outcomes if o.status != "ok"]
                    if bad:  # a probe out of step with what it wraps kills a service
                        died = stack.failed()
                        raise RuntimeError(f"{len(bad)} requests not ok, e.g. {bad[0]}" + (
                            f"; a service's loop died of: {died!r}" if died else ""))
                    added_round = []
                    for wire, o in zip(run.wire_ids, run.outcomes, strict=True):
                        avail, disp = probe.avail[wire], probe.dispatch[wire]
                        free, start, end = probe.calls[wire]
                        added = start - max(avail, free)
                        added_round.append(added)
                        rows["added"].append(added)
                        rows["own"].append(end - start)
                        rows["e2e"].append(o.completed_s - o.arrival_s)
                        rows["e2e_minus_own"].append(o.completed_s - o.arrival_s - (end - start))
                        rows["hold"].append(disp - avail)
                        rows["hop"].append(start - disp)
                        rows["busy_wait"].append(max(0.0, free - avail))
                        rows["added_busy" if free > avail else "added_idle"].append(added)
                    per_round.append(pct(added_round)["p50"])
        finally:
            await delete_topics(kafka, await describe_topics(kafka, prefix))
    figures = {name: pct(xs) for name, xs in rows.items()}
    busy = sum(1 for x in rows["busy_wait"] if x > 0) / max(1, len(rows["busy_wait"]))
    print(f"{args.repeat} rounds x {n:,} requests, Poisson at {rate:.1f}/s = {args.load:.0%} of "
          f"capacity ({capacity:.0f}/s: fake model {args.service_ms:g} ms per call, one request "
          f"per batch, 1 worker x 2 slots); {busy:.0%} arrived while the worker was busy")
    print(f"{'ms':<52}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}")
    labels = [
        ("worker's own time (model call)", "own"),
        ("end to end (send -> result)", "e2e"),
        ("end to end minus the worker's own time", "e2e_minus_own"),
        ("scheduler added: start - max(avail, worker free)", "added"),
        ("  for requests that found the worker idle", "added_idle"),
        ("  for requests that found it busy", "added_busy"),
        ("  part: avail -> dispatch (incl. waiting for a slot)", "hold"),
        ("  part: dispatch -> model start (Kafka hop, fetch)", "hop"),
        ("unavoidable: waiting for a busy worker", "busy_wait"),
    ]
    def ms(x: float | None) -> str:
        return f"{'-':>8}" if x is None else f"{x:>8.2f}"

    for label, key in labels:
        f = figures[key]
        print(f"{label:<52}{ms(f['p50'])}{ms(f['p90'])}{ms(f['p99'])}{ms(f['max'])}")
    p50 = figures["added"]["p50"]
    if p50 is None:
        print("scheduler added: NO DATA, target NOT CHECKED")
    else:
        e2e, own = figures["e2e"]["p50"], figures["own"]["p50"]
        print(f"scheduler added p50 {p50:.2f} ms (target <= 5 ms: "
              f"{'met' if p50 <= 5 else 'NOT met'}); per round "
              f"{', '.join('-' if x is None else f'{x:.2f}' for x in per_round)} ms; "
              f"end-to-end p50 / own p50: "
              f"{'-' if not own else f'{e2e / own:.2f}x'}")
    figures.update(requests=n, rounds=args.repeat, rate=rate, capacity=capacity,
                   busy_share=busy, per_round_added_p50=per_round)
    return figures


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="rounds of 300 requests")
    parser.add_argument("--requests", type=int, default=None, help="per round (default 1,000)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--service-ms", type=float, default=20.0,
                        help="fake model time per call (default 20 ms)")
    parser.add_argument("--load", type=float, default=0.5, help="share of capacity (default 0.5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    return run_quietly(amain, args)


if __name__ == "__main__":
    main()

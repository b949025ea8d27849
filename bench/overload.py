"""Offer ten times the pipeline's capacity and check that overload is refused, not queued.

The services run as processes (admission, scheduler, one worker) on an
embedded broker, with a fake model whose cost is known: ``--ms-per-token``
per padded token, so one worker serves about ``1000 / ms_per_token``
tokens a second. A :class:`~producer.client.FairnessClient` offers
``--factor`` times that (in requests of ``--words`` + 1 tokens, three orgs
in turn) for ``--seconds``. What must hold, and is printed:

* every request gets one terminal result (nothing left waiting), counted by
  id: none unanswered, none whose submit failed, none handed over twice, no
  result for an id never sent;
* the scheduler's held requests (its ``scheduler-state`` snapshots) stay
  bounded by ``max_held_requests`` plus one fetch: beyond it admission
  refuses with ``overloaded``;
* accepted requests finish within the endpoint's latency target at p99:
  the throttle refuses (``throttled``) what it predicts could not. The
  three orgs share one tier: across tiers strict priority lets a higher
  tier's later arrivals delay a lower tier's admitted requests past the
  target, which no admission-time prediction can foresee (see
  ``docs/reliability.md``);
* every refusal carries a reason and a retry-after;
* the scheduler's memory stays flat (its RSS, sampled every second).

The bounds are checked on samples, and the samples are counted: the held
requests (``held_samples``, one per snapshot in the overload), the RSS
(``rss_samples``); whether the warm-up saw a measured rate
(``warmup_rate_measured``), and what ended the followers
(``side_errors``: an exception there is reported, not swallowed).

Before the overload, ``--warmup-s`` at the nominal capacity: overload hits a
running pipeline whose service rate is measured (on a cold one, with no rate
yet, the throttle admits up to ``max_held_requests`` at once).

Run: ``python bench/overload.py`` (60 s of overload, about 1.5 min on 2
cores; ``--json`` writes the figures). The CI test runs ``--seconds 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiokafka.structs import TopicPartition

from app.processes import ProcessStack
from bench.figures import write_json
from bench.loadgen import Load, percentile, rss_mib
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import EMBEDDED_SESSION_ENV, KafkaSettings, make_consumer
from producer.client import FairnessClient
from schemas.build import Built, build_config
from schemas.codec import codec_for
from schemas.messages import SchedulerState
from traffic.stages import stage_line, stage_times

__all__ = ["ONE_FETCH", "config", "main", "passed", "run"]

#: The scheduler's max_poll_records: how far one fetch can overshoot ``max_held_requests``.
ONE_FETCH = 500


def config(*, max_held: int, ms_per_token: float, target_ms: int) -> Built:
    """One tier, three orgs, one worker of the fake model at ``ms_per_token``."""
    return build_config(
        prefix="overload.", max_held_requests=max_held, worker_slots=2, worker_timeout_ms=3000,
        heartbeat_ms=250, state_interval_ms=100, tier_partitions=4, ingress_partitions=4,
        results_partitions=1,
        endpoints={"embed": {"model": f"fake:ms_per_token={ms_per_token},ms_per_batch=2",
                             "quantum": 256, "max_batch_tokens": 256, "max_batch_size": 32,
                             "max_request_tokens": 256, "latency_target_ms": target_ms,
                             "partitions": 2}},
        orgs=dict.fromkeys(["acme", "initech", "quiet"], "free"))


_state_codec = codec_for(SchedulerState)


async def _follow_state(kafka: KafkaSettings, topic: str, held: list[tuple[float, int]],
                        rates: list[tuple[float, float, float]], stop: asyncio.Event) -> None:
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while not stop.is_set():
            got = await consumer.getmany(tp, timeout_ms=200)
            for rec in got.get(tp, []):
                st = _state_codec.decode_record(rec.value, rec.headers)
                held.append((time.monotonic(), st.held_requests))
                lane = st.lanes.get("embed")
                if lane is not None:
                    rates.append((time.monotonic(), lane.tokens_per_s, lane.hops_ms))
    finally:
        await consumer.stop()


async def _sample_rss(pid: int, out: list[tuple[float, float]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        if (r := rss_mib(pid)) is not None:
            out.append((time.monotonic(), r))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def run(*, seconds: float = 60.0, factor: float = 10.0, ms_per_token: float = 2.0,
              words: int = 12, max_held: int = 300, target_ms: int = 2000,
              warmup_s: float = 3.0, drain_s: float = 120.0, log=None, say=print) -> dict:
    """The scenario; returns its figures."""
    tokens = words + 1
    capacity_rps = 1000.0 / ms_per_token / tokens  # one worker, full batches, no padding
    rate = factor * capacity_rps
    figures: dict = {"tokens": tokens, "seconds": seconds, "factor": factor, "capacity_rps": round(capacity_rps, 1),
                     "offered_rps": round(rate, 1), "max_held_requests": max_held,
                     "latency_target_ms": target_ms}
    built = config(max_held=max_held, ms_per_token=ms_per_token, target_ms=target_ms)
    held: list[tuple[float, int]] = []
    rates: list[tuple[float, float, float]] = []
    rss: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "overload.toml"
        cfg_path.write_text(built.text)
        env = EMBEDDED_SESSION_ENV
        async with EmbeddedBroker() as broker:
            kafka = KafkaSettings(bootstrap=broker.bootstrap, client_id="overload-bench")
            stack = ProcessStack(cfg_path, broker.bootstrap, endpoints=["embed"], env=env, log=log)
            await stack.start(timeout_s=180)
            say(f"pipeline up; offering {rate:.0f} requests/s for {seconds:g} s "
                f"({factor:g}x the nominal {capacity_rps:.1f}/s)")
            stop = asyncio.Event()
            side = [asyncio.create_task(_follow_state(kafka, built.config.service.topic_prefix
                                                      + "scheduler-state", held, rates,
                                                      stop)),
                    asyncio.create_task(_sample_rss(stack.pid("scheduler"), rss, stop))]
            async with FairnessClient(kafka, built.config) as client:
                load = Load(client, ["acme", "initech", "quiet"], capacity_rps, words=words,
                            phase="warmup").start()
                t_up = time.monotonic()
                try:
                    await asyncio.sleep(warmup_s)
                    # Until the scheduler has measured its service rate (at most 30 s).
                    for _ in range(300):
                        if rates and rates[-1][1] > 0:
                            break
                        await asyncio.sleep(0.1)
                    figures["warmup_rate_measured"] = bool(rates and rates[-1][1] > 0)
                    figures["warmup_s"] = round(time.monotonic() - t_up, 1)
                    load.rate, load.phase = rate, "overload"
                    t0 = time.monotonic()
                    await asyncio.sleep(seconds)
                    load.stop_sending()
                    t_end = time.monotonic()
                    figures["drained"] = await load.drain(drain_s)
                    figures["drain_s"] = round(time.monotonic() - t_end, 1)
                finally:
                    await load.close()
                    stop.set()
                    ended = await asyncio.gather(*side, return_exceptions=True)
                    figures["side_errors"] = [repr(e) for e in ended if e is not None]
            figures["failed_process"] = stack.failed()
            await stack.stop()
    _figures(figures, load, held, rss, t0, t_end)
    during = [r for t, r, _ in rates if t0 <= t <= t_end]
    figures["measured_tokens_per_s_p50"] = round(percentile(during, 50) or 0)
    hops = [h for t, _, h in rates if t0 <= t <= t_end]
    figures["hops_ms_p50"] = round(percentile(hops, 50) or 0, 1)
    return figures


def _figures(f: dict, load: Load, held, rss, t0: float, t_end: float) -> None:
    sent = [o for o in load.sent.values() if o.phase == "overload"]
    f["warmup_sent"] = sum(1 for o in load.sent.values() if o.phase == "warmup")
    f["sent"] = len(sent)
    tally = load.tally()  # both phases, by id
    f["unanswered"] = len(tally.lost) + len(tally.submit_failed)
    f["submit_failed"] = len(tally.submit_failed)
    f["duplicated"] = len(tally.duplicated)
    f["foreign"] = sum(tally.foreign.values())
    f["by_id"] = tally.line()
    f["submit_errors"] = dict(load.submit_errors)
    by = Counter()
    refusals_without = 0
    for o in sent:
        r = o.result
        if r is None:
            continue
        by[f"{r.status}:{r.reason}" if r.reason else r.status] += 1
        if r.status == "rejected" and (not r.reason or not r.retry_after_ms):
            refusals_without += 1
    f["results"] = dict(by)
    f["refusals_without_reason_or_retry_after"] = refusals_without
    ok = [o.latency_s * 1000 for o in sent if o.result is not None and o.result.status == "ok"]
    f["accepted"] = len(ok)
    f["served_rps"] = round(len(ok) / max(1e-9, t_end - t0), 1)
    f["ok_latency_ms"] = {q: round(v) for q in (50, 99, 100)
                          if (v := percentile(ok, q)) is not None}
    f["ok_over_target"] = sum(1 for x in ok if x > f["latency_target_ms"])
    stamped = [(o.result, o.sent_ms + (o.done_s - o.sent_s) * 1000) for o in sent
               if o.result is not None and o.result.status == "ok"]
    f["ok_stages"] = stage_line(stage_times(stamped), label="accepted requests, per stage")
    lag = [(o.submitted_s - o.sent_s) * 1000 for o in sent if o.submitted_s is not None]
    f["submit_lag_ms"] = {q: round(v) for q in (50, 99) if (v := percentile(lag, q)) is not None}
    firsts = sorted((max(0.0, o.sent_s - t0), o.latency_s) for o in sent
                    if o.result is not None and o.result.status == "ok")
    f["ok_latency_by_second"] = {}
    for at, lat in firsts:
        f["ok_latency_by_second"].setdefault(int(at), []).append(lat)
    f["ok_latency_by_second"] = {k: round(max(v), 2) for k, v in f["ok_latency_by_second"].items()}
    retry = [o.result.retry_after_ms for o in sent if o.result is not None
             and o.result.status == "rejected" and o.result.retry_after_ms]
    f["retry_after_ms"] = {q: percentile(retry, q) for q in (50, 99)} if retry else {}
    during = [n for t, n in held if t0 <= t <= t_end]
    f["held_samples"] = len(during)
    f["held_max"] = max(during, default=None)
    f["held_p50"] = percentile(during, 50)
    mem = [r for t, r in rss if t0 <= t <= t_end]
    f["rss_samples"] = len(mem)
    if mem:
        half = mem[len(mem) // 2:]
        f["scheduler_rss_mib"] = {"start": round(mem[0], 1), "max": round(max(mem), 1),
                                  "end": round(mem[-1], 1),
                                  "second_half_growth": round(max(half) - half[0], 1)}


def report(f: dict) -> str:
    return "\n".join([
        (f"offered                  {f['sent']} requests in {f['seconds']:g} s "
         f"({f['offered_rps']}/s, {f['factor']:g}x the nominal {f['capacity_rps']}/s)"),
        f"results                  {f['results']}",
        f"unanswered               {f['unanswered']} (drained in {f.get('drain_s')} s)",
        f"counted by id            {f['by_id']}; submit errors {f['submit_errors']}",
        f"refusals w/o reason      {f['refusals_without_reason_or_retry_after']}",
        f"retry-after (ms)         p50/p99 {f['retry_after_ms']}",
        (f"accepted latency (ms)    {f['ok_latency_ms']} (target {f['latency_target_ms']}; "
         f"{f['ok_over_target']} of {f['accepted']} over it); served {f['served_rps']}/s"),
        (f"held requests            max {f['held_max']}, p50 {f['held_p50']} "
         f"(max_held_requests {f['max_held_requests']}; {f['held_samples']} snapshots)"),
        (f"scheduler RSS (MiB)      {f.get('scheduler_rss_mib')} ({f['rss_samples']} samples)"),
        (f"warm-up                  {f.get('warmup_s')} s, rate measured: "
         f"{f.get('warmup_rate_measured')}; follower errors: {f.get('side_errors')}"),
        (f"service rate             {f.get('measured_tokens_per_s_p50')} tokens/s measured "
         f"(p50 of the snapshots); served {round(f['served_rps'] * (f.get('tokens') or 0))}; "
         f"hops after admission {f.get('hops_ms_p50')} ms (p50 of the snapshots)"),
        f"client submit lag (ms)   {f.get('submit_lag_ms')}",
        f.get("ok_stages", ""),
        f"worst ok latency by send second {f.get('ok_latency_by_second')}",
        f"process died             {f['failed_process']}",
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="overload duration (default 60)")
    p.add_argument("--factor", type=float, default=10.0, help="offered / capacity (default 10)")
    p.add_argument("--ms-per-token", type=float, default=2.0,
                   help="the fake model's cost per padded token (default 2.0)")
    p.add_argument("--max-held", type=int, default=300, help="service.max_held_requests")
    p.add_argument("--target-ms", type=int, default=2000, help="endpoint latency_target_ms")
    p.add_argument("--json", default=None, help="write the figures to this file")
    p.add_argument("--log-file", default=None, help="keep the services' JSON logs here")
    args = p.parse_args(argv)
    with open(args.log_file or os.devnull, "w") as log:
        figures = asyncio.run(run(seconds=args.seconds, factor=args.factor,
                                  ms_per_token=args.ms_per_token, max_held=args.max_held,
                                  target_ms=args.target_ms, log=log))
    print(report(figures))
    write_json(args.json, figures)
    return 0 if passed(figures) else 1


def passed(f: dict) -> bool:
    """One terminal result per request, counted by id, and the bounds checked on samples."""
    return (f["drained"] and f["unanswered"] == 0 and f["submit_failed"] == 0
            and f["duplicated"] == 0 and f["foreign"] == 0 and not f["side_errors"]
            and f["held_samples"] > 0 and f["held_max"] <= f["max_held_requests"] + ONE_FETCH
            and f["refusals_without_reason_or_retry_after"] == 0)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

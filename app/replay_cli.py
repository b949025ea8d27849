"""``serving-fairness replay``: the command line around :func:`traffic.replay.replay`.

See :mod:`traffic.replay` for what a replay does; this module parses the
flags, loads the items (a traffic log or a topic window), starts the
pipeline in-process when no cluster is given, and writes the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from plumbing.kafka import (
    KafkaSettings,
    add_kafka_arguments,
    kafka_connected,
    settings_from_args,
)
from schemas.config import Config, ConfigError, load_config
from traffic.replay import ReplayRun, ReplaySettings, replay
from traffic.replay_fairness import FairnessSampler, http_metrics
from traffic.replay_outcomes import live_jain, stage_table
from traffic.replay_sources import (
    ReplayError,
    ReplayItem,
    items_from_trace,
    parse_time_ms,
    read_window,
    to_trace,
)
from traffic.report import (
    compare,
    format_table,
    summarize,
    write_report,
)
from traffic.textsynth import TextSynth
from traffic.trace import TraceError, read_trace, write_trace
from worker.fake import is_fake_spec

__all__ = ["add_arguments", "replay_command", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness replay``."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    src = parser.add_argument_group("source (one of)")
    src.add_argument("--trace", help="traffic log (JSON Lines, see `serving-fairness trace`)")
    src.add_argument("--from-topic", metavar="TOPIC",
                     help="re-send the requests this topic holds in [--since, --until]")
    src.add_argument("--since", help="window start: ISO-8601 (no zone = UTC) or epoch seconds")
    src.add_argument("--until", help="window end (inclusive; default: what the topic holds now)")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="pace multiplier: 2 sends twice as fast as recorded (default 1)")
    parser.add_argument("--to-topic", default=None,
                        help="send here instead of the configuration's ingress topic")
    parser.add_argument("--report", metavar="DIR", help="write the report (tables, plots) here")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="after the last send, wait this long for results; the rest are "
                             "reported missing (default 60)")
    parser.add_argument("--max-in-flight", type=int, default=None, metavar="N",
                        help="at most N requests sent and not yet answered: a send past it "
                             "waits for a result (up to --timeout-s), as a bulk job's client "
                             "would, instead of queueing the rest in the ingress topic "
                             "(default: no bound)")
    parser.add_argument("--embedded", action="store_true",
                        help="run admission, scheduler and workers in this process (the "
                             "default when no --bootstrap is given)")
    parser.add_argument("--processes", action="store_true",
                        help="run admission, scheduler and workers as processes of their own, "
                             "as deployed (each worker on CPUs of its own where there are "
                             "enough, as the demo does); logs to services.log in --report")
    parser.add_argument("--model", default=None,
                        help="in-process pipeline: model spec of the workers and admission's "
                             "token counts (fake, fake:ms_per_token=0.28, wheel:...); default: "
                             "each endpoint's model")
    parser.add_argument("--workers", type=int, default=1,
                        help="in-process pipeline: workers per endpoint (default 1)")
    parser.add_argument("--policy", choices=["drr", "fifo"], default="drr",
                        help="in-process pipeline: scheduling policy (default drr)")
    parser.add_argument("--token-counter", default=None, metavar="SPEC",
                        help="count and make up texts with this model spec (default: --model, "
                             "else each endpoint's model, as admission does)")
    parser.add_argument("--compare-simulate", action="store_true",
                        help="also simulate the same traffic, with the pipeline's model fitted "
                             "to this replay (traffic/calibrate.py), and write compare.md")
    parser.add_argument("--sim-uncalibrated", action="store_true",
                        help="simulation: no fitted pipeline, only a batch time per token "
                             "(as before calibration; also when --sim-overhead-ms or "
                             "--sim-ms-per-token is given)")
    parser.add_argument("--sim-overhead-ms", type=float, default=None,
                        help="simulation: fixed time per batch (default: the fake model's "
                             "ms_per_batch, else fitted to the replay's batches)")
    parser.add_argument("--sim-ms-per-token", type=float, default=None,
                        help="simulation: time per token (default: the fake model's "
                             "ms_per_token, else fitted to the replay's batches)")
    parser.add_argument("--sim-no-admission", action="store_true",
                        help="simulation without the admission checks (rate limits, overload, "
                             "throttle); the live pipeline always has them")
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    parser.add_argument("--log-level", default="WARNING",
                        help="log level of the in-process services (default WARNING)")
    add_kafka_arguments(parser)


def _fail(message: str) -> int:
    print(f"serving-fairness replay: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run ``serving-fairness replay``: 0 when every request came back, 1 if some did not."""
    from plumbing.logs import configure_logging

    configure_logging(args.log_level)
    return asyncio.run(replay_command(args))


async def replay_command(args: argparse.Namespace) -> int:
    """The subcommand on a running event loop (for tests); exit codes as :func:`run`."""
    if bool(args.trace) == bool(args.from_topic):
        return _fail("give --trace FILE or --from-topic TOPIC (with --since)")
    if args.from_topic and not args.since:
        return _fail("--from-topic needs --since")
    if args.speed <= 0 or args.workers < 1:
        return _fail("--speed must be > 0 and --workers >= 1")
    try:
        config = load_config(args.config)
        since = parse_time_ms(args.since) if args.since else None
        until = parse_time_ms(args.until) if args.until else None
    except (ConfigError, ValueError) as e:
        return _fail(str(e))
    kafka = settings_from_args(args)
    if args.from_topic and kafka.bootstrap is None:
        return _fail("--from-topic reads a cluster: give --bootstrap (an embedded broker "
                     "starts empty)")
    args.in_process = not args.processes and (args.embedded or kafka.bootstrap is None)
    try:
        return await _main(args, config, kafka, since, until)
    except (ReplayError, TraceError, OSError, TimeoutError) as e:
        return _fail(str(e) or repr(e))


def _counter_spec(args: argparse.Namespace, config: Config, endpoint: str) -> str:
    """The spec admission counts ``endpoint``'s tokens with (see :class:`app.stack.Stack`)."""
    if args.token_counter:
        return args.token_counter
    if args.in_process and args.model and is_fake_spec(args.model):
        return "fake"
    ep = config.endpoints.get(endpoint) or next(iter(config.endpoints.values()))
    return ep.model


async def _load_items(args: argparse.Namespace, config: Config, kafka: KafkaSettings,
                      since: int | None, until: int | None
                      ) -> tuple[list[ReplayItem], str, dict[str, Any] | None]:
    """The items to send, a name for their source, and the token margin (traces)."""
    from tokens.counting import load_token_counter

    synths: dict[str, TextSynth] = {}
    counters: dict[str, Any] = {}

    def synth_for(endpoint: str) -> TextSynth:
        if endpoint not in synths:
            spec = _counter_spec(args, config, endpoint)
            if spec not in counters:
                counters[spec] = load_token_counter(spec)
            ep = config.endpoints.get(endpoint)
            synths[endpoint] = TextSynth(counters[spec], max_texts=ep.max_texts if ep else 64)
        return synths[endpoint]

    t0 = time.perf_counter()
    if args.from_topic:
        assert since is not None, "main refuses --from-topic without --since"
        window = await read_window(kafka, args.from_topic, since, until,
                                   count=lambda r: synth_for(r.endpoint).count(r.input))
        source = f"{args.from_topic} [{args.since}, {args.until or 'now'}]"
        ranges = {p: list(r) for p, r in sorted(window.ranges.items())}
        print(f"{len(window.items)} requests from {source} (offsets per partition {ranges}), "
              f"{len(window.skipped)} records skipped", file=sys.stderr)
        for line in window.skipped[:10]:
            print(f"  skipped {line}", file=sys.stderr)
        return window.items, source, None
    records = read_trace(args.trace)
    items = await asyncio.to_thread(items_from_trace, records, config, synth_for)
    diffs = [synth_for(it.request.endpoint).count(it.request.input) - it.tokens for it in items]
    margin = {"exact": sum(1 for d in diffs if d == 0),
              "max_abs_diff": max((abs(d) for d in diffs), default=0),
              "mean_abs_rel_diff": round(sum(abs(d) / it.tokens for d, it in
                                             zip(diffs, items, strict=True))
                                         / max(1, len(items)), 6)}
    source = Path(args.trace).name
    print(f"{len(items)} requests from {source} over {items[-1].ts if items else 0:.3f} s; "
          f"inputs ready in {time.perf_counter() - t0:.1f} s; admission's token count equals "
          f"the trace's for {margin['exact']}, largest difference {margin['max_abs_diff']}",
          file=sys.stderr)
    return items, source, margin


async def _main(args: argparse.Namespace, config: Config, kafka: KafkaSettings,
                since: int | None, until: int | None) -> int:
    from app.stack import Stack

    if args.processes:
        # Before the embedded broker starts, so that it too stays off the workers' CPUs.
        args.cpus = _pin_workers(config)
    async with kafka_connected(kafka) as live:
        items, source, margin = await _load_items(args, config, live, since, until)
        settings = ReplaySettings(speed=args.speed, to_topic=args.to_topic,
                                  timeout_s=args.timeout_s, progress=not args.no_progress,
                                  max_in_flight=args.max_in_flight)
        if args.processes:
            result = await _replay_in_processes(args, config, live, items, settings)
        elif not args.in_process:
            result = await replay(live, config, items, settings)
        else:
            endpoints = sorted({it.request.endpoint for it in items} & set(config.endpoints))
            print(f"starting the pipeline in-process ({args.workers} worker(s) x "
                  f"{config.service.worker_slots} slot(s) per endpoint, model "
                  f"{args.model or 'of each endpoint'}, policy {args.policy})...",
                  file=sys.stderr)
            async with Stack(config, live, policy=args.policy, model=args.model,
                             workers=args.workers, endpoints=endpoints or None,
                             token_counter=args.token_counter) as stack:
                from prometheus_client import generate_latest

                assert stack.scheduler is not None, "the stack is started"
                registry = stack.scheduler.registry

                async def fetch() -> str:
                    return generate_latest(registry).decode()

                args.live_fairness = FairnessSampler(fetch)
                result = await args.live_fairness.around(replay(live, config, items, settings))
    return _finish(args, config, items, result, source, margin)


async def _replay_in_processes(args: argparse.Namespace, config: Config, kafka: KafkaSettings,
                               items: Sequence[ReplayItem], settings: ReplaySettings) -> ReplayRun:
    """The replay against admission, scheduler and workers started as processes of their own."""
    import contextlib

    from app.processes import ProcessStack

    endpoints = sorted({it.request.endpoint for it in items} & set(config.endpoints))
    cpus = {name: c for name, c in (args.cpus or {}).items()
            if name.removeprefix("worker-") in endpoints} or None
    log_path = Path(args.report) / "services.log" if args.report else None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    pinned = ", ".join(f"{n} on CPUs {sorted(c)}" for n, c in (cpus or {}).items()) or "none"
    print(f"starting the pipeline as processes ({args.workers} worker(s) per endpoint, model "
          f"{args.model or 'of each endpoint'}, policy {args.policy}; pinned: {pinned})...",
          file=sys.stderr)
    assert kafka.bootstrap is not None, "kafka_connected gives an address, embedded or not"
    with contextlib.ExitStack() as files:
        log = files.enter_context(log_path.open("w")) if log_path is not None else None
        async with ProcessStack(args.config, kafka.bootstrap, policy=args.policy,
                                endpoints=endpoints, model=args.model, workers=args.workers,
                                worker_threads=1 if cpus else None, log=log,
                                cpus=cpus) as stack:
            args.live_fairness = FairnessSampler(http_metrics(stack.procs["scheduler"][1]))
            return await args.live_fairness.around(replay(kafka, config, items, settings))


def _pin_workers(config: Config) -> dict[str, set[int]] | None:
    """Each endpoint's worker on a CPU of its own, as the demo pins them; this process (the
    sender, the embedded broker, the other services) on the rest. None: not possible here."""
    import os

    from app.demo import plan_cpus

    plan = plan_cpus(list(config.endpoints), 1)
    if plan is None:
        return None
    cpus, rest = plan
    os.sched_setaffinity(0, rest)
    return cpus


def _write_results(path: Path, results) -> None:
    """Every result received, without vectors and scores: what ``simulate --calibrate`` reads."""
    enc = msgspec.json.Encoder()
    with path.open("wb") as f:
        for got in results:
            if got is None:
                continue
            r = msgspec.structs.replace(got[0], embeddings=None, scores=None, ranking=None)
            f.write(enc.encode(r) + b"\n")


def _sim_service(args: argparse.Namespace, fit: dict[str, float] | None
                 ) -> tuple[float, float, str]:
    """The simulator's batch time: flags, else the fake model's, else fitted to the replay."""
    from worker.fake import parse_fake_spec

    overhead, per_token, how = 5.0, 0.28, "the simulator's default"
    if args.model and is_fake_spec(args.model):
        opts = parse_fake_spec(args.model)
        overhead = float(opts.get("ms_per_batch", 0.0))
        per_token = float(opts.get("ms_per_token", 0.0))
        how = "the fake model's"
    elif fit is not None:
        overhead, per_token = fit["overhead_ms"], fit["ms_per_token"]
        how = f"fitted to the replay's {fit['batches']} batches"
    if args.sim_overhead_ms is not None or args.sim_ms_per_token is not None:
        how = "given"
    if args.sim_overhead_ms is not None:
        overhead = args.sim_overhead_ms
    if args.sim_ms_per_token is not None:
        per_token = args.sim_ms_per_token
    if overhead <= 0 and per_token <= 0:
        overhead = 0.001  # a batch takes some time: the simulator divides by it
    return overhead, per_token, how


def _finish(args: argparse.Namespace, config: Config, items: Sequence[ReplayItem],
            result: ReplayRun, source: str, margin: dict | None) -> int:
    st = result.stats
    jain_index, groups = live_jain(result.outcomes, config)
    meta = {"label": "replay", "source": source, "config": Path(args.config).name,
            "speed": args.speed, "model": args.model or "each endpoint's",
            "pipeline": ("processes" if args.processes else
                         "in-process" if args.in_process else "external"),
            "intended_rate_rps": st["intended_rate_rps"], "achieved_rate_rps":
            st["achieved_rate_rps"], "send_lag_ms": st["send_lag_ms"]}
    if margin is not None:
        meta["token_margin"] = margin
    extra: dict[str, Any] = {"meta": meta, "jain_index": jain_index, "jain": groups,
                             "replay": st}
    sampler = getattr(args, "live_fairness", None)
    if sampler is not None:
        extra["live_fairness"] = sampler.summary()
    if jain_index is None:
        extra["jain_note"] = ("no two orgs of one tier were seen backlogged together across "
                              "3 batches or more")
    summary = summarize(result.outcomes, **extra)
    intended = f"{st['intended_rate_rps']:,.1f}" if st["intended_rate_rps"] else "all at once"
    achieved = f"{st['achieved_rate_rps']:,.1f}" if st["achieved_rate_rps"] else "-"
    print(f"\n## replay: {st['requests']} requests from {source}, speed {args.speed:g}\n")
    print(f"send rate intended {intended} requests/s, achieved {achieved} requests/s "
          f"(span {st['intended_span_s']:.3f} s intended, {st['achieved_span_s']:.3f} s "
          f"achieved; busiest second {st['intended_peak_rps']} intended, "
          f"{st['achieved_peak_rps']} achieved); lateness p50 {st['send_lag_ms']['p50']:.1f} "
          f"ms, p99 {st['send_lag_ms']['p99']:.1f} ms, max {st['send_lag_ms']['max']:.1f} ms\n")
    print(format_table(summary))
    if sampler is not None and sampler.lines():
        print(f"\nlive fairness, as the scheduler measured it (sf_scheduler_fairness_*, "
              f"{sampler.samples} samples every {sampler.every_s:g} s; extremes over the run):\n"
              f"{sampler.lines()}")
    print(f"\np50 ms per stage (admission: sent -> admitted; scheduler: -> in a batch; "
          f"batch: -> done)\n\n{stage_table({'replay': result.outcomes})}")
    compare_text = None
    sim_summary = None
    if args.compare_simulate:
        from traffic.calibrate import (
            CalibratedPipeline,
            fit,
            format_fit,
            observations_from_results,
        )
        from traffic.simulate import PipelineAdmission, ServiceModel, SimSettings, simulate

        overhead, per_token, how = _sim_service(args, st.get("model_fit"))
        pipeline, fitted = None, ""
        if not (args.sim_uncalibrated or how == "given"):
            received = [got[0] for got in result.results or [] if got is not None]
            calibration = fit(observations_from_results(received),
                              flow_control=config.service.flow_control,
                              source="this replay's results")
            fitted = format_fit(calibration)
            print(f"\n## the pipeline's model, fitted\n\n{fitted}")
            pipeline = CalibratedPipeline(calibration, config,
                                          ServiceModel(overhead, per_token), args.policy)
            how = "calibrated: fitted to this replay's results"
        admission = None if args.sim_no_admission else PipelineAdmission(config)
        sim = simulate(config, to_trace(items, args.speed),
                       SimSettings(policy=args.policy, workers=args.workers,
                                   slots=config.service.worker_slots,
                                   service=ServiceModel(overhead, per_token),
                                   admission=admission, pipeline=pipeline))
        sim.meta.update(label="simulate", source=source, service_model=how)
        sim_summary = sim.summary()
        compare_text = compare(summary, sim_summary, labels=("replay", "simulate"))
        model = (how if pipeline is not None
                 else f"{overhead:g} ms + {per_token:g} ms/token per batch ({how})")
        slots = (", ".join(f"{ep} {pipeline.slots(ep) or config.service.worker_slots}"
                           for ep in sorted({it.request.endpoint for it in items}))
                 if pipeline is not None else f"{config.service.worker_slots}")
        compare_text = (
            f"Simulation: {model}, "
            f"{args.workers} worker(s) x {slots} slot(s) per endpoint, "
            f"policy {args.policy}, admission {'off' if admission is None else 'on'}.\n\n"
            + (f"```\n{fitted}\n```\n\n" if fitted else "")
            + compare_text + "\n\np50 ms per stage (admission: sent -> admitted; scheduler: "
            "admitted -> in a batch; batch: -> done; uncalibrated, the simulator admits "
            "instantly)\n\n"
            + stage_table({"replay": result.outcomes, "simulate": sim.outcomes}))
        print(f"\n## replay vs simulate\n\n{compare_text}")
    if args.report:
        out = Path(args.report)
        title = f"Replay: {source}, speed {args.speed:g}"
        write_report(out, result.outcomes, result.samples, title=title, summary=summary)
        with (out / "id_map.jsonl").open("w") as f:
            for wire, (orig, origin) in result.id_map.items():
                f.write(json.dumps({"id": wire, "original_id": orig, "origin": origin}) + "\n")
        (out / "replay.json").write_text(json.dumps(st, indent=2) + "\n")
        _write_results(out / "results.jsonl", result.results or [])
        write_trace(out / "trace.jsonl", to_trace(items, args.speed))
        if compare_text is not None:
            write_report(out / "simulate", sim.outcomes, sim.samples,
                         title=f"Simulated: {source}, speed {args.speed:g}", summary=sim_summary)
            (out / "compare.md").write_text(
                f"# Replay vs simulation: {source}\n\n{compare_text}\n")
        print(f"\nreport written to {out}", file=sys.stderr)
    missing = st["missing"] + st["send_failed"]
    if missing:
        print(f"{st['missing']} requests missing, {st['send_failed']} not sent", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="serving-fairness replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(_p)
    sys.exit(run(_p.parse_args()))

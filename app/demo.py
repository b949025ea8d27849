"""``serving-fairness demo``: the noisy neighbour, live, on a real broker and a real model.

One command, nothing else to start: the embedded broker, admission, the
scheduler and one worker per endpoint running all-MiniLM-L6-v2 from its
PyPI wheel. The same traffic runs in four phases, each on fresh topics:

1. **unloaded**: only the quiet orgs, to measure their latency on an idle system;
2. **burst, drr**: ``bulkcorp`` floods the embed endpoint with ``--burst``
   requests while two quiet orgs of the same tier, an enterprise org, a
   rerank org and a free-tier org send a few;
3. **burst x5, drr**: the same with a burst five times larger;
4. **burst, fifo**: phase 2 under one shared arrival-ordered queue.

The quiet orgs (and the enterprise, rerank and free-tier orgs) send through
the HTTP gateway with API keys made for the run (:mod:`app.demo_gateway`):
OpenAI's ``/v1/embeddings``, Cohere's ``/v2/rerank``; their latency is the
HTTP client's. The bursting org is a bulk job producing to Kafka directly.
``--quiet-via kafka`` sends them to Kafka directly too, as before the gateway.

It prints a per-org table per phase, then the check the design promises:
the quiet orgs' p99 under the burst stays within their unloaded p99 plus two
full-batch service times (the batch running when they arrive, then their
own), does not grow with the burst, and is far below what FIFO gives them.
A full-batch service time is the worker's own: the median model time of
the full batches it finished while the quiet requests were out
(:func:`phase_full_batch_ms`); one batch of ``max_batch_tokens`` of the
burst's texts is also timed at start, in this process, and printed beside it.

Service logs go to ``--log-file`` as JSON lines, with request, org and
batch ids bound; the terminal shows progress and the tables. At the default
``--log-level info`` the file holds one line per batch (sampled under the
burst), per rejection and per failure; ``--log-level debug`` adds one line
per request at each service (``request_admitted``, ``request_served``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from app.demo_burst import burst_main
from app.demo_burst import text as _text
from app.demo_gateway import (
    GatewayTraffic,
    config_with_keys,
    demo_keys,
    gateway_args,
    reply_topic,
)
from plumbing.bounded import within
from plumbing.heap import settle
from plumbing.kafka import EMBEDDED_SESSION, EMBEDDED_SESSION_ENV, KafkaSettings
from schemas.config import Config, ConfigError, load_config
from schemas.messages import Result
from traffic.stages import (
    STAGES,
    excess_by_stage,
    excess_line,
    percentile_ms,
    request_stages,
    span_times,
    stage_line,
    stage_times,
    usual_stage_ms,
)

__all__ = ["add_arguments", "run"]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "demo.toml"
QUIET_ORGS = ("quiet-1", "quiet-2")
#: Every org that sends a few paced requests (all but the bursting one).
PACED_ORGS = (*QUIET_ORGS, "acme", "searchco", "trial-1")
#: The label of the HTTP hop in the quiet orgs' stages: the request's send ->
#: the gateway's ``created_ms`` stamp (the stages of :mod:`traffic.stages` follow).
HTTP_STAGE = "HTTP to the gateway"


@dataclass
class Sent:
    org: str
    tier: str
    endpoint: str
    sent_s: float
    result: Result | None = None
    done_s: float | None = None
    done_ms: float | None = None  # wall clock, to compare with the results' stamps
    #: Wall clock (epoch ms) when the broker acknowledged the request's append.
    acked_ms: float | None = None
    #: Wall clock (epoch ms) of the send: the HTTP request's, through the gateway.
    sent_ms: float | None = None


@dataclass
class Phase:
    name: str
    policy: str
    burst: int
    sent: dict[str, Sent] = field(default_factory=dict)
    elapsed_s: float = 0.0
    #: Wall clock (epoch s) of the phase's traffic: its start and end.
    wall_s: tuple[float, float] | None = None
    #: The paced orgs' HTTP calls, when they went through the gateway.
    gateway: GatewayTraffic | None = None

    def latencies_ms(self, org: str) -> list[float]:
        return [(s.done_s - s.sent_s) * 1000 for s in self.sent.values()
                if s.org == org and s.result is not None and s.result.status == "ok"
                and s.done_s is not None]

    def quiet_ms(self) -> list[float]:
        return [x for org in QUIET_ORGS for x in self.latencies_ms(org)]



def _cpus(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


class Burst:
    """The bursting org, sending from a process of its own (:mod:`app.demo_burst`)."""

    ORG = "bulkcorp"

    def __init__(self, bootstrap: str, config_path: str, n: int, timeout_s: float,
                 nice: int):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=burst_main, name="demo-burst", daemon=True,
                                args=(child, bootstrap, config_path, self.ORG, "embed", n,
                                      timeout_s, nice))
        self.sent = self.done = 0
        self.records: list[tuple] | None = None

    async def start(self) -> None:
        self.proc.start()
        if (await self._next(120.0))[0] != "ready":
            raise RuntimeError("the burst process did not start")

    def go(self) -> None:
        self.conn.send("go")

    async def _next(self, timeout_s: float) -> tuple:
        if not await asyncio.to_thread(self.conn.poll, timeout_s):
            raise RuntimeError(f"the burst process said nothing for {timeout_s:.0f} s")
        return self.conn.recv()

    def poll(self) -> None:
        """Take the progress reports and the final records that have arrived."""
        while self.records is None and self.conn.poll():
            try:
                msg = self.conn.recv()
            except EOFError:  # the pipe closed: the process ended without its records
                self.proc.join(5)
                raise RuntimeError("the burst process ended without its records "
                                   f"(exit code {self.proc.exitcode})") from None
            if msg[0] == "progress":
                self.sent, self.done = msg[1], msg[2]
            elif msg[0] == "done":
                self.records = msg[1]
                self.sent = len(self.records)
                self.done = sum(r[1] is not None for r in self.records)

    async def wait(self) -> list[tuple]:
        while self.records is None:
            await asyncio.to_thread(self.conn.poll, 0.5)
            self.poll()
        self.proc.join(10)
        return self.records

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)


@dataclass(eq=False)
class Traffic:
    """The demo's senders: the burst (its own process) and a few paced requests per org."""

    client: Any
    config: Config
    phase: Phase
    timeout_s: float
    burst: Burst | None = None
    #: The paced orgs' HTTP client of the gateway; None: they produce to Kafka with ``client``.
    gateway: GatewayTraffic | None = None
    waiting: list[asyncio.Task] = field(default_factory=list, init=False)

    async def _send(self, org: str, endpoint: str, inp: dict) -> None:
        if self.gateway is not None:
            sent = self.phase.sent[uuid.uuid4().hex] = Sent(
                org, self.config.orgs[org].tier, endpoint, time.monotonic(),
                sent_ms=time.time() * 1000)
            self.waiting.append(asyncio.create_task(self._call(sent, inp)))
            return
        rid = uuid.uuid4().hex
        sent = self.phase.sent[rid] = Sent(org, self.config.orgs[org].tier, endpoint,
                                           time.monotonic())
        await self.client.submit({"id": rid, "org": org, "endpoint": endpoint, "input": inp})
        sent.acked_ms = time.time() * 1000
        self.waiting.append(asyncio.create_task(self._await(rid, sent)))

    async def _await(self, rid: str, sent: Sent) -> None:
        # A request with no result by the timeout stays result-less: the
        # tables count it as missing, never as served.
        with contextlib.suppress(TimeoutError):
            sent.result = await self.client.result(rid, timeout=self.timeout_s)
            sent.done_s = time.monotonic()
            sent.done_ms = time.time() * 1000

    async def _call(self, sent: Sent, inp: dict) -> None:
        """One HTTP call to the gateway; a call with no answer stays result-less (missing)."""
        assert self.gateway is not None, "_send() calls only through the gateway"
        kind = self.config.endpoints[sent.endpoint].kind
        answer = await self.gateway.call(sent.org, sent.endpoint, kind, inp)
        if answer.result is not None:
            sent.result, sent.done_s, sent.done_ms = answer.result, answer.done_s, answer.done_ms

    async def paced(self, org: str, endpoint: str, count: int, every_s: float,
                    start_s: float) -> None:
        await asyncio.sleep(start_s)
        for i in range(count):
            if endpoint == "rerank":
                inp = {"type": "rerank", "query": "supply chain costs",
                       "documents": [_text(org, i * 4 + k) for k in range(4)]}
            else:
                inp = {"type": "embed", "texts": [_text(org, i)]}
            await self._send(org, endpoint, inp)
            await asyncio.sleep(every_s)

    async def _bursting(self) -> None:
        if self.burst is None:
            return
        org = Burst.ORG
        tier = self.config.orgs[org].tier
        for rid, status, sent_s, done_s in await self.burst.wait():
            result = None if status is None else Result(id=rid, status=status, org=org,
                                                        endpoint="embed")
            self.phase.sent[rid] = Sent(org, tier, "embed", sent_s, result, done_s)

    async def run(self, quiet: int) -> None:
        """Send everything, then wait for every result (or its timeout)."""
        if self.burst is not None:
            self.burst.go()
        await asyncio.gather(
            self._bursting(),
            *(self.paced(org, "embed", quiet, 0.25, 0.3 + 0.1 * k)
              for k, org in enumerate(QUIET_ORGS)),
            self.paced("acme", "embed", max(2, quiet // 2), 0.5, 0.35),
            self.paced("searchco", "rerank", max(2, quiet // 2), 0.5, 0.4),
            self.paced("trial-1", "embed", max(2, quiet // 3), 0.5, 0.45),
        )
        await asyncio.gather(*self.waiting)


class Progress:
    def __init__(self, phase: Phase, expected: int, burst: Burst | None = None,
                 stream=sys.stderr):
        self.phase = phase
        self.burst = burst
        self.expected = expected
        self.stream = stream
        self.tty = stream.isatty()
        self.t0 = time.monotonic()
        self.last = 0.0

    def __call__(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < (0.5 if self.tty else 5.0):
            return
        self.last = now
        sent = self.phase.sent.values()
        done = [s.result for s in sent if s.result is not None]
        by: dict[str, int] = {}
        for r in done:
            by[r.status] = by.get(r.status, 0) + 1
        quiet = [s for s in sent if s.org in QUIET_ORGS]
        n_sent, n_done = len(sent), len(done)
        if self.burst is not None and self.burst.records is None:
            self.burst.poll()
            n_sent += self.burst.sent
            n_done += self.burst.done
        line = (f"  [{self.phase.name}] sent {n_sent:>6}/{self.expected}  done {n_done:>6}  "
                + " ".join(f"{k} {v}" for k, v in sorted(by.items()))
                + f"  quiet orgs {sum(s.result is not None for s in quiet)}/{len(quiet)}"
                + f"  {now - self.t0:5.1f}s")
        if self.tty:
            print("\r" + line.ljust(110), end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)


async def _run_phase(config: Config, config_path: str, phase: Phase, *, quiet: int,
                     timeout_s: float, model: str | None, threads: int | None, log,
                     log_level: str = "info", microbatch_size: int = 16,
                     worker_cpus: dict[str, set[int]] | None = None,
                     worker_nice: dict[str, int] | None = None,
                     burst_nice: int = 10, keys: dict[str, str] | None = None) -> Phase:
    """One phase on a fresh embedded broker, the services as separate processes.

    With ``keys`` (org -> API key) the gateway runs too, and the paced orgs
    call it over HTTP; the demo's Kafka client then only reads the
    gateway's reply topic, for the results' stamps."""
    from app.processes import ProcessStack
    from plumbing.broker import EmbeddedBroker
    from producer.client import FairnessClient

    async with EmbeddedBroker() as broker, contextlib.AsyncExitStack() as scope:
        kafka = KafkaSettings(bootstrap=broker.bootstrap, **EMBEDDED_SESSION)
        env = {**EMBEDDED_SESSION_ENV, "SF_LOG_LEVEL": log_level}
        stack = await scope.enter_async_context(ProcessStack(
            config_path, broker.bootstrap, policy=phase.policy,
            endpoints=list(config.endpoints), model=model, worker_threads=threads, log=log,
            env=env, extra_args={"worker": ["--microbatch-size", str(microbatch_size)],
                                 "gateway": gateway_args(timeout_s)},
            cpus=worker_cpus, nice=worker_nice, gateway_port=0 if keys else None))
        gateway = None
        if keys:
            # Off every request's path (it reads the stamps after the HTTP
            # answer), so it polls like a follower: a 10 ms idle fetch cost the
            # broker's core and this one 7-9 % each (plumbing.kafka).
            reader = msgspec.structs.replace(
                kafka, fetch_max_wait_ms=kafka.follow_fetch_max_wait_ms,
                idle_fetch_max_wait_ms=kafka.follow_fetch_max_wait_ms)
            observer = await scope.enter_async_context(FairnessClient(
                reader, config, reply_topic(config), client_id="demo-reader"))
            assert stack.gateway_url is not None, "the stack runs a gateway (gateway_port=0)"
            gateway = await scope.enter_async_context(GatewayTraffic(
                stack.gateway_url, keys, observer, timeout_s))
            client = None
            await _warm_up_http(gateway, config, timeout_s=120)
            phase.gateway = gateway
        else:
            client = await scope.enter_async_context(FairnessClient(kafka, config))
            await _warm_up(client, config, timeout_s=120)
        settle()  # the model timed at start, the clients: never walked again
        burst = (Burst(broker.bootstrap, config_path, phase.burst, timeout_s, burst_nice)
                 if phase.burst else None)
        try:
            if burst is not None:
                await burst.start()
            n_quiet = len(QUIET_ORGS) * quiet + 2 * max(2, quiet // 2) + max(2, quiet // 3)
            progress = Progress(phase, phase.burst + n_quiet, burst)
            t0 = time.monotonic()
            wall0 = time.time()
            traffic = asyncio.create_task(
                Traffic(client, config, phase, timeout_s, burst, gateway).run(quiet))
            # Every request has its own timeout; this is the backstop against
            # anything else that could wait for ever (the burst's process).
            deadline = t0 + timeout_s + 120
            while not traffic.done():
                progress()
                await asyncio.wait([traffic], timeout=0.5)
                if (err := stack.failed()) is not None:
                    traffic.cancel()
                    raise RuntimeError(f"during {phase.name}: {err}")
                if time.monotonic() > deadline:
                    traffic.cancel()
                    raise RuntimeError(_stuck(phase, burst))
            traffic.result()
        finally:
            if burst is not None:
                burst.stop()
        phase.elapsed_s = time.monotonic() - t0
        phase.wall_s = (wall0, time.time())
        progress(force=True)
        if progress.tty:
            print(file=sys.stderr)
    return phase


def _stuck(phase: Phase, burst: Burst | None) -> str:
    waiting = sum(s.result is None for s in phase.sent.values())
    where = "" if burst is None else (
        f"; the burst process is {'alive' if burst.proc.is_alive() else 'gone'} "
        f"(exit code {burst.proc.exitcode}), reported {burst.sent} sent / {burst.done} done, "
        f"final records {'received' if burst.records is not None else 'not received'}")
    return (f"during {phase.name}: traffic not finished after its timeout; {waiting} paced "
            f"requests without a result{where}")


async def _warm_up_http(gateway: GatewayTraffic, config: Config, timeout_s: float) -> None:
    """One request per endpoint through the gateway, answered; the phase counts only its own."""
    org = next(o for o in PACED_ORGS if o in gateway.keys)
    for name, ep in config.endpoints.items():
        inp = ({"type": "embed", "texts": ["warm up"]} if ep.kind == "embed"
               else {"type": "rerank", "query": "warm", "documents": ["up"]})
        answer = await within(gateway.call(org, name, ep.kind, inp), timeout_s)
        if answer.status != 200:
            raise RuntimeError(f"warm-up request on {name!r} through the gateway got HTTP "
                               f"{answer.status}: {answer.result and answer.result.message}")
    gateway.statuses.clear()
    gateway.unstamped = 0


async def _warm_up(client, config: Config, timeout_s: float) -> None:
    """One request per endpoint, answered: every service is up and the scheduler knows a worker."""
    org = next(iter(config.orgs))
    for name, ep in config.endpoints.items():
        inp = ({"type": "embed", "texts": ["warm up"]} if ep.kind == "embed"
               else {"type": "rerank", "query": "warm", "documents": ["up"]})
        rid = await client.submit({"org": org, "endpoint": name, "input": inp})
        result = await client.result(rid, timeout=timeout_s)
        if result.status != "ok":
            raise RuntimeError(f"warm-up request on {name!r} got {result.status}: {result.message}")


def _full_batch_ms(config: Config, model_spec: str | None, threads: int | None,
                  microbatch_size: int) -> float:
    """Median time to encode one full batch of the burst's texts with the embed model,
    the way the worker serves it: in micro-batches of ``microbatch_size`` texts,
    with as many torch threads as the worker gets."""
    from worker.service import load_model

    if threads:
        import torch

        torch.set_num_threads(threads)

    model = load_model(config, "embed", model_spec)
    ep = config.endpoints["embed"]
    texts: list[str] = []
    tokens, i = 0, 0
    while len(texts) < ep.max_batch_size:
        n = model.token_lengths([_text("bulkcorp", i)])[0]
        if tokens + n > ep.max_batch_tokens:
            break
        texts.append(_text("bulkcorp", i))
        tokens += n
        i += 1
    chunks = [texts[i:i + microbatch_size] for i in range(0, len(texts), microbatch_size)]
    for chunk in chunks:  # warm-up, in the shapes timed
        model.encode(chunk)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for chunk in chunks:
            model.encode(chunk)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def plan_cpus(endpoints: list[str], threads: int) -> tuple[dict[str, set[int]], set[int]] | None:
    """(CPUs of each pinned worker process, CPUs of everything else), or None.

    Each endpoint's worker in turn (the configuration's order: the embed
    endpoint, whose batches the bound is about, first) gets ``threads`` of
    the highest-numbered CPUs to itself, as long as one CPU stays for the
    rest; a worker that gets none runs with the services. Its own CPUs
    stand in for the accelerator a deployment gives a worker: the broker,
    admission, the scheduler and the traffic cannot take the model's CPU
    (on two shared cores they did, in the burst's first second: a full
    batch took 0.6-0.8 s instead of 0.2 s), and neither can another
    endpoint's model (a rerank call overlapping an embed batch lengthened it
    by its own time). None where pinning is not possible (not Linux, one CPU).
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    free = sorted(os.sched_getaffinity(0))
    if len(free) < 2:
        return None
    pinned: dict[str, set[int]] = {}
    for ep in endpoints:
        k = max(1, threads)
        if len(free) - k < 1:
            break
        pinned[f"worker-{ep}"], free = set(free[-k:]), free[:-k]
    return pinned, set(free)


def _table(phase: Phase) -> str:
    orgs = sorted({s.org for s in phase.sent.values()},
                  key=lambda o: (o != "bulkcorp", o))
    rows = [(f"{'org':<10} {'tier':<11} {'endpoint':<8} {'sent':>6} {'ok':>6} {'rejected':>8} "
             f"{'expired':>7} {'other':>5} {'missing':>7} {'p50 ms':>8} {'p99 ms':>8}")]
    for org in orgs:
        ss = [s for s in phase.sent.values() if s.org == org]
        st = [s.result.status for s in ss if s.result is not None]
        lat = phase.latencies_ms(org)
        rows.append(
            f"{org:<10} {ss[0].tier:<11} {ss[0].endpoint:<8} {len(ss):>6} {st.count('ok'):>6} "
            f"{st.count('rejected'):>8} {st.count('expired'):>7} "
            f"{len(st) - st.count('ok') - st.count('rejected') - st.count('expired'):>5} "
            f"{len(ss) - len(st):>7} {_fmt(percentile_ms(lat, 50)):>8} {_fmt(percentile_ms(lat, 99)):>8}")
    return "\n".join(rows)


def _quiet_results(phase: Phase) -> list[tuple[Result, float]]:
    return [(s.result, s.done_ms) for s in phase.sent.values()
            if s.org in QUIET_ORGS and s.result is not None and s.done_ms is not None]


def _stage_times(phase: Phase) -> dict[str, list[float]]:
    """Milliseconds per stage of the quiet orgs' ok requests (:mod:`traffic.stages`), after
    the HTTP hop to the gateway (its send -> the gateway's ``created_ms``) when they took it.
    Their "delivery" then ends at the HTTP answer: it holds the gateway's way back."""
    http = [max(0.0, float(s.result.created_ms) - s.sent_ms) for s in phase.sent.values()
            if s.org in QUIET_ORGS and s.sent_ms is not None and s.result is not None
            and s.result.status == "ok" and s.result.created_ms is not None]
    return {HTTP_STAGE: http, **stage_times(_quiet_results(phase))}


def _stages(phase: Phase) -> str:
    """Where the quiet orgs' time went, from the stamps each result carries."""
    return stage_line(_stage_times(phase), label="quiet orgs, time per stage")


def _ingress_split(phase: Phase) -> dict[str, list[float]]:
    """The "to admission" stage in two: the ingress append (sent -> the broker's
    acknowledgement, the client's clock) and the wait for admission's fetch after it."""
    out: dict[str, list[float]] = {"ingress append": [], "acknowledged -> fetched": []}
    for s in phase.sent.values():
        r = s.result
        if s.org not in QUIET_ORGS or r is None or r.status != "ok" or s.acked_ms is None \
                or r.created_ms is None or r.fetched_ms is None:
            continue
        out["ingress append"].append(s.acked_ms - r.created_ms)
        out["acknowledged -> fetched"].append(r.fetched_ms - s.acked_ms)
    return out


def _ingress_line(phase: Phase) -> str | None:
    """The split of "to admission", where the demo's client made the append itself."""
    split = _ingress_split(phase)
    if not any(split.values()):
        return None  # through the gateway: its append is the gateway's
    return stage_line(split, label="  to admission, split")


def _gateway_line(phase: Phase) -> str | None:
    if phase.gateway is None:
        return None
    orgs = [o for o in PACED_ORGS if o in phase.gateway.keys]
    return phase.gateway.line(orgs)


def _late_line(phase: Phase, unloaded: Phase, bound_ms: float) -> str:
    """Where the quiet requests over ``bound_ms`` lost their time: each stage
    beyond its p50 in the unloaded phase (:func:`traffic.stages.excess_by_stage`),
    and the HTTP hop to the gateway beyond its own, where they took it."""
    usual = usual_stage_ms(_quiet_results(unloaded))
    over = [(s, s.result, s.done_ms) for s in phase.sent.values()
            if s.org in QUIET_ORGS and s.result is not None and s.result.status == "ok"
            and s.done_s is not None and s.done_ms is not None
            and (s.done_s - s.sent_s) * 1000 > bound_ms]
    late = [request_stages(r, done_ms) for _, r, done_ms in over]
    line = excess_line(excess_by_stage(late, usual), len(late), label="quiet over the bound")
    usual_http = percentile_ms(_stage_times(unloaded)[HTTP_STAGE], 50)
    http = [float(r.created_ms) - s.sent_ms for s, r, _ in over
            if s.sent_ms is not None and r.created_ms is not None]
    if http and usual_http is not None:
        beyond = sum(max(0.0, ms - usual_http) for ms in http) / len(http)
        line += f"; {HTTP_STAGE} beyond its unloaded p50: {beyond:,.0f} ms a request"
    return line


def _stage_table(phases: list[Phase]) -> str:
    """The quiet orgs' p99 per stage, one column per phase (unloaded first)."""
    times = [_stage_times(p) for p in phases]
    width = max(12, *(len(p.name) + 2 for p in phases))
    names = [name for name, _, _ in STAGES]
    if any(t[HTTP_STAGE] for t in times):
        names.insert(0, HTTP_STAGE)
    label = max(18, *(len(n) + 1 for n in names))
    rows = [f"{'p99 ms':<{label}}" + "".join(f"{p.name:>{width}}" for p in phases)]
    for name in names:
        rows.append(f"{name:<{label}}" + "".join(f"{_fmt(percentile_ms(t[name], 99)):>{width}}"
                                                 for t in times))
    return "\n".join(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help="configuration (default: examples/demo.toml)")
    parser.add_argument("--burst", type=int, default=4000,
                        help="requests in the noisy org's burst (phase 3 sends 5x this)")
    parser.add_argument("--quiet", type=int, default=12, help="requests per quiet org per phase")
    parser.add_argument("--model", default=None,
                        help="model spec for every worker (default: each endpoint's model)")
    parser.add_argument("--timeout-s", type=float, default=600.0,
                        help="longest wait for a phase's results")
    parser.add_argument("--log-file", default="out/demo/services.log",
                        help="where the services' JSON log lines go")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"],
                        help="level of the services' log file (debug: a line per request)")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="threads for inference (default 1: leaves a core for the services, "
                             "as an accelerator would; 0: torch's default)")
    parser.add_argument("--microbatch-size", type=int, default=16,
                        help="texts per worker micro-batch (default 16: on a CPU a quiet "
                             "request's results come back after a quarter of a full batch, "
                             "for ~10%% more time per batch)")
    parser.add_argument("--pin", choices=["auto", "off"], default="auto",
                        help="auto (default, Linux): each worker gets CPUs of its own while one "
                             "stays for the rest, the stand-in for its accelerator; off: every "
                             "process shares every CPU")
    parser.add_argument("--skip-x5", action="store_true", help="skip the 5x burst phase")
    parser.add_argument("--quiet-via", choices=["gateway", "kafka"], default="gateway",
                        help="gateway (default): the paced orgs call the HTTP gateway with API "
                             "keys made for the run; kafka: they produce to Kafka directly, "
                             "as the bursting org always does")


def run(args: argparse.Namespace) -> int:
    import tempfile

    from plumbing.logs import configure_logging

    keys = demo_keys(PACED_ORGS) if args.quiet_via == "gateway" else {}
    with tempfile.TemporaryDirectory(prefix="sf-demo-") as tmp:
        services_config = args.config
        try:
            if keys:
                # The services read a copy that lists the keys' hashes; the
                # keys themselves stay in this process's memory.
                services_config = str(Path(tmp) / "config.toml")
                Path(services_config).write_text(config_with_keys(args.config, keys))
            config = load_config(services_config)
        except (ConfigError, OSError) as e:
            print(f"serving-fairness demo: {e}", file=sys.stderr)
            return 2
        log_path = Path(args.log_file)
        kept = fresh_log(log_path)
        # Append mode: the service processes write to the same file.
        with log_path.open("a") as log_file:
            configure_logging(args.log_level, json=True, stream=log_file)
            return asyncio.run(_main(config, args, log_path, log_file, kept,
                                     services_config=services_config, keys=keys))


def fresh_log(path: Path) -> Path | None:
    """An empty log at ``path``; the last run's, if any, kept beside it as ``<name>.1``.

    Demo runs come in series (five in a row is the check): a run that fails
    is read after the next one has started, so one run's log is kept (one
    generation, as ``logrotate`` with ``rotate 1``). Returns the kept path.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = None
    if path.exists() and path.stat().st_size > 0:
        kept = path.with_name(path.name + ".1")
        path.replace(kept)
    path.write_text("")
    return kept


async def _main(config: Config, args: argparse.Namespace, log_path: Path, log,
                kept_log: Path | None, *, services_config: str | None = None,
                keys: dict[str, str] | None = None) -> int:
    out = sys.stdout
    shown = os.path.relpath(args.config)
    shown = args.config if shown.startswith("..") else shown
    print(f"serving-fairness demo: config {shown}, burst {args.burst}, "
          f"service logs -> {log_path}"
          + (f" (the run before: {kept_log})" if kept_log else ""), file=out, flush=True)
    if keys:
        print(f"{', '.join(keys)} send through the HTTP gateway (OpenAI /v1/embeddings, Cohere "
              f"/v2/rerank), each with an API key made for this run (held in memory only, "
              f"the services read its hash); {Burst.ORG} produces to Kafka directly",
              file=out, flush=True)
    print("loading the embedding model and timing one full batch...", file=out, flush=True)
    threads = args.torch_threads or None
    full_ms = await asyncio.to_thread(_full_batch_ms, config, args.model, threads,
                                      args.microbatch_size)
    ep = config.endpoints["embed"]
    print(f"full-batch service time: {full_ms:.0f} ms ({ep.max_batch_tokens} tokens)",
          file=out, flush=True)
    plan = plan_cpus(list(config.endpoints), threads or 1) if args.pin == "auto" else None
    worker_cpus = worker_nice = None
    if plan is not None:
        worker_cpus, service_cpus = plan
        # This process (the traffic and the broker it starts), and every
        # service not pinned, stays off the pinned workers' CPUs.
        os.sched_setaffinity(0, service_cpus)
        # A worker without CPUs of its own yields them to the services it runs
        # beside: its model stands for an accelerator's time, not theirs.
        worker_nice = {f"worker-{ep}": UNPINNED_WORKER_NICE for ep in config.endpoints
                       if f"worker-{ep}" not in worker_cpus}
        own = "; ".join(f"{name} on {_cpus(c)}" for name, c in worker_cpus.items())
        rest = "".join(f"; {name} on {_cpus(service_cpus)} at nice {n}"
                       for name, n in worker_nice.items())
        print(f"CPUs: {own}; the broker, admission, scheduler"
              f"{', gateway' if keys else ''} and traffic on "
              f"{_cpus(service_cpus)}{rest} (--pin off: all shared)", file=out, flush=True)
    phases = [Phase("unloaded", "drr", 0), Phase(f"burst {args.burst}, drr", "drr", args.burst)]
    if not args.skip_x5:
        phases.append(Phase(f"burst {5 * args.burst}, drr", "drr", 5 * args.burst))
    phases.append(Phase(f"burst {args.burst}, fifo", "fifo", args.burst))
    for phase in phases:
        print(f"\n== phase: {phase.name} ==", file=out, flush=True)
        await _run_phase(config, services_config or args.config, phase, quiet=args.quiet,
                         timeout_s=args.timeout_s, model=args.model, threads=threads, log=log,
                         log_level=args.log_level, microbatch_size=args.microbatch_size,
                         worker_cpus=worker_cpus, worker_nice=worker_nice, keys=keys)
        print(_table(phase), file=out)
        for line in (_gateway_line(phase), _stages(phase), _ingress_line(phase)):
            if line is not None:
                print(line, file=out)
        print(f"({phase.elapsed_s:.1f} s)", file=out, flush=True)
    served = served_full_batches(log_path, "embed", FULL_BATCH_SHARE * ep.max_batch_tokens)
    return _summary(phases, full_ms, args, out, served)


#: CPU niceness of a worker that shares the services' CPUs (``--pin auto``).
UNPINNED_WORKER_NICE = 10

#: What the demo holds the live pipeline to (issue "Isolation that holds on every run").
FIFO_OVER_DRR_MIN = 20.0
ADMISSION_STAGE_P99_MS = 100.0
QUEUE_STAGE_SLACK_MS = 100.0
#: A served batch of at least this share of ``max_batch_tokens`` counts as full.
FULL_BATCH_SHARE = 0.9
#: Fewer full batches served in a phase than this: the start's timing is used.
MIN_SERVED_FULL_BATCHES = 5


def served_full_batches(log_path: Path, endpoint: str, min_tokens: float) -> list[tuple[float, float]]:
    """(epoch s, ms) of every batch of at least ``min_tokens`` that ``endpoint``'s
    worker served, from its ``batch_served`` events in the services' log: its
    model time (``model_ms``: the seconds it had the model, not its waits for
    the batch before it, which overlaps it in the worker)."""
    from datetime import datetime

    out = []
    with contextlib.suppress(OSError), log_path.open() as f:
        for line in f:
            if '"batch_served"' not in line:
                continue
            try:
                ev = json.loads(line)
                if (ev.get("event") != "batch_served" or ev.get("endpoint") != endpoint
                        or ev.get("tokens", 0) < min_tokens):
                    continue
                at = datetime.fromisoformat(ev["timestamp"]).timestamp()
                out.append((at, float(ev["model_ms"])))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a killed process, another service's text
    return out


def phase_full_batch_ms(phase: Phase, served: Sequence[tuple[float, float]],
                        fallback_ms: float) -> tuple[float, str]:
    """The full-batch time a phase's quiet requests waited behind.

    The median of the full batches the worker finished while the quiet orgs'
    requests were out (from the first one's send to the last one's result;
    at least ``MIN_SERVED_FULL_BATCHES`` of them): those are the batches a
    quiet request could wait for. The quiet traffic is the phase's first
    seconds, the burst's tail runs for minutes after it, and on a shared
    machine the batches of those first seconds ran slower (in one run's log,
    under the 4,000 burst: the first ten full batches' median 364 ms, the
    whole phase's 319). Fewer than that: the median of the whole phase's
    full batches; fewer again: ``fallback_ms`` (timed at start).
    """
    def between(t0: float, t1: float) -> list[float]:
        return [m for at, m in served if t0 <= at <= t1]

    whole = between(*phase.wall_s) if phase.wall_s is not None else []
    quiet = _quiet_results(phase)
    sent = [float(r.created_ms) for r, _ in quiet if r.created_ms is not None]
    if sent:
        ms = between(min(sent) / 1000, max(done for _, done in quiet) / 1000)
        if len(ms) >= MIN_SERVED_FULL_BATCHES:
            rest = (f"; the phase's {len(whole)}: {statistics.median(whole):.0f} ms"
                    if whole else "")
            return (statistics.median(ms),
                    f"median of {len(ms)} served while the quiet requests were out{rest}")
    if len(whole) >= MIN_SERVED_FULL_BATCHES:
        return statistics.median(whole), f"median of {len(whole)} served in the phase"
    return fallback_ms, "timed at start"


def _summary(phases: list[Phase], full_ms: float, args, out,
             served: Sequence[tuple[float, float]] = ()) -> int:
    """Print every check with its margin; 0 only if all hold, else 1 and the failed ones."""
    unloaded = percentile_ms(phases[0].quiet_ms(), 99)
    bound = None if unloaded is None else unloaded + 2 * full_ms
    drr = [p for p in phases[1:] if p.policy == "drr"]
    fifo = [p for p in phases if p.policy == "fifo"]
    figures: dict[str, Any] = {"full_batch_ms": full_ms, "quiet_unloaded_p99_ms": unloaded, "bound_ms": bound,
               "phases": {}, "checks": {}}
    failed: list[str] = []

    def check(name: str, ok: bool, shown: str) -> str:
        figures["checks"][name] = ok
        if not ok:
            failed.append(name)
        return f"{shown}  {'ok' if ok else 'FAILED'}"

    print("\n== where the quiet orgs' time went, per stage ==", file=out)
    print(_stage_table(phases), file=out)
    print("\n== the quiet orgs (quiet-1, quiet-2: same tier as bulkcorp) ==", file=out)
    print(f"unloaded p99                           {_fmt(unloaded):>8} ms", file=out)
    print(f"bound = unloaded p99 + 2 x {full_ms:.0f} ms     {_fmt(bound):>8} ms "
          f"(a full batch timed at start; each burst phase's own below)", file=out)
    for p in phases:
        lost = sum(s.result is None for s in p.sent.values())
        p99 = percentile_ms(p.quiet_ms(), 99)
        stages = _stage_times(p)
        figures["phases"][p.name] = {
            "quiet_p99_ms": p99, "quiet_p50_ms": percentile_ms(p.quiet_ms(), 50),
            "sent": len(p.sent), "missing": lost, "elapsed_s": p.elapsed_s,
            "stages_p99_ms": {k: percentile_ms(v, 99) for k, v in stages.items()},
            "to_admission_split_p99_ms": {k: percentile_ms(v, 99)
                                          for k, v in _ingress_split(p).items()}}
        if p.gateway is not None:
            figures["phases"][p.name]["gateway"] = {
                "http_requests": p.gateway.calls,
                "http_statuses": {str(k): v for k, v in p.gateway.statuses.items()},
                "ok_without_stamps": p.gateway.unstamped}
        print(check(f"{p.name}: nothing missing", lost == 0,
                    f"{p.name:<38} missing results {lost:>6}"), file=out)
        if p.policy != "drr" or p is phases[0]:
            continue
        batch_ms, how = phase_full_batch_ms(p, served, full_ms)
        p_bound = None if unloaded is None else unloaded + 2 * batch_ms
        figures["phases"][p.name].update(full_batch_ms=batch_ms, bound_ms=p_bound)
        print(f"{'':<38} full batch {batch_ms:8.0f} ms ({how}), "
              f"bound {_fmt(p_bound)} ms", file=out)
        margin = None if p99 is None or p_bound is None else p_bound - p99
        print(check(f"{p.name}: quiet p99 within the bound", margin is not None and margin >= 0,
                    f"{p.name:<38} quiet p99 {_fmt(p99):>8} ms, margin {_fmt(margin):>7} ms"),
              file=out)
        if margin is not None and margin < 0:
            assert p_bound is not None, "margin is p_bound - p99"
            print(f"{'':<38} {_late_line(p, phases[0], p_bound)}", file=out)
        adm = percentile_ms(span_times(_quiet_results(p), "created_ms", "admitted_ms"), 99)
        print(check(f"{p.name}: admission stage p99 <= {ADMISSION_STAGE_P99_MS:.0f} ms",
                    adm is not None and adm <= ADMISSION_STAGE_P99_MS,
                    f"{'':<38} sent -> admitted p99 {_fmt(adm):>6} ms "
                    f"(<= {ADMISSION_STAGE_P99_MS:.0f})"), file=out)
        queue = percentile_ms(stages["scheduler queue"], 99)
        limit = batch_ms + QUEUE_STAGE_SLACK_MS
        print(check(f"{p.name}: scheduler-queue stage p99 <= one full batch + "
                    f"{QUEUE_STAGE_SLACK_MS:.0f} ms", queue is not None and queue <= limit,
                    f"{'':<38} scheduler queue p99 {_fmt(queue):>7} ms (<= {limit:.0f})"),
              file=out)
    if fifo and drr:
        same = next((p for p in drr if p.burst == fifo[0].burst), drr[0])
        fair = percentile_ms(same.quiet_ms(), 99)
        unfair = percentile_ms(fifo[0].quiet_ms(), 99)
        ratio = unfair / fair if fair and unfair else None
        figures["fifo_over_drr"] = ratio
        print(check(f"fifo / drr >= {FIFO_OVER_DRR_MIN:.0f}x",
                    ratio is not None and ratio >= FIFO_OVER_DRR_MIN,
                    f"{'fifo / drr (same burst)':<38} {ratio or 0:8.1f} x "
                    f"(>= {FIFO_OVER_DRR_MIN:.0f})"), file=out)
    if bound is None:
        failed.append("unloaded phase: no quiet result to measure")
    figures["failed"] = failed
    if failed:
        print("some checks FAILED: " + "; ".join(failed), file=out, flush=True)
    else:
        print("all checks passed", file=out, flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 1 if failed else 0

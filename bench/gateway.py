"""The HTTP gateway's cost: the same requests through it and through FairnessClient, in one run.

Why: the gateway (issue 46) must "disappear": a tenant that calls
``POST /v1/embeddings`` should get about the pipeline's own throughput and
latency, as a service that writes to Kafka with the client library does.
With a model that takes no time (``fake``), what is left is the pipeline
and, on one side, the gateway.

Every part runs in a process of its own, as deployed: admission, the
scheduler and one worker (:class:`app.processes.ProcessStack`, the fake
model at 0 ms), the gateway (``serving-fairness gateway``), and the load:

- ``direct``: a process with one :class:`~producer.client.FairnessClient`
  (msgpack on the wire, as the gateway's own client) and ``concurrency``
  loops, each submitting a request and awaiting its result, again and
  again, for ``seconds``;
- ``gateway``: ``concurrency`` keep-alive HTTP connections, each posting
  the same request to ``/v1/embeddings`` (a Bearer key of one of five
  orgs, in turn) and awaiting its answer, for ``seconds``. The load
  generator is ``wrk`` (``--loadgen wrk``, the default: written in C, it
  costs the shared cores little, as a tenant's client on another machine
  would cost them nothing; Debian and Ubuntu: ``apt-get install wrk``,
  macOS: ``brew install wrk``), or an aiohttp client in a process of its
  own (``--loadgen python``: nothing to install, but its CPU is charged to
  the gateway's side on a small machine).

The pipeline request is the same on both sides: one 16-word text, as
OpenAI's route makes it (normalized float32 vectors packed, base64 on the
HTTP side),
the org's tier gold, a deadline of 60 s.

Three measurements:

1. **Throughput** at ``concurrency`` (default 256) requests in flight,
   rounds interleaved (direct, gateway, direct, gateway...), each side's
   best round counting: ``gateway_ratio`` = gateway requests/s over direct
   requests/s. Beside it, the CPU each side's processes used per request
   (``/proc``): the direct client's, the gateway's, the load generator's.
2. **Latency** at ``latency_concurrency`` (default 4) in flight per side, a
   light load, both sides at once from one process (a FairnessClient and
   an aiohttp client, requests of both in flight together), so that both
   meet the same pipeline at the same moments: the pipeline's own latency
   on a shared machine moves by tens of milliseconds from one round to the
   next. ``added_p50_ms`` and ``added_p99_ms`` are the gateway's p50 and p99
   minus the direct ones within a round, the median over the rounds.
3. **Waiting requests.** The worker is paused (SIGSTOP), ``waiting`` + 10 %
   requests are posted at once on as many connections, and once the
   gateway reports ``waiting`` requests waiting (its
   ``sf_gateway_waiting_requests``) its RSS is read again:
   ``rss_per_waiting_kib`` is the growth over the RSS just before, divided
   by ``waiting``. The gateway runs with ``--max-waiting-requests`` =
   ``waiting``: the 10 % beyond it must get 503 at once (memory bounded),
   the rest 200 once the worker is resumed (SIGCONT). For comparison, the
   direct client's process the same way (``direct_rss_per_waiting_kib``:
   warmed, the worker paused, ``waiting`` requests submitted).

Run: ``python bench/gateway.py`` (8 s rounds, 3 each) or ``--quick`` (3 s,
2); ``--json FILE`` also writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import msgspec

from app.processes import ProcessStack, placement
from bench.figures import run_quietly
from gateway.keys import hash_key, new_key
from plumbing.kafka import (
    EMBEDDED_SESSION_ENV,
    KafkaSettings,
    add_kafka_arguments,
    kafka_connected,
    settings_from_args,
)
from plumbing.ports import free_port
from plumbing.topics import delete_topics, describe_topics
from schemas.build import build_config
from schemas.config import load_config
from schemas.messages import EmbedInput, Request

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
ORGS = ("acme", "bulkcorp", "quiet-1", "quiet-2", "searchco")
#: One request's text: 16 words (16 tokens for the fake model's counter).
TEXT = " ".join(f"word{i}" for i in range(16))
BODY = msgspec.json.encode({"model": "embed", "input": TEXT, "encoding_format": "base64"})
DEADLINE_MS = 60_000
NO_WRK = ("wrk not found on PATH: install it (Debian/Ubuntu: apt-get install wrk; "
          "macOS: brew install wrk) or run with --loadgen python")


# -- the load, in a child process ----------------------------------------------------


def _direct_request(i: int) -> Request:
    # What gateway.openai_api.EmbeddingsRoute.call makes of BODY.
    return Request(id=uuid.uuid4().hex, org=ORGS[i % len(ORGS)], endpoint="embed",
                   input=EmbedInput(texts=(TEXT,), normalize=True, embedding_types=["float"],
                                    encoding="base64"),
                   deadline_ms=DEADLINE_MS, created_ms=int(time.time() * 1000))


async def _drive(args: argparse.Namespace) -> dict:
    """Closed loops (``concurrency`` per side, ``seconds`` long) or one burst (``--burst``).

    ``--side paired``: both sides at once from this one process, ``concurrency``
    loops each, so that both see the same pipeline at the same moments.
    """
    sides = ["direct", "http"] if args.side == "paired" else [args.side]
    latencies: dict[str, list[float]] = {side: [] for side in sides}
    statuses: dict[str, Counter] = {side: Counter() for side in sides}
    calls = {}
    closing = []
    if "direct" in sides:
        from producer.client import FairnessClient

        kafka = KafkaSettings(bootstrap=args.bootstrap)
        client = FairnessClient(kafka, load_config(args.config), wire_format="msgpack")
        await client.start()
        closing.append(client.stop)

        submitted = Counter()

        async def direct(i: int) -> str:
            rid = await client.submit(_direct_request(i))
            submitted["n"] += 1
            res = await client.result(rid, DEADLINE_MS / 1000 + 5)
            return res.status

        calls["direct"] = direct
    if "http" in sides:
        keys = json.loads(Path(args.keys).read_text())
        auth = [f"Bearer {keys[org]}" for org in ORGS]
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                        timeout=aiohttp.ClientTimeout(total=DEADLINE_MS / 1000 + 10))
        closing.append(session.close)

        async def http(i: int) -> str:
            async with session.post(args.url, data=BODY, headers={
                    "Authorization": auth[i % len(auth)],
                    "Content-Type": "application/json"}) as resp:
                await resp.read()
                return str(resp.status)

        calls["http"] = http

    async def timed(side: str, i: int) -> None:
        t0 = time.perf_counter()
        try:
            status = await calls[side](i)
        except Exception as e:  # noqa: BLE001 - counted, the run goes on
            status = type(e).__name__
        latencies[side].append(time.perf_counter() - t0)
        statuses[side][status] += 1

    try:
        if args.burst and args.side == "direct":
            return await _hold(args.burst, lambda i: timed("direct", i), submitted,
                               statuses["direct"])
        if args.burst:
            await asyncio.gather(*(timed(sides[0], i) for i in range(args.burst)))
            return {"statuses": dict(statuses[sides[0]])}
        counter = iter(range(10**12))

        async def loop(side: str, until: float) -> None:
            while time.monotonic() < until:
                await timed(side, next(counter))

        def all_loops(until: float) -> list:
            return [loop(side, until) for side in sides for _ in range(args.concurrency)]

        await asyncio.gather(*all_loops(time.monotonic() + args.warmup_s))
        warmed = sum(len(xs) for xs in latencies.values())
        for side in sides:
            latencies[side].clear()
            statuses[side].clear()
        start, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*all_loops(start + args.seconds))
        elapsed, cpu = time.monotonic() - start, time.process_time() - cpu
        out = {}
        for side in sides:
            xs = latencies[side]
            q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else xs * 99
            out[side] = {"requests": len(xs), "seconds": elapsed, "rps": len(xs) / elapsed,
                         "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000,
                         "statuses": dict(statuses[side]), "cpu_s": cpu,
                         "requests_warmup": warmed}
        return out if args.side == "paired" else out[args.side]
    finally:
        for close in closing:
            await close()


async def _hold(burst: int, timed, submitted: Counter, statuses: Counter) -> dict:
    """The direct client's own RSS with ``burst`` requests waiting.

    Warm first (``burst`` // 2 requests answered), say ``WARM`` and wait for a
    line on stdin (the worker is paused then), send ``burst``, and once all are
    submitted read this process's RSS and say ``HELD``.
    """
    await asyncio.gather(*(timed(i) for i in range(burst // 2)))
    statuses.clear()
    print("WARM", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    before = rss_kib(os.getpid())
    start = submitted["n"]
    sending = asyncio.gather(*(timed(i) for i in range(burst)))
    while submitted["n"] - start < burst and not sending.done():
        await asyncio.sleep(0.05)
    held = []
    for _ in range(5):
        held.append(rss_kib(os.getpid()))
        await asyncio.sleep(0.1)
    print("HELD", flush=True)
    await sending
    return {"statuses": dict(statuses), "rss_before_kib": before, "rss_waiting_kib": max(held)}


def drive_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench/gateway.py drive")
    parser.add_argument("--side", choices=["direct", "http", "paired"], required=True)
    parser.add_argument("--config")
    parser.add_argument("--bootstrap")
    parser.add_argument("--url")
    parser.add_argument("--keys", help="a JSON file: org -> key")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--warmup-s", type=float, default=0.5)
    parser.add_argument("--burst", type=int, default=0,
                        help="send this many at once, each once, and report their statuses")
    args = parser.parse_args(argv)
    # One socket per request in flight, and the gateway's side of each.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(args.concurrency, args.burst) + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    from plumbing.logs import configure_logging

    configure_logging("WARNING")
    print("RESULT " + json.dumps(asyncio.run(_drive(args))), flush=True)


# -- the orchestration ---------------------------------------------------------------


def _result_line(output: str, tag: str) -> dict:
    for line in reversed(output.splitlines()):
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    raise RuntimeError(f"no {tag} line in the load generator's output:\n{output[-2000:]}")


async def _run(cmd: list[str], timeout_s: float) -> str:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{cmd[0]} did not end within {timeout_s:g} s") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} exited {proc.returncode}:\n{text[-2000:]}")
    return text


def _drive_cmd(side: str, run: dict, concurrency: int, seconds: float, warmup_s: float) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "drive", "--side", side,
           "--concurrency", str(concurrency), "--seconds", str(seconds),
           "--warmup-s", str(warmup_s)]
    if side in ("direct", "paired"):
        cmd += ["--config", run["config"], "--bootstrap", run["bootstrap"]]
    if side in ("http", "paired"):
        cmd += ["--url", run["url"] + "/v1/embeddings", "--keys", run["keys"]]
    return cmd


_WRK_LUA = """
local keys = %(keys)s
local body = %(body)s
local i = 0
request = function()
  i = i + 1
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. keys[(i %% #keys) + 1]}, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK {"requests": %%d, "seconds": %%f, "p50_ms": %%f, "p99_ms": %%f, ' ..
    '"errors": {"status": %%d, "connect": %%d, "read": %%d, "write": %%d, "timeout": %%d}}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e3,
    latency:percentile(99) / 1e3, e.status, e.connect, e.read, e.write, e.timeout))
end
"""


async def _wrk(run: dict, concurrency: int, seconds: float) -> dict:
    threads = max(1, min(2, concurrency))
    # wrk is the only child reaped during the round: its CPU is the children's growth.
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = await _run(["wrk", "-t", str(threads), "-c", str(concurrency),
                      "-d", f"{max(1, round(seconds))}s", "--timeout", "60s",
                      "-s", run["lua"], run["url"]], seconds + 60)
    got = _result_line(out, "WRK")
    bad = sum(got["errors"].values())
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    got["cpu_s"] = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    got["rps"] = got["requests"] / got["seconds"]
    got["statuses"] = {"2xx": got["requests"] - got["errors"]["status"]} | (
        {"errors": got["errors"]} if bad else {})
    return got


async def one_round(side: str, run: dict, concurrency: int, seconds: float) -> dict:
    """One side for ``seconds`` at ``concurrency`` in flight: rps, p50_ms, p99_ms, and the CPU
    microseconds per request of the load's process (``load_cpu_us``: the direct client, or
    the HTTP load generator) and of the gateway (``gateway_cpu_us``)."""
    gateway_cpu = cpu_s(run["gateway_pid"])
    if side == "gateway" and run["loadgen"] == "wrk":
        got = await _wrk(run, concurrency, seconds)
    else:
        cmd = _drive_cmd("direct" if side == "direct" else "http", run, concurrency, seconds,
                         run["warmup_s"])
        got = _result_line(await _run(cmd, seconds + 120), "RESULT")
    _check(side, got)
    # The load's CPU is the timed window's; the gateway's the whole round's, a warm-up
    # included where the load has one (its requests are counted with it).
    got["load_cpu_us"] = got["cpu_s"] * 1e6 / got["requests"]
    if side == "gateway":
        got["gateway_cpu_us"] = (cpu_s(run["gateway_pid"]) - gateway_cpu) * 1e6 / (
            got["requests"] + got.get("requests_warmup", 0))
    return got


def _check(side: str, got: dict) -> None:
    bad = {k: v for k, v in got["statuses"].items() if k not in ("ok", "200", "2xx")}
    if bad:
        raise RuntimeError(f"{side}: answers not ok: {bad}")


async def paired_round(run: dict, concurrency: int, seconds: float) -> dict:
    """Both sides at once from one process (``concurrency`` each): their p50 and p99."""
    cmd = _drive_cmd("paired", run, concurrency, seconds, run["warmup_s"])
    got = _result_line(await _run(cmd, seconds + 120), "RESULT")
    for side in got:
        _check(side, got[side])
    return got


def _spawn_gateway(config_path: Path, bootstrap: str, port: int, metrics_port: int,
                   max_waiting: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "app.cli", "gateway", "--config", str(config_path),
           "--bootstrap", bootstrap, "--port", str(port), "--metrics-port", str(metrics_port),
           "--max-waiting-requests", str(max_waiting), "--max-wait-ms", str(DEADLINE_MS)]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                preexec_fn=placement(None, 0))  # noqa: PLW1509


async def _metric(session: aiohttp.ClientSession, metrics_url: str, name: str) -> float | None:
    try:
        async with session.get(metrics_url + "/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


async def _gateway_ready(proc: subprocess.Popen, metrics_url: str, log: Path,
                         timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.poll() is not None:
                err = log.read_text(errors="replace")
                raise RuntimeError(f"the gateway exited {proc.returncode}:\n{err[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(metrics_url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway was not ready in time")
            await asyncio.sleep(0.2)


def cpu_s(pid: int) -> float:
    """CPU time (user + system) ``pid`` has used (Linux /proc), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` (Linux /proc), KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def hold_waiting(run: dict, gateway_pid: int, worker_pid: int, waiting: int) -> dict:
    """RSS of the gateway with ``waiting`` requests waiting (the worker paused), and the bound."""
    extra = max(1, waiting // 10)
    cmd = [*_drive_cmd("http", run, 1, 0, 0), "--burst", str(waiting + extra)]
    metrics_url = run["metrics_url"]
    before = rss_kib(gateway_pid)
    os.kill(worker_pid, signal.SIGSTOP)
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, cwd=ROOT)
    held = None
    samples: list[int] = []
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                now = await _metric(session, metrics_url, "sf_gateway_waiting_requests")
                if now is not None and now >= waiting:
                    held = int(now)
                    break
                await asyncio.sleep(0.05)
            # Held: a few readings over half a second, the highest counts.
            for _ in range(5):
                samples.append(rss_kib(gateway_pid))
                await asyncio.sleep(0.1)
            full = await _metric(session, metrics_url, "sf_gateway_full_total")
    finally:
        os.kill(worker_pid, signal.SIGCONT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    got = _result_line(out.decode(errors="replace"), "RESULT")
    if held is None:
        raise RuntimeError(f"the gateway never held {waiting} waiting requests; the burst got "
                           f"{got['statuses']}")
    after = rss_kib(gateway_pid)
    grown = max(samples) - before
    return {"waiting_requests": held, "sent": waiting + extra,
            "statuses": got["statuses"], "refused_full": full,
            "rss_before_mib": before / 1024, "rss_waiting_mib": max(samples) / 1024,
            "rss_after_mib": after / 1024, "rss_per_waiting_kib": grown / held}


async def hold_direct(run: dict, worker_pid: int, waiting: int) -> dict:
    """The direct client's RSS growth per waiting request, the worker paused, for comparison."""
    cmd = [*_drive_cmd("direct", run, 1, 0, 0), "--burst", str(waiting)]
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, cwd=ROOT)
    lines: list[str] = []

    async def until(word: str) -> None:
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode(errors="replace")
            if not line:
                raise RuntimeError(f"the direct client ended before {word}:\n"
                                   + "".join(lines)[-2000:])
            lines.append(line)
            if line.startswith(word):
                return

    paused = False
    try:
        await until("WARM")
        os.kill(worker_pid, signal.SIGSTOP)
        paused = True
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        await until("HELD")
    except BaseException:
        proc.kill()
        raise
    finally:
        if paused:
            os.kill(worker_pid, signal.SIGCONT)
    rest, _ = await asyncio.wait_for(proc.communicate(), 120)
    got = _result_line("".join(lines) + rest.decode(errors="replace"), "RESULT")
    _check("direct", got)
    return {"direct_rss_per_waiting_kib": (got["rss_waiting_kib"] - got["rss_before_kib"])
            / waiting}


async def amain(args: argparse.Namespace) -> dict:
    seconds = args.seconds or (3.0 if args.quick else 8.0)
    repeat = args.repeat or (2 if args.quick else 3)
    if args.loadgen == "wrk" and shutil.which("wrk") is None:
        raise SystemExit(f"bench/gateway.py: {NO_WRK}")
    kafka = settings_from_args(args)
    embedded = kafka.bootstrap is None
    figures: dict = {"loadgen": args.loadgen, "concurrency": args.concurrency,
                     "latency_concurrency": args.latency_concurrency, "seconds": seconds,
                     "repeat": repeat, "loadavg_before": Path("/proc/loadavg").read_text().split()[:3]}
    keys = {org: new_key() for org in ORGS}
    prefix = f"benchg{uuid.uuid4().hex[:6]}."
    built = build_config(prefix=prefix, endpoints={"embed": {"latency_target_ms": 600_000}},
                         orgs={org: {"tier": "gold", "api_keys": [hash_key(k)]}
                               for org, k in keys.items()})
    env = {"SF_LOG_LEVEL": "WARNING"}
    async with kafka_connected(kafka) as kafka:
        if embedded:
            env |= EMBEDDED_SESSION_ENV
        with tempfile.TemporaryDirectory() as tmp:
            config_path = Path(tmp) / "config.toml"
            config_path.write_text(built.text)
            keys_path = Path(tmp) / "keys.json"
            keys_path.write_text(json.dumps(keys))
            lua_path = Path(tmp) / "post.lua"
            lua_path.write_text(_WRK_LUA % {
                "keys": "{" + ", ".join(json.dumps(keys[o]) for o in ORGS) + "}",
                "body": json.dumps(BODY.decode())})
            log_path = Path(tmp) / "gateway.log"
            port, metrics_port = free_port(), free_port()
            run = {"config": str(config_path), "bootstrap": kafka.require_bootstrap(),
                   "url": f"http://127.0.0.1:{port}", "metrics_url": f"http://127.0.0.1:{metrics_port}",
                   "keys": str(keys_path), "lua": str(lua_path), "loadgen": args.loadgen,
                   "warmup_s": min(1.0, seconds / 2)}
            gateway = None
            try:
                async with ProcessStack(config_path, kafka.require_bootstrap(),
                                        endpoints=["embed"], model="fake", env=env,
                                        extra_args={"admission": ["--token-counter", "fake"]}
                                        ) as stack:
                    gateway = _spawn_gateway(config_path, kafka.require_bootstrap(), port,
                                             metrics_port, args.waiting, env, log_path)
                    await _gateway_ready(gateway, run["metrics_url"], log_path, 60)
                    run["gateway_pid"] = gateway.pid
                    figures |= await measure(args, run, seconds, repeat)
                    figures |= await hold_waiting(run, gateway.pid, stack.pid("worker-embed"),
                                                  args.waiting)
                    figures |= await hold_direct(run, stack.pid("worker-embed"), args.waiting)
            finally:
                if gateway is not None and gateway.poll() is None:
                    gateway.send_signal(signal.SIGTERM)
                    try:
                        gateway.wait(15)
                    except subprocess.TimeoutExpired:
                        gateway.kill()
                        gateway.wait()
                await delete_topics(kafka, await describe_topics(kafka, prefix))
    figures["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    report(figures, embedded, kafka)
    return figures


async def measure(args: argparse.Namespace, run: dict, seconds: float, repeat: int) -> dict:
    """Throughput rounds interleaved direct, gateway; then the paired latency rounds."""
    # A warm-up of each side: connections, the gateway's first requests.
    for side in ("direct", "gateway"):
        await one_round(side, run, args.concurrency, 1.0)
    rounds: dict[str, list[dict]] = {"direct": [], "gateway": []}
    for _ in range(repeat):
        for side in ("direct", "gateway"):
            rounds[side].append(await one_round(side, run, args.concurrency, seconds))
    light = [await paired_round(run, args.latency_concurrency, seconds) for _ in range(repeat)]
    best = {side: max(r["rps"] for r in rs) for side, rs in rounds.items()}

    def median(side: str, key: str) -> float:
        return statistics.median(r[side][key] for r in light)

    added = {q: [r["http"][f"{q}_ms"] - r["direct"][f"{q}_ms"] for r in light]
             for q in ("p50", "p99")}
    return {
        "direct_rps": best["direct"], "gateway_rps": best["gateway"],
        "gateway_ratio": best["gateway"] / best["direct"],
        "direct_p50_ms": median("direct", "p50_ms"), "direct_p99_ms": median("direct", "p99_ms"),
        "gateway_p50_ms": median("http", "p50_ms"), "gateway_p99_ms": median("http", "p99_ms"),
        "added_p50_ms": statistics.median(added["p50"]),
        "added_p99_ms": statistics.median(added["p99"]),
        "added_per_round_ms": added,
        "loaded": {side: {"p50_ms": min(r["p50_ms"] for r in rs),
                          "p99_ms": min(r["p99_ms"] for r in rs)}
                   for side, rs in rounds.items()},
        "direct_cpu_us": min(r["load_cpu_us"] for r in rounds["direct"]),
        "gateway_cpu_us": min(r["gateway_cpu_us"] for r in rounds["gateway"]),
        "loadgen_cpu_us": min(r["load_cpu_us"] for r in rounds["gateway"]),
        "rounds": {side: [{k: r[k] for k in ("rps", "p50_ms", "p99_ms", "load_cpu_us",
                                             "gateway_cpu_us") if k in r} for r in rs]
                   for side, rs in rounds.items()},
        "latency_rounds": [{side: {k: r[side][k] for k in ("rps", "p50_ms", "p99_ms")}
                            for side in r} for r in light],
    }


def report(f: dict, embedded: bool, kafka: KafkaSettings) -> None:
    rounds = f["rounds"]

    def rates(side: str) -> str:
        return ", ".join(f"{r['rps']:,.0f}" for r in rounds[side])

    print(f"one 16-word embed request each, 5 orgs, fake model at 0 ms; every service, the "
          f"gateway and the load in its own process; load generator {f['loadgen']}; best of "
          f"{f['repeat']} interleaved {f['seconds']:g} s rounds; broker "
          f"{'embedded Tansu' if embedded else kafka.bootstrap}; load average "
          f"{' '.join(f['loadavg_before'])}")
    print(f"{'':<44}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}   rounds (req/s)")
    for side, name in (("direct", "FairnessClient, direct"), ("gateway", "HTTP through the gateway")):
        load = f["loaded"][side]
        label = f"{name}, {f['concurrency']} in flight"
        print(f"{label:<44}{f[side + '_rps']:>10,.0f}"
              f"{load['p50_ms']:>9.1f}{load['p99_ms']:>9.1f}   {rates(side)}")
    print(f"  gateway_ratio: {f['gateway_ratio']:.3f}")
    print(f"  CPU per request: the direct client's process {f['direct_cpu_us']:.0f} us; the "
          f"gateway's {f['gateway_cpu_us']:.0f} us (its own client included), its load "
          f"generator's {f['loadgen_cpu_us']:.0f} us")
    print(f"both at once from one process, {f['latency_concurrency']} in flight each, "
          f"{f['repeat']} rounds (medians)")
    for side, name in (("direct", "FairnessClient, direct"), ("gateway", "HTTP through the gateway")):
        per = "direct" if side == "direct" else "http"
        print(f"{name:<44}{'':>10}{f[side + '_p50_ms']:>9.2f}{f[side + '_p99_ms']:>9.2f}   "
              + ", ".join(f"{r[per]['rps']:,.0f}" for r in f["latency_rounds"]))
    print(f"  added_p50_ms: {f['added_p50_ms']:.2f}   added_p99_ms: {f['added_p99_ms']:.2f}   "
          "per round: " + ", ".join(f"{a:+.1f} / {b:+.1f}" for a, b in
                                    zip(*f["added_per_round_ms"].values(), strict=True)))
    print(f"{f['waiting_requests']:,} requests waiting at the gateway (worker paused), "
          f"{f['sent']:,} sent: {f['statuses']}; RSS {f['rss_before_mib']:.1f} -> "
          f"{f['rss_waiting_mib']:.1f} MiB (after: {f['rss_after_mib']:.1f})")
    print(f"  rss_per_waiting_kib: {f['rss_per_waiting_kib']:.1f}   the direct client's own, "
          f"{f['waiting_requests']:,} waiting the same way: "
          f"{f['direct_rss_per_waiting_kib']:.1f}")


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["drive"]:
        drive_main(argv[1:])
        return None
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s rounds, 2 of each")
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of a round (default 8, quick 3)")
    parser.add_argument("--repeat", type=int, default=None, help="rounds of each (default 3)")
    parser.add_argument("--concurrency", type=int, default=256,
                        help="requests in flight in the throughput rounds")
    parser.add_argument("--latency-concurrency", type=int, default=4,
                        help="requests in flight in the latency rounds")
    parser.add_argument("--waiting", type=int, default=1000,
                        help="requests held waiting for the memory figure (also the "
                             "gateway's --max-waiting-requests)")
    parser.add_argument("--loadgen", choices=["wrk", "python"], default="wrk",
                        help="the HTTP load generator: wrk (install it) or an aiohttp client")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    add_kafka_arguments(parser)
    args = parser.parse_args(argv)
    return run_quietly(amain, args)


if __name__ == "__main__":
    main()

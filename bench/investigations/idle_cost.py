"""What the pipeline costs when nothing flows: each process's CPU, idle, side by side.

Why: every consumer with nothing to read sends the broker a fetch every
``fetch_max_wait_ms`` (10 ms, for latency), and with aiokafka each such
round trip is a few hundred microseconds of Python. On a machine where the
services share a core with the broker (the demo: one core for the broker,
admission, the scheduler and the traffic), that idle polling is CPU taken
from every quiet request's hops. The consumers that only follow slowly
changing state (the scheduler's state snapshots, at admission and at the
scheduler; the scheduler's leadership claims) are off every request's path
and wait ``follow_fetch_max_wait_ms`` instead; a client with no request in
flight waits ``idle_fetch_max_wait_ms``.

Three stacks, each service its own process (admission, scheduler, one
worker on the fake model), with one client (``FairnessClient``, in this
process) on one embedded broker, one after the other, rounds interleaved:

- ``all at 10 ms``: every consumer polls at ``fetch_max_wait_ms``
  (``SF_KAFKA_FOLLOW_FETCH_MAX_WAIT_MS=10``, ``SF_KAFKA_IDLE_FETCH_MAX_WAIT_MS=10``);
- ``followers slower``: the followers at ``follow_fetch_max_wait_ms``, the
  client at 10 ms (``SF_KAFKA_IDLE_FETCH_MAX_WAIT_MS=10``);
- ``and the idle client``: also the client at 50 ms while nothing is in
  flight (``SF_KAFKA_IDLE_FETCH_MAX_WAIT_MS=50``; the default is the busy
  wait, since the embedded broker holds an empty fetch for its whole wait:
  ``docs/benchmarks.md``, "An idle client").

Each round starts the stack, serves one request per org through the client
(so every consumer has joined and read), then samples every process's CPU
time (``/proc``) over ``--seconds`` with nothing sent and the client still
open; ``client`` is this process. The broker's figure is its whole
process: it serves the other stacks' leftovers too, so read it within a
round. Linux only.

Run: ``python bench/investigations/idle_cost.py`` (2 rounds of 10 s) or ``--quick``
(1 round of 5 s); ``--json OUT`` writes ``idle_cpu`` (the third side),
``idle_cpu_client_10ms``, ``idle_cpu_all_10ms``, ``ratio`` (the third
side's total over all at 10 ms) and ``client_ratio`` (client + broker,
the third side over the client at 10 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.processes import ProcessStack
from bench.figures import run_quietly
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import EMBEDDED_SESSION, EMBEDDED_SESSION_ENV, KafkaSettings, settings_from_env
from producer.client import FairnessClient
from schemas.build import build_config

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
SIDES = (
    ("all at 10 ms", {"SF_KAFKA_FOLLOW_FETCH_MAX_WAIT_MS": "10",
                      "SF_KAFKA_IDLE_FETCH_MAX_WAIT_MS": "10"}),
    ("followers slower", {"SF_KAFKA_IDLE_FETCH_MAX_WAIT_MS": "10"}),
    ("and the idle client", {"SF_KAFKA_IDLE_FETCH_MAX_WAIT_MS": "50"}),
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its threads so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_round(broker: EmbeddedBroker, env: dict[str, str], seconds: float
                     ) -> dict[str, float]:
    """CPU share (1.0 = one core) of each process over ``seconds`` with nothing sent."""
    built = build_config(base=(ROOT / "examples" / "config.toml").read_text(),
                         prefix=f"idle{uuid.uuid4().hex[:6]}.")
    kafka = settings_from_env(env, base=KafkaSettings(bootstrap=broker.bootstrap,
                                                      **EMBEDDED_SESSION))
    env = {"SF_LOG_LEVEL": "WARNING", **EMBEDDED_SESSION_ENV, **env}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(built.text)
        async with ProcessStack(path, broker.bootstrap, endpoints=["embed"], model="fake",
                                env=env) as stack, FairnessClient(kafka, built.config) as client:
            for org in built.config.orgs:
                rid = await client.submit({"org": org, "endpoint": "embed",
                                           "input": {"type": "embed", "texts": ["hi"]}})
                await client.result(rid, timeout=60)
            await asyncio.sleep(1.0)  # the last results' writes and commits settle
            pids = {name: stack.pid(name) for name in stack.procs}
            pids["broker"] = broker.pid
            pids["client"] = os.getpid()
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            t0 = time.monotonic()
            await asyncio.sleep(seconds)
            elapsed = time.monotonic() - t0
            return {name: (cpu_seconds(pid) - before[name]) / elapsed
                    for name, pid in pids.items()}


async def amain(args: argparse.Namespace) -> dict:
    rounds = 1 if args.quick else args.rounds
    seconds = 5.0 if args.quick else args.seconds
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _ in SIDES}
    async with EmbeddedBroker() as broker:
        for _ in range(rounds):
            for name, env in SIDES:
                samples[name].append(await idle_round(broker, env, seconds))

    def best(name: str) -> dict[str, float]:
        # The quietest round of each side: the machine is shared.
        return min(samples[name], key=lambda s: sum(s.values()))

    sides = [best(name) for name, _ in SIDES]
    procs = list(sides[0])
    print(f"idle CPU per process, % of one core, over {seconds:g} s with nothing sent "
          f"(quietest of {rounds} interleaved round(s) each)")
    print(f"{'process':<14}" + "".join(f"{name:>22}" for name, _ in SIDES))
    for p in procs:
        print(f"{p:<14}" + "".join(f"{side[p] * 100:>22.1f}" for side in sides))
    totals = [sum(side.values()) for side in sides]
    print(f"{'total':<14}" + "".join(f"{t * 100:>22.1f}" for t in totals))
    ratio = totals[2] / totals[0] if totals[0] else float("nan")
    print(f"  ratio (the idle client at 50 ms / all at 10 ms): {ratio:.2f}")

    def client_cost(side: dict[str, float]) -> float:
        return side["client"] + side["broker"]

    client_ratio = (client_cost(sides[2]) / client_cost(sides[1]) if client_cost(sides[1])
                    else float("nan"))
    print(f"  client_ratio (client + broker, the idle client at 50 ms / at 10 ms): "
          f"{client_ratio:.2f}")
    return {"seconds": seconds, "rounds": rounds, "idle_cpu": sides[2],
            "idle_cpu_client_10ms": sides[1], "idle_cpu_all_10ms": sides[0],
            "ratio": ratio, "client_ratio": client_ratio}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 5 s")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side (default 2)")
    parser.add_argument("--seconds", type=float, default=10.0, help="idle seconds sampled")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    return run_quietly(amain, args)


if __name__ == "__main__":
    main()

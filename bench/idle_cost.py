"""What the pipeline costs when nothing flows: each process's CPU, idle, side by side.

Why: every consumer with nothing to read sends the broker a fetch every
``fetch_max_wait_ms`` (10 ms, for latency), and with aiokafka each such
round trip is a few hundred microseconds of Python. On a machine where the
services share a core with the broker (the demo: one core for the broker,
admission, the scheduler and the traffic), that idle polling is CPU taken
from every quiet request's hops. The consumers that only follow slowly
changing state (the scheduler's state snapshots, at admission and at the
scheduler; the scheduler's leadership claims) are off every request's path
and wait ``follow_fetch_max_wait_ms`` instead.

Two stacks, each service its own process (admission, scheduler, one worker
on the fake model), on one embedded broker, one after the other, rounds
interleaved:

- ``all at fetch_max_wait_ms``: every consumer polls at 10 ms (as before
  ``follow_fetch_max_wait_ms``: ``SF_KAFKA_FOLLOW_FETCH_MAX_WAIT_MS=10``);
- ``followers at follow_fetch_max_wait_ms``: the default settings.

Each round starts the stack, serves one request per org (so every consumer
has joined and read), then samples every process's CPU time (``/proc``)
over ``--seconds`` with nothing sent. The broker's figure is its whole
process: it serves the other stack's leftovers too, so read it within a
round. Linux only.

Run: ``python bench/idle_cost.py`` (2 rounds of 10 s) or ``--quick``
(1 round of 5 s); ``--json OUT`` writes ``idle_cpu``, ``idle_cpu_all_10ms``
and ``ratio`` (the first total over the second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.processes import ProcessStack
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from plumbing.logs import configure_logging
from producer.client import FairnessClient
from schemas.build import build_config

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
SIDES = (
    ("all at fetch_max_wait_ms", {"SF_KAFKA_FOLLOW_FETCH_MAX_WAIT_MS": "10"}),
    ("followers at follow_fetch_max_wait_ms", {}),
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
    kafka = KafkaSettings(bootstrap=broker.bootstrap, session_timeout_ms=2000,
                          heartbeat_interval_ms=500)
    env = {"SF_LOG_LEVEL": "WARNING", "SF_KAFKA_SESSION_TIMEOUT_MS": "2000",
           "SF_KAFKA_HEARTBEAT_INTERVAL_MS": "500", **env}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(built.text)
        async with ProcessStack(path, broker.bootstrap, endpoints=["embed"], model="fake",
                                env=env) as stack:
            async with FairnessClient(kafka, built.config) as client:
                for org in built.config.orgs:
                    rid = await client.submit({"org": org, "endpoint": "embed",
                                               "input": {"type": "embed", "texts": ["hi"]}})
                    await client.result(rid, timeout=60)
            await asyncio.sleep(1.0)  # the last results' writes and commits settle
            pids = {name: stack.pid(name) for name in stack.procs}
            pids["broker"] = broker.pid
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

    old, new = best(SIDES[0][0]), best(SIDES[1][0])
    procs = list(old)
    print(f"idle CPU per process, % of one core, over {seconds:g} s with nothing sent "
          f"(quietest of {rounds} interleaved round(s) each)")
    print(f"{'process':<14}{SIDES[0][0]:>28}{SIDES[1][0]:>40}")
    for p in procs:
        print(f"{p:<14}{old[p] * 100:>28.1f}{new[p] * 100:>40.1f}")
    total_old, total_new = sum(old.values()), sum(new.values())
    print(f"{'total':<14}{total_old * 100:>28.1f}{total_new * 100:>40.1f}")
    ratio = total_new / total_old if total_old else float("nan")
    print(f"  ratio (followers at their wait / all at 10 ms): {ratio:.2f}")
    return {"seconds": seconds, "rounds": rounds, "idle_cpu": new, "idle_cpu_all_10ms": old,
            "ratio": ratio}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 5 s")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side (default 2)")
    parser.add_argument("--seconds", type=float, default=10.0, help="idle seconds sampled")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    figures = asyncio.run(amain(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()

"""What an idle client's longer fetch wait costs a request: round trips after an idle spell.

Why: a ``FairnessClient`` with no request in flight polls its reply topic at
``idle_fetch_max_wait_ms`` instead of ``fetch_max_wait_ms`` (10 ms); a longer
idle wait saves CPU in the client and the broker (``bench/investigations/idle_cost.py``).
The default is the busy wait (the embedded broker holds an empty fetch for
its whole wait, ``docs/benchmarks.md``, "An idle client"). The fetch in
progress when a request is sent keeps its wait; this measures what that
costs the request: two clients on one pipeline (``app.stack.Stack``, fake
model, embedded broker), one with the idle wait at 10 ms and one at
``--idle-ms`` (50), taking turns: each sleeps ``--idle-s`` (0.3 s, with a
little jitter) with nothing in flight, then sends one request and waits for
its result. Side by side: p50 / p90 / max of those round trips.

Run: ``python bench/investigations/client_idle.py`` (150 requests each) or ``--quick``
(40); ``--json OUT`` writes per side ``p50_ms``, ``p90_ms``, ``max_ms`` and
``p50_ratio`` (``--idle-ms``'s p50 over 10 ms's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import msgspec

from app.stack import Stack
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import EMBEDDED_SESSION, KafkaSettings
from plumbing.logs import configure_logging
from producer.client import FairnessClient
from schemas.build import build_config
from traffic.percentile import percentile

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]


async def amain(n: int, idle_s: float, idle_ms: int) -> dict:
    waits = (KafkaSettings().fetch_max_wait_ms, idle_ms)
    if len(set(waits)) < 2:
        raise ValueError(f"--idle-ms {idle_ms} is the busy wait: nothing to compare")
    with EmbeddedBroker() as broker:
        base = KafkaSettings(bootstrap=broker.bootstrap, **EMBEDDED_SESSION)
        config = build_config(base=(ROOT / "examples" / "config.toml").read_text(),
                              prefix=f"idlec{uuid.uuid4().hex[:6]}.").config
        async with Stack(config, base, model="fake", endpoints=["embed"]):
            clients = {w: FairnessClient(msgspec.structs.replace(
                base, idle_fetch_max_wait_ms=w), config) for w in waits}
            for c in clients.values():
                await c.start()
            try:
                ms: dict[int, list[float]] = {w: [] for w in waits}
                for i in range(n + 1):
                    for w, c in clients.items():
                        await asyncio.sleep(idle_s + (i % 7) * 0.013)
                        t0 = time.perf_counter()
                        rid = await c.submit({"org": "acme", "endpoint": "embed",
                                              "input": {"type": "embed", "texts": ["hello"]}})
                        await c.result(rid, timeout=30)
                        if i:  # the first of each is a warm-up
                            ms[w].append((time.perf_counter() - t0) * 1000)
            finally:
                for c in clients.values():
                    await c.stop()
    sides = {}
    for w, v in ms.items():
        v.sort()
        sides[str(w)] = {"p50_ms": percentile(v, 50), "p90_ms": percentile(v, 90),
                         "max_ms": v[-1], "n": len(v)}
    return {"idle_s": idle_s, "waits_ms": list(waits), "sides": sides,
            "p50_ratio": sides[str(waits[1])]["p50_ms"] / sides[str(waits[0])]["p50_ms"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 requests per side")
    parser.add_argument("--requests", type=int, help="requests per side (default 150)")
    parser.add_argument("--idle-s", type=float, default=0.3, help="idle spell before each")
    parser.add_argument("--idle-ms", type=int, default=50,
                        help="the second client's idle fetch wait (the first's is 10)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    n = args.requests or (40 if args.quick else 150)
    f = asyncio.run(amain(n, args.idle_s, args.idle_ms))
    print(f"one request after each {args.idle_s:g} s idle spell, {n} per side, turns "
          f"interleaved; pipeline in one process, fake model, embedded broker")
    print(f"{'client idle fetch wait':<26}{'p50 ms':>9}{'p90 ms':>9}{'max ms':>9}")
    for w, side in f["sides"].items():
        print(f"{w + ' ms':<26}{side['p50_ms']:>9.1f}{side['p90_ms']:>9.1f}"
              f"{side['max_ms']:>9.1f}")
    print(f"  p50_ratio ({f['waits_ms'][1]} ms / {f['waits_ms'][0]} ms): {f['p50_ratio']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(f, indent=2) + "\n")
    return f


if __name__ == "__main__":
    main()

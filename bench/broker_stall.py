"""A broker that stops answering mid-run: what a stall costs, and that nothing is lost.

The embedded broker is frozen (SIGSTOP) for ``--stall-s`` seconds while a
:class:`~producer.client.FairnessClient` sends ``--rate`` requests a second
through the pipeline (processes: admission, scheduler, a worker; fake
model), then thawed (SIGCONT). Nothing is restarted and nothing is lost by
the broker, so every request must come back exactly once (the client
delivers each id once; it counts the copies it dropped).

Run twice, side by side: with the pipeline's produce timeout
(``produce_timeout_ms``, 5 s) and with aiokafka's default (40 s). A produce
the broker does not answer, or keeps answering with a retriable error (as
Tansu once did with NotLeaderForPartition), is retried by aiokafka until
that timeout, then handed to the service's own retry; so the timeout is
what one stalled produce can cost.

Printed per setting: requests sent, answered, unanswered (must be 0), the
requests counted by id (submit failed, handed over twice, results for ids
never sent: each must be 0; the exit status is 1 otherwise), copies dropped
by the client, the latency of requests sent before, during
and after the stall (p50 / p99 / max), and the recovery: from the thaw to
the first result of a request sent after it.

Run: ``python bench/broker_stall.py`` (about a minute on 2 cores);
``--json OUT`` writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.processes import ProcessStack
from bench.crash import config as crash_config
from bench.loadgen import Load, percentile
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from producer.client import FairnessClient

__all__ = ["main", "passed", "report", "run"]


def _lat_ms(outcomes) -> dict[str, float | None]:
    xs = sorted((o.done_s - o.sent_s) * 1000 for o in outcomes if o.done_s is not None)
    return {"p50": percentile(xs, 50), "p99": percentile(xs, 99),
            "max": xs[-1] if xs else None, "n": len(xs)}


async def run(*, produce_timeout_ms: int, rate: float = 50.0, before_s: float = 5.0,
              stall_s: float = 8.0, after_s: float = 8.0, session_ms: int = 2000,
              say=print) -> dict:
    """The scenario at one produce timeout; returns its figures."""
    figures: dict = {"produce_timeout_ms": produce_timeout_ms, "rate": rate,
                     "stall_s": stall_s}
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "stall.toml"
        # A worker is lost only after its timeout: longer than the stall, so the
        # stall alone is measured (the worker-timeout path has its own tests).
        built = crash_config(model="fake:ms_per_token=0.3,ms_per_batch=5",
                             worker_timeout_ms=int((stall_s + 10) * 1000), prefix="stall.")
        cfg_path.write_text(built.text)
        env = {"SF_KAFKA_SESSION_TIMEOUT_MS": str(int((stall_s + 10) * 1000)),
               "SF_KAFKA_HEARTBEAT_INTERVAL_MS": str(max(100, session_ms // 4)),
               "SF_KAFKA_PRODUCE_TIMEOUT_MS": str(produce_timeout_ms), "SF_LOG_LEVEL": "WARNING"}
        async with EmbeddedBroker() as broker:
            kafka = KafkaSettings(bootstrap=broker.bootstrap, client_id="stall-bench",
                                  produce_timeout_ms=produce_timeout_ms)
            stack = ProcessStack(cfg_path, broker.bootstrap, endpoints=["embed"], env=env)
            await stack.start(timeout_s=180)
            async with FairnessClient(kafka, built.config) as client:
                load = Load(client, ["acme", "bulk", "quiet"], rate).start()
                try:
                    await asyncio.sleep(before_s)
                    frozen_s = time.monotonic()
                    os.kill(broker.pid, signal.SIGSTOP)
                    say(f"broker frozen for {stall_s:g} s")
                    try:
                        await asyncio.sleep(stall_s)
                    finally:
                        os.kill(broker.pid, signal.SIGCONT)
                    thawed_s = time.monotonic()
                    await asyncio.sleep(after_s)
                    load.stop_sending()
                    drained = await load.drain(timeout_s=60 + produce_timeout_ms / 1000)
                    figures["drained"] = drained
                    figures["duplicates_dropped"] = client.duplicates
                finally:
                    await load.close()
            figures["failed_process"] = stack.failed()
            await stack.stop()
    tally = load.tally()
    sent = list(load.sent.values())
    before = [o for o in sent if o.sent_s < frozen_s]
    during = [o for o in sent if frozen_s <= o.sent_s < thawed_s]
    after = [o for o in sent if o.sent_s >= thawed_s]
    figures |= {"sent": tally.sent, "answered": tally.answered,
                # No result, whether its submit raised or not.
                "unanswered": len(tally.lost) + len(tally.submit_failed),
                "submit_failed": len(tally.submit_failed), "duplicated": len(tally.duplicated),
                "foreign": sum(tally.foreign.values()), "by_id": tally.line(),
                "statuses": dict(load.statuses()), "submit_errors": dict(load.submit_errors),
                "before_ms": _lat_ms(before), "during_ms": _lat_ms(during),
                "after_ms": _lat_ms(after)}
    firsts = [o.done_s for o in after if o.done_s is not None]
    figures["recovery_s"] = round(min(firsts) - thawed_s, 2) if firsts else None
    return figures


def report(rows: list[dict]) -> str:
    def lat(d):
        return "/".join("-" if d[k] is None else f"{d[k]:,.0f}" for k in ("p50", "p99", "max"))

    out = [(f"{'produce timeout':>16}{'sent':>7}{'answered':>9}{'unanswered':>11}"
           f"{'copies dropped':>15}  {'before p50/p99/max ms':>22}  {'during':>20}"
           f"  {'after':>18}  {'recovery s':>10}")]
    for f in rows:
        out.append(f"{f['produce_timeout_ms']:>14} ms{f['sent']:>7}{f['answered']:>9}"
                   f"{f['unanswered']:>11}{f['duplicates_dropped']:>15}  "
                   f"{lat(f['before_ms']):>22}  {lat(f['during_ms']):>20}  "
                   f"{lat(f['after_ms']):>18}  {f['recovery_s']!s:>10}")
    out.extend(f"{f['produce_timeout_ms']:>14} ms  counted by id: {f['by_id']}; submit errors "
               f"{f['submit_errors']}" for f in rows)
    out.append(f"broker frozen (SIGSTOP) {rows[0]['stall_s']:g} s at {rows[0]['rate']:g} "
               "requests/s; statuses: " + "; ".join(str(f["statuses"]) for f in rows))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=50.0, help="requests per second")
    p.add_argument("--stall-s", type=float, default=8.0, help="how long the broker is frozen")
    p.add_argument("--timeouts", default="5000,40000",
                   help="produce timeouts (ms) to run, side by side")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    rows = []
    for t in (int(x) for x in args.timeouts.split(",")):
        rows.append(asyncio.run(run(produce_timeout_ms=t, rate=args.rate,
                                    stall_s=args.stall_s)))
    print(report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0 if all(passed(r) for r in rows) else 1


def passed(f: dict) -> bool:
    """Every request back exactly once: none unanswered, none failed to submit, none twice."""
    return (f["drained"] and f["unanswered"] == 0 and f["submit_failed"] == 0
            and f["duplicated"] == 0 and f["foreign"] == 0)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

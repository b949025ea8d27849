"""Crash each service in turn under steady load; every request must get one result.

The pipeline runs as processes (:class:`app.processes.ProcessStack`) on
an embedded broker: two schedulers (active and standby), admission, and two
workers sharing the endpoint (scale-out: more members of its group) with a
fake model. A :class:`~producer.client.FairnessClient` sends ``--rate``
requests a second throughout. Then, one after another, with ``--phase-s``
of steady load between:

1. ``kill -9`` the leading scheduler; the standby takes over (measured: until
   its ``/readyz`` says it leads, and until the first result of a batch it
   dispatched); the killed one is restarted and becomes the standby;
2. ``kill -9`` one worker, restart it after ``--phase-s``;
3. ``kill -9`` admission, restart it at once (its successor waits for the dead
   member's session to expire before it gets the ingress partitions);
4. pause the leading scheduler (SIGSTOP) for ``--pause-s`` (longer than the
   leader silence), then let it go on (SIGCONT): the standby takes over
   (measured as in 1.), and no batch of the paused leader's may be taken by
   a worker after the first batch of its successor's was dispatched
   (``paused_served_after_successor``, from the results' stamps).

Load stops, the run waits for every result, and prints: requests sent,
results received (by status), the requests counted by id (lost: submitted
with no result; submit failed; handed over twice; results for ids never
sent: each must be 0), copies the client dropped
(``client.duplicates``), requests dispatched twice (in two batches, read back
from the reply topic; counted against the crash that followed their
submission), and the recovery times. Scheduler takeovers no longer depend on
the group session (``--session-ms`` moves the workers' and admission's): the
standby leads ``leader_silence_ms`` (``--silence-ms``, 1 s) after the
leader's last beat.

Run: ``python bench/crash.py`` (about 1.5 min on 2 cores; ``--json`` writes
the figures). The CI test runs it with shorter phases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.processes import ProcessStack
from bench.figures import write_json
from bench.loadgen import Load, reply_copies
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from producer.client import FairnessClient
from schemas.build import Built, build_config

__all__ = ["config", "main", "passed", "run"]


def config(*, model: str, worker_timeout_ms: int, prefix: str = "crash.") -> Built:
    """Two tiers, three orgs, one embed endpoint that two workers share; few partitions."""
    return build_config(
        prefix=prefix, worker_slots=2, worker_timeout_ms=worker_timeout_ms, heartbeat_ms=250,
        state_interval_ms=200, tier_partitions=4, ingress_partitions=4, results_partitions=1,
        endpoints={"embed": {"model": model, "quantum": 256, "max_batch_tokens": 256,
                             "max_batch_size": 16, "max_request_tokens": 256,
                             "latency_target_ms": 30000, "partitions": 4}},
        orgs={"acme": "gold", "bulk": "free", "quiet": "free"})


async def _until(cond, timeout_s: float, step_s: float = 0.05) -> float | None:
    """Seconds until ``cond()`` (a bool, or an awaitable of one) is true; None at the timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return time.monotonic() - t0
        await asyncio.sleep(step_s)
    return None


def _first_result_after(load: Load, wall_ms: int, since_s: float) -> float | None:
    """Seconds from ``since_s`` to the first result of a batch dispatched after ``wall_ms``."""
    done = [o.done_s for o in load.sent.values()
            if o.result is not None and o.done_s is not None
            and (o.result.dispatched_ms or 0) >= wall_ms]
    return min(done) - since_s if done else None


async def run(*, rate: float = 40.0, phase_s: float = 6.0, session_ms: int = 2000,
              silence_ms: int = 1000, pause_s: float | None = None,
              model: str = "fake:ms_per_token=0.3,ms_per_batch=5", drain_s: float = 90.0,
              log: IO[str] | None = None, say=print) -> dict:
    """The whole scenario; returns its figures. ``pause_s``: how long the leader is frozen
    in the last phase (default: 2.5 silences, at least 2 s)."""
    pause_s = max(2.5 * silence_ms / 1000, 2.0) if pause_s is None else pause_s
    if pause_s * 1000 <= silence_ms:
        raise ValueError(f"pause_s ({pause_s}) must be longer than the silence ({silence_ms} ms)")
    figures: dict = {"rate": rate, "phase_s": phase_s, "session_ms": session_ms,
                     "silence_ms": silence_ms, "pause_s": pause_s}
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "crash.toml"
        built = config(model=model, worker_timeout_ms=max(1500, session_ms + 500))
        cfg_path.write_text(built.text)
        env = {"SF_KAFKA_SESSION_TIMEOUT_MS": str(session_ms),
               "SF_KAFKA_HEARTBEAT_INTERVAL_MS": str(max(100, session_ms // 4)),
               "SF_SCHEDULER_LEADER_SILENCE_MS": str(silence_ms)}
        async with EmbeddedBroker() as broker:
            kafka = KafkaSettings(bootstrap=broker.bootstrap, client_id="crash-bench")
            stack = ProcessStack(cfg_path, broker.bootstrap, endpoints=["embed"], log=log,
                                 env=env, schedulers=2, workers=2)
            t0 = time.monotonic()
            await stack.start(timeout_s=180)
            figures["startup_s"] = round(time.monotonic() - t0, 1)
            say(f"pipeline up in {figures['startup_s']} s: {sorted(stack.procs)}")
            async with FairnessClient(kafka, built.config) as client:
                load = Load(client, ["acme", "bulk", "quiet"], rate).start()
                try:
                    await _scenario(stack, load, phase_s, pause_s, figures, say)
                    load.stop_sending()
                    drained = await load.drain(drain_s)
                    figures["drained"] = drained
                    copies, batches = await reply_copies(kafka, client.reply_topic)
                    figures["client_duplicates_dropped"] = client.duplicates
                finally:
                    await load.close()
                figures["failed_process"] = stack.failed()
            await stack.stop()
    sent = load.sent
    tally = load.tally()
    figures["sent"] = tally.sent
    figures["results"] = tally.answered
    figures["lost"] = len(tally.lost)
    figures["submit_failed"] = len(tally.submit_failed)
    figures["duplicated"] = len(tally.duplicated)
    figures["foreign"] = sum(tally.foreign.values())
    figures["by_id"] = tally.line()
    figures["statuses"] = dict(load.statuses())
    figures["copies_written"] = sum(copies.values())
    twice = [rid for rid, b in batches.items() if len(b) > 1]
    figures["dispatched_twice"] = len(twice)
    figures["dispatched_twice_by_crash"] = _by_crash(twice, sent, figures["kills"])
    figures.update(_paused_figures(sent, figures.pop("paused_instances", None)))
    figures["submit_errors"] = dict(load.submit_errors)
    # Scale-out: how the two workers (and the restarted one, a new id) shared the load.
    figures["served_by_worker"] = dict(Counter(o.result.worker for o in sent.values()
                                               if o.result is not None and o.result.worker))
    return figures


async def _scenario(stack: ProcessStack, load: Load, phase_s: float, pause_s: float,
                    figures: dict, say) -> None:
    kills = figures["kills"] = []
    await asyncio.sleep(phase_s)
    # 1. the active scheduler
    leader = await stack.leader()
    standby = next(n for n in stack.procs if n.startswith("scheduler") and n != leader)
    kill_ms, kill_s = int(time.time() * 1000), time.monotonic()
    stack.kill(leader)
    kills.append(("scheduler", kill_s))
    say(f"killed {leader} (the leader)")
    took = await _until(lambda: _is_ready(stack, standby), 60)
    figures["scheduler_takeover_s"] = None if took is None else round(took, 2)
    first = await _until(lambda: _first_result_after(load, kill_ms, kill_s) is not None, 30)
    figures["scheduler_first_result_s"] = (
        None if first is None else round(_first_result_after(load, kill_ms, kill_s), 2))
    say(f"{standby} leads after {figures['scheduler_takeover_s']} s; first result of its "
        f"batches {figures['scheduler_first_result_s']} s after the kill")
    stack.restart(leader)
    await stack.wait_ready(120)
    await asyncio.sleep(phase_s)
    # 2. one of the two workers
    victim = "worker-embed-2"
    kill_ms, kill_s = int(time.time() * 1000), time.monotonic()
    stack.kill(victim)
    kills.append(("worker", kill_s))
    say(f"killed {victim}")
    await asyncio.sleep(phase_s)
    stack.restart(victim)
    took = await _until(lambda: _is_ready(stack, victim), 60)
    figures["worker_rejoin_s"] = None if took is None else round(took, 2)
    await stack.wait_ready(120)
    say(f"{victim} restarted, ready after {figures['worker_rejoin_s']} s")
    await asyncio.sleep(phase_s)
    # 3. admission
    kill_ms, kill_s = int(time.time() * 1000), time.monotonic()
    stack.kill("admission")
    kills.append(("admission", kill_s))
    say("killed admission")
    stack.restart("admission")
    took = await _until(lambda: _is_ready(stack, "admission"), 60)
    figures["admission_ready_s"] = None if took is None else round(took, 2)
    sent_after = min((o.sent_s for o in load.sent.values() if o.sent_ms >= kill_ms),
                     default=None)
    first = await _until(lambda: _first_sent_after_done(load, kill_ms) is not None, 60)
    done = _first_sent_after_done(load, kill_ms)
    figures["admission_first_result_s"] = (
        None if first is None or sent_after is None else round(done - kill_s, 2))
    say(f"admission ready {figures['admission_ready_s']} s after the kill; first result of a "
        f"request sent after the kill {figures['admission_first_result_s']} s after it")
    await asyncio.sleep(phase_s)
    # 4. the active scheduler, paused longer than the leader silence, then let go on
    leader = await stack.leader()
    standby = next(n for n in stack.procs if n.startswith("scheduler") and n != leader)
    old = await _instance(stack, leader)
    kill_ms, kill_s = int(time.time() * 1000), time.monotonic()
    stack.pause(leader)
    kills.append(("pause", kill_s))
    say(f"paused {leader} (the leader, instance {old}) for {pause_s} s")
    leads = asyncio.ensure_future(_until(lambda: _is_ready(stack, standby), 60))
    try:
        await asyncio.sleep(pause_s)
    finally:
        stack.resume(leader)
    took = await leads
    figures["paused_takeover_s"] = None if took is None else round(took, 2)
    first = await _until(lambda: _first_result_after(load, kill_ms, kill_s) is not None, 30)
    figures["paused_first_result_s"] = (
        None if first is None else round(_first_result_after(load, kill_ms, kill_s), 2))
    figures["paused_instances"] = (old, await _instance(stack, standby))
    say(f"{standby} leads after {figures['paused_takeover_s']} s; first result of its batches "
        f"{figures['paused_first_result_s']} s after the pause; {leader} resumed")
    await asyncio.sleep(phase_s)
    figures["paused_leader_stands_by"] = not (await stack.ready(leader))[0]


async def _instance(stack: ProcessStack, name: str) -> str | None:
    """The scheduler instance id a leading ``name`` names in its /readyz."""
    with contextlib.suppress(Exception):
        ok, why = await stack.ready(name)
        if ok and (m := re.search(r"instance (\w+)", why)):
            return m.group(1)
    return None


def _paused_figures(sent: dict, instances: tuple[str | None, str | None] | None) -> dict:
    """Batches of the paused leader a worker took after its successor's first batch went out."""
    if not instances or None in instances:
        return {"paused_served_after_successor": None, "successor_first_dispatch_ms": None}
    old, new = instances
    results = [o.result for o in sent.values() if o.result is not None and o.result.batch_id]
    first = min((r.dispatched_ms for r in results
                 if r.batch_id.split("-")[0] == new and r.dispatched_ms), default=None)
    late = [r for r in results if first is not None and r.batch_id.split("-")[0] == old
            and (r.taken_ms or 0) >= first]
    return {"paused_served_after_successor": len(late), "successor_first_dispatch_ms": first}


def _by_crash(ids: list[str], sent: dict, kills: list[tuple[str, float]]) -> dict[str, int]:
    """Each request dispatched twice, counted against the first crash after it was sent."""
    out: dict[str, int] = {name: 0 for name, _ in kills}
    out["none"] = 0
    for rid in ids:
        t = sent[rid].sent_s if rid in sent else None
        name = next((n for n, k in kills if t is not None and k >= t), "none")
        out[name] += 1
    return out


def _first_sent_after_done(load: Load, wall_ms: int) -> float | None:
    done = [o.done_s for o in load.sent.values()
            if o.sent_ms >= wall_ms and o.done_s is not None]
    return min(done) if done else None


async def _is_ready(stack: ProcessStack, name: str) -> bool:
    with contextlib.suppress(Exception):
        return (await stack.ready(name))[0]
    return False


def report(f: dict) -> str:
    lines = [
        f"requests sent              {f['sent']}",
        f"results received           {f['results']}  {f['statuses']}",
        f"lost (no result)           {f['lost']}",
        f"counted by id              {f['by_id']}",
        f"submit errors              {f['submit_errors']}",
        (f"copies written / dropped   {f['copies_written']} written, "
         f"{f['client_duplicates_dropped']} dropped by the client"),
        f"served by worker           {f.get('served_by_worker')}",
        (f"dispatched twice           {f['dispatched_twice']} "
         f"(by the crash that followed their submission: {f['dispatched_twice_by_crash']})"),
        (f"scheduler takeover         {f['scheduler_takeover_s']} s to /readyz ok, first "
         f"result {f['scheduler_first_result_s']} s after the kill"),
        f"worker restart             ready {f['worker_rejoin_s']} s after its restart",
        (f"admission restart          ready {f['admission_ready_s']} s, first new result "
         f"{f['admission_first_result_s']} s after the kill"),
        (f"paused leader             successor leads {f.get('paused_takeover_s')} s after "
         f"the SIGSTOP, first result {f.get('paused_first_result_s')} s; the paused "
         f"leader's results taken after the successor's first batch: "
         f"{f.get('paused_served_after_successor')}; it stands by after SIGCONT: "
         f"{f.get('paused_leader_stands_by')}"),
        f"process died unexpectedly  {f['failed_process']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=40.0, help="requests per second (default 40)")
    p.add_argument("--phase-s", type=float, default=8.0,
                   help="steady load before and between crashes (default 8)")
    p.add_argument("--session-ms", type=int, default=2000,
                   help="consumer-group session of every service (default 2000)")
    p.add_argument("--silence-ms", type=int, default=1000,
                   help="the schedulers' leader_silence_ms (default 1000)")
    p.add_argument("--pause-s", type=float, default=None,
                   help="how long the leader is frozen in the last phase (default: 2.5 "
                        "silences, at least 2 s)")
    p.add_argument("--log-file", default=None, help="keep the services' JSON logs here")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    with open(args.log_file or os.devnull, "w") as log:
        figures = asyncio.run(run(rate=args.rate, phase_s=args.phase_s,
                                  session_ms=args.session_ms, silence_ms=args.silence_ms,
                                  pause_s=args.pause_s, log=log))
    print(report(figures))
    write_json(args.json, figures)
    return 0 if passed(figures) else 1


def passed(f: dict) -> bool:
    """Every request one result: none lost, none failed to submit, none twice, none foreign."""
    return (f["drained"] and f["lost"] == 0 and f["submit_failed"] == 0
            and f["duplicated"] == 0 and f["foreign"] == 0)


if __name__ == "__main__":
    sys.exit(main())

"""Restart the embedded broker under load: it comes back empty, the pipeline must too.

``EmbeddedBroker.restart(grace_s=0)`` kills Tansu and starts it again on the
same port with nothing in it: no topics, records, groups or offsets. The
services (processes: two schedulers, admission, a worker, fake model) and a
:class:`~producer.client.FairnessClient` sending ``--rate`` requests a
second must notice (:mod:`plumbing.topickeeper`), recreate the topics and go
on, and the client must get an answer or a clear error for every request:
a result, or :class:`~producer.client.ResultLost` for what the broker lost.

A request the client declares lost is submitted again under a new id
(``<id>:again1``: a late result of the first submission and the result of
the second stay apart), as :class:`~producer.client.ResultLost` tells a
caller to, and so is a request whose ``submit()`` raised (the other clear
error a caller can get; a second later), up to three times, so the run can
check that nothing is lost end to end. Everything is
counted by id (:meth:`bench.loadgen.Load.tally`). What must hold (the exit
status, and ``tests/integration/test_broker_restart.py``):

* every request sent gets a result, a lost one after its resubmission
  (``unanswered`` = 0: a declared loss is not an answer);
* no submit failed without an answer (``submit_failed`` = 0: its
  resubmission answered it), no id was handed over twice (``duplicated`` = 0) and no result
  came for an id this run never sent (``foreign`` = 0);
* only a request the restart could have caught may be declared lost: one
  in flight at the restart or sent before the pipeline was back
  (``exposed``); none sent after (``lost_after_recovery`` = 0), and no more
  than were exposed (``declared_lost <= exposed``).

Prints: requests sent before and after the restart, results, requests
declared lost (and resubmitted), requests left without a result, the
recovery time (restart to the first result of a request sent after it),
and the ``broker_restarted`` lines per service (one each).

Run: ``python bench/broker_restart.py`` (about 40 s on 2 cores; ``--json``
writes the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.processes import ProcessStack
from bench.crash import config as crash_config
from bench.figures import write_json
from bench.loadgen import Load
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings
from producer.client import FairnessClient

__all__ = ["main", "passed", "report", "run"]


def _restart_lines(log_path: Path) -> Counter:
    """``broker_restarted`` lines in the services' JSON log, per service."""
    out: Counter = Counter()
    with open(log_path) as f:
        for line in f:
            if '"broker_restarted"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "broker_restarted":
                out[rec.get("service", "?")] += 1
    return out


#: A resubmission's id: the request's own, then this, then the attempt (1, 2, ...).
AGAIN = ":again"
#: Most resubmissions of one request.
MAX_AGAIN = 3
#: After a submit raised, how long before the request is sent again.
RETRY_AFTER_S = 1.0


class _Resubmitter:
    """Sends a request again, under a new id, when the client declares it lost or its submit raised.

    As a caller following :class:`~producer.client.ResultLost` would: each
    request up to :data:`MAX_AGAIN` times, a failed submit after
    :data:`RETRY_AFTER_S`, a loss at once; a resubmission that is itself
    declared lost, or whose submit raised, is sent again the same way.
    """

    def __init__(self, client: FairnessClient, load: Load) -> None:
        self.client, self.load = client, load
        #: Request id -> when the client declared its first submission lost.
        self.declared: dict[str, float] = {}
        #: Request id -> the ids it was sent again under, in order.
        self.attempts: dict[str, list[str]] = {}
        #: Exceptions of resubmissions that raised, by type.
        self.errors: Counter = Counter()
        self._handled: set[str] = set()
        self._retry_at: dict[str, float] = {}

    def origin(self, wire_id: str) -> str:
        return wire_id.split(AGAIN)[0]

    def again_results(self, rid: str) -> int:
        """Results received for ``rid``'s resubmissions (each id once, if all is well)."""
        return sum(self.load.foreign.get(w, 0) for w in self.attempts.get(rid, ()))

    def answered(self, rid: str) -> bool:
        o = self.load.sent.get(rid)
        return (o is not None and o.result is not None) or self.again_results(rid) > 0

    async def _again(self, rid: str) -> None:
        tries = self.attempts.setdefault(rid, [])
        if self.answered(rid) or len(tries) >= MAX_AGAIN:
            return
        wire = f"{rid}{AGAIN}{len(tries) + 1}"
        tries.append(wire)
        try:
            await self.client.submit({"id": wire, "org": self.load.sent[rid].org,
                                      "endpoint": self.load.endpoint,
                                      "input": {"type": "embed", "texts": ["lost, sent again"]}})
        except Exception as e:  # noqa: BLE001 - counted; sent again after a pause
            self.errors[type(e).__name__] += 1
            self._retry_at[rid] = time.monotonic() + RETRY_AFTER_S

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            for wire in self.client.lost_requests():
                rid = self.origin(wire)
                if wire in self._handled or rid not in self.load.sent:
                    continue
                self._handled.add(wire)
                if wire == rid:
                    self.declared[rid] = now
                await self._again(rid)
            for rid, o in list(self.load.sent.items()):
                if o.submit_error and rid not in self._handled:
                    self._handled.add(rid)
                    self._retry_at[rid] = now + RETRY_AFTER_S
            for rid, at in list(self._retry_at.items()):
                if at <= now:
                    del self._retry_at[rid]
                    await self._again(rid)
            await asyncio.sleep(0.2)

    def unanswered(self) -> list[str]:
        return [rid for rid in self.load.sent if not self.answered(rid)]


async def run(*, rate: float = 30.0, before_s: float = 5.0, after_s: float = 12.0,
              session_ms: int = 2000, lost_grace_s: float = 8.0, log_path: str | None = None,
              say=print) -> dict:
    """The scenario; returns its figures."""
    figures: dict = {"rate": rate, "before_s": before_s, "after_s": after_s}
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "restart.toml"
        built = crash_config(model="fake:ms_per_token=0.3,ms_per_batch=5",
                             worker_timeout_ms=session_ms + 500, prefix="restart.")
        cfg_path.write_text(built.text)
        log_path = Path(log_path) if log_path else Path(tmp) / "services.log"
        env = {"SF_KAFKA_SESSION_TIMEOUT_MS": str(session_ms),
               "SF_KAFKA_HEARTBEAT_INTERVAL_MS": str(max(100, session_ms // 4))}
        with open(log_path, "w") as log:  # noqa: ASYNC230 - before any task runs
            async with EmbeddedBroker() as broker:
                kafka = KafkaSettings(bootstrap=broker.bootstrap, client_id="restart-bench")
                stack = ProcessStack(cfg_path, broker.bootstrap, endpoints=["embed"], log=log,
                                     env=env, schedulers=2, workers=1)
                await stack.start(timeout_s=180)
                say(f"pipeline up: {sorted(stack.procs)}")
                async with FairnessClient(kafka, built.config, lost_grace_s=lost_grace_s) as client:
                    load = Load(client, ["acme", "bulk", "quiet"], rate).start()
                    again = _Resubmitter(client, load)
                    resubmit = asyncio.create_task(again.run())
                    try:
                        await asyncio.sleep(before_s)
                        restart_ms, restart_s = int(time.time() * 1000), time.monotonic()
                        await broker.arestart(grace_s=0)
                        say("broker restarted (memory store: everything gone)")
                        await asyncio.sleep(after_s)
                        load.stop_sending()
                        # Every request a result: directly, or after it was declared lost
                        # (lost_grace_s after the client noticed) and sent again.
                        deadline = time.monotonic() + lost_grace_s + 60
                        while again.unanswered() and time.monotonic() < deadline:
                            await asyncio.sleep(0.2)
                        # A loss the client still has pending is declared within the
                        # grace: watch that long, so a late (false) declaration is counted.
                        await asyncio.sleep(lost_grace_s + 0.5)
                        figures["client_saw_loss"] = client.broker_losses
                    finally:
                        resubmit.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await resubmit
                        await load.close()
                figures["failed_process"] = stack.failed()
                figures["leader_after"] = await stack.leader()
                await stack.stop()
        figures["broker_restarted_lines"] = dict(_restart_lines(log_path))
    sent = load.sent
    before = [o for o in sent.values() if o.sent_ms < restart_ms]
    after = [o for o in sent.values() if o.sent_ms >= restart_ms]
    figures["sent_before"], figures["sent_after"] = len(before), len(after)
    # Counted by id. A resubmission's result answers the request it repeats; one
    # id handed over twice, or a result for an id never sent, is a fault.
    tally = load.tally()
    declared = again.declared
    attempt_ids = {w for ws in again.attempts.values() for w in ws}
    figures["results"] = tally.answered
    figures["statuses"] = dict(load.statuses())
    # A loss is declared, then the request is sent again: it counts as answered only
    # once a result came, and a request with no result is unanswered, declared or not.
    figures["declared_lost"] = sum(1 for rid in sent if rid in declared)
    figures["resubmitted"] = sum(1 for ws in again.attempts.values() if ws)
    figures["resubmitted_answered"] = sum(1 for rid in again.attempts
                                          if again.again_results(rid) > 0)
    # Declared lost, and its first submission's result came after all.
    figures["declared_then_answered"] = sum(1 for rid, o in sent.items()
                                            if rid in declared and o.result is not None)
    figures["unanswered"] = len(again.unanswered())
    figures["submit_errors"] = dict(load.submit_errors)
    figures["resubmit_errors"] = dict(again.errors)
    # Its submit raised, and no resubmission of it was answered either.
    figures["submit_failed"] = sum(1 for rid in tally.submit_failed if not again.answered(rid))
    figures["duplicated"] = len(tally.duplicated) + sum(
        1 for w, n in tally.foreign.items() if w in attempt_ids and n > 1)
    figures["foreign"] = sum(n for w, n in tally.foreign.items() if w not in attempt_ids)
    firsts = [o.done_s for o in after if o.done_s is not None]
    figures["recovery_s"] = round(min(firsts) - restart_s, 2) if firsts else None
    # Requests sent once the pipeline was back (after the first new result).
    back = min(firsts) if firsts else None
    late = [o for o in after if back is not None and o.sent_s >= back]
    # Exposed: in flight at the restart, or sent before the pipeline was back.
    figures["exposed"] = sum(
        1 for o in sent.values() if (back is None or o.sent_s < back)
        and (o.done_s is None or o.done_s >= restart_s))
    figures["lost_after_recovery"] = sum(1 for rid, o in sent.items()
                                         if rid in declared and back is not None
                                         and o.sent_s >= back)
    figures["sent_after_recovery"] = len(late)
    figures["ok_after_recovery"] = sum(1 for o in late
                                       if o.result is not None and o.result.status == "ok")
    figures["answered_after_recovery"] = sum(1 for o in late if o.result is not None)
    return figures


def report(f: dict) -> str:
    return "\n".join([
        (f"requests sent              {f['sent_before']} before the restart, "
        f"{f['sent_after']} after"),
        f"results                    {f['results']}  {f['statuses']}",
        (f"declared lost (ResultLost) {f['declared_lost']} of {f['exposed']} in flight at the "
         f"restart or sent before recovery, {f['lost_after_recovery']} sent after; sent "
         f"again (lost or submit raised): {f['resubmitted']}, {f['resubmitted_answered']} "
         "answered"),
        f"unanswered                 {f['unanswered']} (no result, lost or not)",
        (f"counted by id              submit failed {f['submit_failed']} (errors: "
         f"{f['submit_errors']}, resubmissions: {f['resubmit_errors']}), duplicated "
         f"{f['duplicated']}, foreign {f['foreign']}; declared lost and answered after all "
         f"{f['declared_then_answered']}"),
        (f"recovery                   {f['recovery_s']} s from the restart to the first result "
        "of a request sent after it"),
        (f"after recovery             {f['ok_after_recovery']} ok, "
         f"{f['answered_after_recovery']} answered of {f['sent_after_recovery']} sent"),
        (f"broker_restarted lines     {f['broker_restarted_lines']} (client: "
        f"{f['client_saw_loss']})"),
        f"process died               {f['failed_process']}; leader after: {f['leader_after']}",
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=30.0, help="requests per second (default 30)")
    p.add_argument("--before-s", type=float, default=5.0, help="load before the restart")
    p.add_argument("--after-s", type=float, default=12.0, help="load after the restart")
    p.add_argument("--json", default=None, help="write the figures to this file")
    p.add_argument("--log-file", default=None, help="keep the services' JSON logs here")
    args = p.parse_args(argv)
    figures = asyncio.run(run(rate=args.rate, before_s=args.before_s, after_s=args.after_s,
                              log_path=args.log_file))
    print(report(figures))
    write_json(args.json, figures)
    return 0 if passed(figures) else 1


def passed(f: dict) -> bool:
    """Nothing lost end to end, and only what was in flight at the restart declared lost."""
    return (f["unanswered"] == 0 and f["lost_after_recovery"] == 0
            and f["declared_lost"] <= f["exposed"] and f["submit_failed"] == 0
            and f["duplicated"] == 0 and f["foreign"] == 0)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())

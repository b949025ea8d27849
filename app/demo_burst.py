"""The demo's noisy neighbour, as a process of its own.

The bursting org stands for another team's service on other machines. Run
inside the demo's process it shared an event loop and a core's worth of
Python with the quiet orgs' client, so the quiet orgs' requests waited
behind the burst's encoding and sends *before* reaching the pipeline (up to
2 s of the 20,000 burst's "admission" time was the demo's own client). In a
process of its own, at a lower CPU priority (``nice``), it sends as fast as
it can with what the pipeline leaves over, as a remote sender would.

Protocol over a ``multiprocessing`` pipe, child to parent: ``("ready",)``
once its client is connected; then, after the parent's ``"go"``,
``("progress", sent, done)`` about twice a second and finally
``("done", records)``, one ``(id, status, sent_s, done_s)`` per request
(``time.monotonic()``, the same clock in both processes on Linux; ``status``
and ``done_s`` are None for a request with no result by the timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid

__all__ = ["burst_main", "text"]


def text(org: str, i: int) -> str:
    """The demo's request text for every org."""
    # ~16 tokens, the same shape for every org, so the only difference
    # between orgs is how many requests they send.
    return f"{org} document {i}: quarterly report on regional supply chain costs and delivery times"


def burst_main(conn, bootstrap: str, config_path: str, org: str, endpoint: str, n: int,
               timeout_s: float, nice: int) -> None:
    """Entry point of the child process (``multiprocessing``, spawn context)."""
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    asyncio.run(_burst(conn, bootstrap, config_path, org, endpoint, n, timeout_s))


async def _burst(conn, bootstrap: str, config_path: str, org: str, endpoint: str, n: int,
                 timeout_s: float) -> None:
    from plumbing.heap import settle
    from plumbing.kafka import KafkaSettings
    from producer.client import FairnessClient
    from schemas.config import load_config

    config = load_config(config_path)
    kafka = KafkaSettings(bootstrap=bootstrap)  # a client only: no group to time out
    records: dict[str, list] = {}
    async with FairnessClient(kafka, config, wire_format="msgpack") as client:
        settle()
        conn.send(("ready",))
        await asyncio.to_thread(conn.recv)  # "go"

        waiting: list[asyncio.Task] = []

        async def wait(rid: str, rec: list) -> None:
            with contextlib.suppress(TimeoutError):
                result = await client.result(rid, timeout=timeout_s)
                rec[1], rec[3] = result.status, time.monotonic()

        async def send(i: int) -> None:
            rid = uuid.uuid4().hex
            rec = records[rid] = [rid, None, time.monotonic(), None]
            await client.submit({"id": rid, "org": org, "endpoint": endpoint,
                                 "input": {"type": "embed", "texts": [text(org, i)]}})
            waiting.append(asyncio.create_task(wait(rid, rec)))

        async def report() -> None:
            while True:
                await asyncio.sleep(0.5)
                conn.send(("progress", len(records),
                           sum(r[1] is not None for r in records.values())))

        reporter = asyncio.create_task(report())
        chunk = 500
        for start in range(0, n, chunk):
            await asyncio.gather(*(send(i) for i in range(start, min(n, start + chunk))))
        await asyncio.gather(*waiting)
        reporter.cancel()
    conn.send(("done", [tuple(r) for r in records.values()]))
    conn.close()

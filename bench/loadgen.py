"""Paced load through the client library, and the accounting the reliability runs share.

:class:`Load` submits requests on an absolute schedule (``rate`` per second,
orgs in turn) through a :class:`~producer.client.FairnessClient`, and
collects every result the client delivers with its arrival time. Everything
is counted by request id (:meth:`Load.tally`): a request whose ``submit()``
raised stays in ``sent`` (marked ``submit_error``) and counts as
submit-failed, not as nothing; a second result the client hands over for an
id counts as duplicated (the client promises each id once); a result for an
id this load never sent counts as foreign. :func:`reply_copies` reads the
client's reply topic from the start afterwards: how many copies of each id
were written (the client dropped all but the first; each result of a pack
counts as one copy), and through how many distinct batches each id went
(more than one: it was dispatched twice).

Used by ``bench/crash.py``, ``bench/overload.py``, ``bench/broker_restart.py``
and their tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

from aiokafka.structs import TopicPartition

from plumbing.kafka import KafkaSettings, make_consumer
from producer.client import results_in
from schemas.codec import DecodeError
from schemas.messages import Result
from traffic.percentile import percentile  # re-exported: overload and broker_stall use it

__all__ = ["Load", "Outcome", "Tally", "percentile", "reply_copies", "rss_mib"]


@dataclass
class Outcome:
    """One submitted request: when it went, and its result when it came."""

    org: str
    sent_s: float  # monotonic
    sent_ms: int  # wall clock
    result: Result | None = None
    done_s: float | None = None
    #: The load's ``phase`` when it was sent (a label the run sets).
    phase: str = ""
    #: When the submit was acknowledged (the client's own queueing before it).
    submitted_s: float | None = None
    #: The exception's type name when ``submit()`` raised (the request may
    #: still have landed, and its result may still come).
    submit_error: str | None = None
    #: Results the client handed over for this id after the first.
    extra_results: int = 0

    @property
    def latency_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.sent_s


@dataclass(frozen=True)
class Tally:
    """What came of every request a :class:`Load` sent, counted by id.

    ``sent`` = ``answered`` + ``lost`` + ``submit_failed`` (unanswered ones):
    each id is in exactly one of the three. ``duplicated`` and ``foreign`` are
    results, not requests: ids handed over more than once, and ids never sent.
    """

    sent: int
    #: Ids with a result.
    answered: int
    #: Ids submitted (``submit()`` returned) with no result.
    lost: tuple[str, ...]
    #: Ids whose ``submit()`` raised and that got no result.
    submit_failed: tuple[str, ...]
    #: Ids whose ``submit()`` raised but whose result came anyway.
    submit_failed_answered: int
    #: Ids the client handed over more than once -> copies beyond the first.
    duplicated: dict[str, int]
    #: Ids nobody sent -> results received for them.
    foreign: dict[str, int]

    def line(self) -> str:
        """One line: every count, with a few ids of each nonzero one."""
        def ids(xs) -> str:
            xs = list(xs)
            return "" if not xs else " (" + ", ".join(xs[:3]) + (", ..." if len(xs) > 3 else "") + ")"
        return (f"sent {self.sent}, answered {self.answered}, lost {len(self.lost)}"
                f"{ids(self.lost)}, submit failed {len(self.submit_failed)}"
                f"{ids(self.submit_failed)} (+{self.submit_failed_answered} answered anyway), "
                f"duplicated {len(self.duplicated)}{ids(self.duplicated)}, "
                f"foreign {sum(self.foreign.values())}{ids(self.foreign)}")

    def as_dict(self) -> dict:
        return {"sent": self.sent, "answered": self.answered, "lost": len(self.lost),
                "submit_failed": len(self.submit_failed),
                "submit_failed_answered": self.submit_failed_answered,
                "duplicated": len(self.duplicated), "foreign": sum(self.foreign.values())}


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process (Linux ``/proc``), MiB; None if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Load:
    """Sends ``rate`` requests a second from ``orgs`` in turn until :meth:`stop`.

    ``rate`` and ``phase`` may be changed while it runs; each request
    remembers the phase it was sent in.
    """

    client: object
    orgs: list[str]
    rate: float
    endpoint: str = "embed"
    words: int = 12
    texts: int = 1
    deadline_ms: int | None = None
    #: Submits in flight at once: one at a time cannot reach a few hundred a second.
    max_in_flight: int = 64
    phase: str = ""
    sent: dict[str, Outcome] = field(default_factory=dict)
    submit_errors: Counter = field(default_factory=Counter)
    #: Results for ids this load never sent, per id.
    foreign: Counter = field(default_factory=Counter)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> Load:
        self._tasks = [asyncio.create_task(self._send(), name="load-send"),
                       asyncio.create_task(self._collect(), name="load-collect")]
        return self

    def stop_sending(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def missing(self, phase: str | None = None) -> list[str]:
        """Ids submitted (or being submitted) with no result yet; a failed submit is not one."""
        return [rid for rid, o in self.sent.items()
                if o.result is None and o.submit_error is None
                and (phase is None or o.phase == phase)]

    def tally(self, phase: str | None = None) -> Tally:
        """Every request of ``phase`` (None: all) counted by id; see :class:`Tally`."""
        mine = {rid: o for rid, o in self.sent.items() if phase is None or o.phase == phase}
        return Tally(
            sent=len(mine),
            answered=sum(o.result is not None for o in mine.values()),
            lost=tuple(rid for rid, o in mine.items()
                       if o.result is None and o.submit_error is None),
            submit_failed=tuple(rid for rid, o in mine.items()
                                if o.result is None and o.submit_error is not None),
            submit_failed_answered=sum(o.result is not None and o.submit_error is not None
                                       for o in mine.values()),
            duplicated={rid: o.extra_results for rid, o in mine.items() if o.extra_results},
            foreign=dict(self.foreign))

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every request submitted has its result; False at the timeout."""
        deadline = time.monotonic() + timeout_s
        while self.missing():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    def statuses(self) -> Counter:
        return Counter(f"{o.result.status}" + (f":{o.result.reason}" if o.result.reason else "")
                       for o in self.sent.values() if o.result is not None)

    async def _send(self) -> None:
        due = time.monotonic()
        i = 0
        text = " ".join(["word"] * self.words)
        slots = asyncio.Semaphore(self.max_in_flight)
        pending: set[asyncio.Task] = set()
        try:
            while not self._stop.is_set():
                due += 1 / self.rate
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                org = self.orgs[i % len(self.orgs)]
                rid = f"r{i}-{org}"
                req = {"id": rid, "org": org, "endpoint": self.endpoint,
                       "input": {"type": "embed", "texts": [f"{i} {text}"] * self.texts}}
                if self.deadline_ms is not None:
                    req["deadline_ms"] = self.deadline_ms
                self.sent[rid] = Outcome(org, time.monotonic(), int(time.time() * 1000),
                                         phase=self.phase)
                await slots.acquire()
                t = asyncio.create_task(self._submit(rid, req, slots))
                pending.add(t)
                t.add_done_callback(pending.discard)
                i += 1
        finally:
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _submit(self, rid: str, req: dict, slots: asyncio.Semaphore) -> None:
        try:
            await self.client.submit(req)
            if (o := self.sent.get(rid)) is not None:
                o.submitted_s = time.monotonic()
        except Exception as e:  # noqa: BLE001 - counted by id, the run goes on
            self.submit_errors[type(e).__name__] += 1
            if (o := self.sent.get(rid)) is not None:
                o.submit_error = type(e).__name__
        finally:
            slots.release()

    async def _collect(self) -> None:
        async for res in self.client.results():
            o = self.sent.get(res.id)
            if o is None:
                self.foreign[res.id] += 1
            elif o.result is not None:
                o.extra_results += 1
            else:
                o.result, o.done_s = res, time.monotonic()


async def reply_copies(kafka: KafkaSettings, topic: str, timeout_s: float = 30.0
                       ) -> tuple[Counter, dict[str, set[str]]]:
    """Copies written per request id on ``topic``, and the distinct batch ids per id."""
    consumer = make_consumer(kafka, group_id=None)
    await consumer.start()
    copies: Counter = Counter()
    batches: dict[str, set[str]] = {}
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = await consumer.getmany(tp, timeout_ms=300)
            for rec in got.get(tp, []):
                # One result or a pack of them (the client asks for packs); a record
                # that does not decode is an error here, as it always was.
                for res in results_in(rec.value, rec.headers):
                    if isinstance(res, DecodeError):
                        raise res
                    copies[res.id] += 1
                    if res.batch_id:
                        batches.setdefault(res.id, set()).add(res.batch_id)
            high = consumer.highwater(tp)
            if high is not None and await consumer.position(tp) >= high and not got:
                break
    finally:
        await consumer.stop()
    return copies, batches

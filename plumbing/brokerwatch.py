"""Whether the broker answers: the part of ``/readyz`` that a fetch loop cannot tell.

aiokafka hides a lost broker: ``getmany`` returns nothing, a send waits up
to ``request_timeout_ms`` (40 s), and the clients reconnect on their own. A
service that only looked at its partitions would stay "ready" for as long as
the broker is gone. So each service runs a :class:`BrokerWatch`: every
``interval_s`` it sends one small metadata request (one topic, no
auto-creation) through a client it already has, to any broker it knows, and
gives up on it after ``timeout_s``. After ``failures`` probes in a row went
unanswered the broker counts as unreachable (``/readyz`` answers 503 with
the reason); the first answered probe makes it reachable again.

With the defaults (1 s, 2 s, 2 probes) a stopped broker turns readiness off
within about 2 s when connections are refused, about 6 s when packets are
dropped; one slow answer does not.

The watch changes nothing in the clients: they keep reconnecting by
themselves; it only reports.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import structlog
from aiokafka.protocol.metadata import MetadataRequest

from plumbing.background import Background
from plumbing.bounded import within

__all__ = ["BrokerWatch"]

log = structlog.get_logger("broker")


class BrokerWatch(Background):
    """Probes the broker through ``client`` (an ``AIOKafkaClient``, e.g. ``producer.client``).

    ``topic`` is the one topic the probe asks about (one of the service's
    own, so the answer stays small on a cluster with many topics). ``gauge``,
    if given, is set to 1 while reachable and 0 otherwise. Mutable state
    (``reachable``, ``reason``, the failure streak) is changed by the probe
    loop alone.
    """

    def __init__(self, client, topic: str, *, service: str, interval_s: float = 1.0,
                 timeout_s: float = 2.0, failures: int = 2, gauge=None,
                 clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.topic = topic
        self.service = service
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures = failures
        self.gauge = gauge
        self.clock = clock
        #: Optimistic until proven otherwise: the clients just connected at start.
        self.reachable = True
        self.reason = "ok"
        self.last_ok = clock()
        self._streak = 0
        self.task_name = f"{service}-broker-watch"
        self._set_gauge()

    def status(self) -> tuple[bool, str]:
        """(reachable, why) for a readiness check."""
        if self.reachable:
            return True, "broker reachable"
        return False, (f"broker unreachable for {self.clock() - self.last_ok:.1f} s: "
                       f"{self.reason}")

    async def probe(self) -> bool:
        """One metadata request to any known broker; True if one answered in time."""
        nodes = [b.nodeId for b in self.client.cluster.brokers()]
        random.shuffle(nodes)
        if not nodes:
            self.reason = "no broker known"
            return False
        request = MetadataRequest([self.topic], allow_auto_topic_creation=False)
        for node in nodes:
            try:
                await within(self.client.send(node, request), self.timeout_s)
                return True
            except TimeoutError:
                self.reason = f"no answer from node {node} in {self.timeout_s:g} s"
            except Exception as e:  # noqa: BLE001 - any failure to answer is a failed probe
                self.reason = f"node {node}: {str(e) or type(e).__name__}"
        return False

    def observe(self, answered: bool) -> None:
        """Fold one probe's outcome into the verdict; log only the transitions."""
        if answered:
            self._streak = 0
            self.last_ok = self.clock()
            if not self.reachable:
                self.reachable, self.reason = True, "ok"
                log.info("broker_reconnected", service=self.service)
        else:
            self._streak += 1
            if self.reachable and self._streak >= self.failures:
                self.reachable = False
                log.warning("broker_lost", service=self.service, reason=self.reason,
                            failed_probes=self._streak)
        self._set_gauge()

    async def run(self) -> None:
        while True:
            self.observe(await self.probe())
            await asyncio.sleep(self.interval_s)


    def _set_gauge(self) -> None:
        if self.gauge is not None:
            self.gauge.set(1 if self.reachable else 0)

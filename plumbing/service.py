"""The lifecycle every service shares, once: start, run, graceful stop, signals, reload.

A service (admission, the scheduler, a worker) is an async context manager:

    async with Service(...) as s:   # start(): connect, join groups, serve /metrics
        await s.run()               # until request_stop() (SIGTERM) or a task fails
                                    # stop(): its own close, then the shared parts

What differs is a handful of hooks: :meth:`Service.open` (connect, create
topics, join groups), :meth:`Service.main` (its primary loop, which ends by
itself once a stop is requested, after settling what it holds: admission
settles its steps, a worker finishes its batches), :meth:`Service.tasks`
(loops beside it, cancelled once it ended), :meth:`Service.close` (commit,
leave, disconnect), :meth:`Service.totals_fields` (the figures of its
``<name>_totals`` and ``<name>_stopped`` lines), :meth:`Service.ready`
(what readiness needs beyond a start and a broker that answers) and
:meth:`Service.apply` (a new configuration; refusing is the default).
What is the same lives here: the telemetry endpoint and its readiness, the
periodic totals line, the configuration file watch (SIGHUP and a changed
modification time), the broker watch (:meth:`Service.watch_broker`) and the
topic keeper's start and stop, signal handlers,
and the command's main (:func:`serve`): embedded broker or cluster, signals
installed before start, exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Self

import msgspec
from prometheus_client import CollectorRegistry

from plumbing.bounded import WaitTimeout, bounded, cancel_within, within
from plumbing.brokerwatch import BrokerWatch
from plumbing.heap import settle
from plumbing.kafka import KafkaSettings, kafka_endpoint
from plumbing.logs import get_logger
from plumbing.settings import ServiceSettings
from plumbing.telemetry import TelemetryServer
from schemas.config import ConfigError, load_config

__all__ = ["Service", "StartStop", "serve"]


class StartStop:
    """``async with x:`` for anything with ``start()`` and ``stop()`` (services, the client)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

#: How long a stop waits for a cancelled loop to end before it goes on without it.
_CANCEL_S = 5.0
#: How long a stop waits for a part (:attr:`Service._parts`) to stop, and for
#: :meth:`Service.close` to close the Kafka clients, before it goes on: a
#: client's shutdown against a broker that went away in the middle of it can
#: wait for ever (aiokafka's commit looks for a coordinator until it finds one).
_CLOSE_S = 30.0


class Service(StartStop):
    """Base of the three services; see the module docstring for the hooks.

    Fixed at construction: ``name``, ``kafka``, ``registry``, the telemetry
    address and the configuration file. ``config`` changes only through
    :meth:`reload`.
    """

    #: "admission", "scheduler", "worker": names log lines and the broker watch.
    name = "service"

    def __init__(self, config, kafka: KafkaSettings, settings: ServiceSettings, *,
                 registry: CollectorRegistry | None = None,
                 config_path: str | Path | None = None, config_poll_ms: int = 0,
                 stop_grace_s: float = 30.0):
        self.config = config
        self.kafka = kafka
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self.config_path = Path(config_path) if config_path is not None else None
        self.config_poll_ms = config_poll_ms
        self.totals_log_interval_s = settings.totals_log_interval_s
        self.metrics_host = settings.metrics_host
        self.metrics_port = settings.metrics_port
        #: How long a stop waits for :meth:`main` to settle what it holds.
        self.stop_grace_s = stop_grace_s
        #: How long a stop waits for each part, then for :meth:`close`.
        self.close_s = _CLOSE_S
        self.log = get_logger(self.name)
        self.started = False
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._side: set[asyncio.Task] = set()
        #: Clear while :meth:`run` runs.
        self._run_over = asyncio.Event()
        self._run_over.set()
        self._telemetry: TelemetryServer | None = None
        self._config_mtime: float | None = None
        self._reload_lock = asyncio.Lock()
        #: Parts with a start/stop of their own (broker watch, topic keeper...),
        #: stopped in reverse order by :meth:`stop`.
        self._parts: list[Any] = []
        #: Set by :meth:`watch_broker`: not ready while it says the broker is gone.
        self.broker_watch: BrokerWatch | None = None

    # -- hooks -------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create topics, join groups (before the loops start)."""

    async def main(self) -> None:
        """The primary loop; returns once :attr:`stopping` is set and what it holds is settled."""
        await self._stopping.wait()

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """Loops beside :meth:`main`, cancelled once it returned."""
        return []

    async def close(self) -> None:
        """Commit, leave the groups, disconnect (the loops have ended)."""

    def totals_fields(self) -> dict[str, Any]:
        """Figures of the ``<name>_totals`` and ``<name>_stopped`` lines."""
        return {}

    def readiness(self) -> tuple[bool, str]:
        """``(ready, why)`` for /readyz: started, the broker answering, and :meth:`ready`."""
        if not self.started:
            return False, "not started"
        if self.broker_watch is not None and not (b := self.broker_watch.status())[0]:
            return b
        return self.ready()

    def ready(self) -> tuple[bool, str]:
        """What else this service needs before it takes traffic (partitions, leadership)."""
        return True, "ok"

    async def apply(self, config) -> None:
        """Install a new configuration; raise ConfigError to refuse it.

        A service that does not override this does not reload (a worker: its
        model is fixed at start); a SIGHUP is then logged as ``reload_ignored``.
        """
        raise ConfigError([f"a {self.name} does not reload"])

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Serve /metrics, open the service, then mark it started."""
        if self.metrics_port is not None and self._telemetry is None:
            self._telemetry = TelemetryServer(self.registry, self.readiness,
                                              host=self.metrics_host, port=self.metrics_port)
            await self._telemetry.start()
        if self.config_path is not None:
            self._config_mtime = self._mtime()
        await self.open()
        self.started = True

    def watch_broker(self, client, topic: str, gauge) -> None:
        """Probe the broker through ``client`` with ``topic``'s metadata while serving."""
        self.broker_watch = self.keep(BrokerWatch(client, topic, service=self.name, gauge=gauge))

    def keep(self, part):
        """Start ``part`` (a BrokerWatch, a TopicKeeper...) and stop it with the service."""
        started = part.start()
        self._parts.append(part)
        return started if started is not None else part

    @property
    def metrics_url(self) -> str | None:
        return self._telemetry.url if self._telemetry else None

    def request_stop(self) -> None:
        """Ask :meth:`run` to return (the signal handlers call this)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        """Serve until :meth:`request_stop`; a loop that dies takes the service down.

        :meth:`main` ends by itself after a stop request; the loops beside it
        are cancelled then. A loop that raises stops the service and its
        error comes out of here.
        """
        loops = [*self.tasks(), self._totals_loop()]
        if self.config_path is not None and self.config_poll_ms > 0:
            loops.append(self._watch_config())
        self._run_over.clear()
        # A coroutine object has a __name__; typing's Coroutine does not say so.
        self._tasks = [asyncio.create_task(c, name=f"{self.name}-{c.__name__}")  # type: ignore[attr-defined]
                       for c in loops]
        main = asyncio.create_task(self.main(), name=f"{self.name}-main")
        try:
            while True:
                done, _ = await asyncio.wait([main, *self._tasks],
                                             return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if not t.cancelled() and (error := t.exception()) is not None:
                        raise error
                if main in done:
                    return
                self._tasks = [t for t in self._tasks if not t.done()]
        finally:
            if not main.done():
                self._stopping.set()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await within(asyncio.shield(main), self.stop_grace_s)
                await self._cancel([main])
            await self._cancel(self._tasks)
            self._run_over.set()

    async def stop(self) -> None:
        """Let :meth:`main` settle, stop the shared parts, close, log the totals."""
        if not self.started:
            return
        self._stopping.set()
        try:
            await within(self._run_over.wait(), self.stop_grace_s)
        except TimeoutError:
            self.log.warning(f"{self.name}_stop_unsettled",
                             detail=f"not settled in {self.stop_grace_s} s: the next owner "
                                    "replays what was in hand")
        await self._cancel(self._tasks)
        for part in reversed(self._parts):
            try:
                await bounded(part.stop(), self.close_s, f"{type(part).__name__} to stop")
            except WaitTimeout as e:
                self.log.warning(f"{self.name}_close_unsettled", detail=str(e))
            except Exception as e:  # noqa: BLE001  # a part that fails to stop must not keep the rest
                self.log.warning(f"{self.name}_part_stop_failed", part=type(part).__name__,
                                 error=repr(e))
        self._parts = []
        try:
            await bounded(self.close(), self.close_s,
                          f"{self.name} to close its Kafka clients")
        except WaitTimeout as e:
            self.log.warning(f"{self.name}_close_unsettled",
                             detail=f"{e}: what it had not committed is replayed by the "
                                    "next owner")
        finally:
            await self._cancel(list(self._side))
            if self._telemetry is not None:
                await self._telemetry.stop()
                self._telemetry = None
            self.started = False
            self.log.info(f"{self.name}_stopped", **self.totals_fields())

    def spawn(self, aw: Awaitable[Any], what: str) -> None:
        """Run ``aw`` beside the loops; its failure is logged, never lost (cancelled on stop)."""
        task = asyncio.ensure_future(aw)
        self._side.add(task)

        def done(t: asyncio.Future) -> None:
            self._side.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.log.warning(f"{what}_failed", error=repr(t.exception()))
        task.add_done_callback(done)

    async def _cancel(self, tasks: list[asyncio.Task]) -> None:
        """Cancel ``tasks`` and wait for them, ``_CANCEL_S`` at most (a line names any left)."""
        await cancel_within(tasks, _CANCEL_S, f"the {self.name}'s tasks to end", log=self.log)

    async def _totals_loop(self) -> None:
        while True:
            await asyncio.sleep(self.totals_log_interval_s)
            self.log.info(f"{self.name}_totals", **self.totals_fields())

    # -- configuration -----------------------------------------------------------

    def request_reload(self) -> None:
        """Reload the configuration file soon (the SIGHUP handler)."""
        self.spawn(self.reload(), "config_reload")

    async def reload(self, config=None) -> bool:
        """Install ``config`` (default: re-read the file); False, logged, if refused.

        A configuration that does not validate, or that :meth:`apply`
        refuses, leaves the running one in force.
        """
        if type(self).apply is Service.apply:
            self.log.warning("reload_ignored", detail=f"a {self.name} does not reload; "
                             "restart it for a new configuration")
            return False
        async with self._reload_lock:
            try:
                if config is None:
                    if self.config_path is None:
                        raise ConfigError(["no configuration file to reload from"])
                    self._config_mtime = self._mtime()
                    config = load_config(self.config_path)
                await self.apply(config)
            except ConfigError as e:
                self._reloaded("refused")
                self.log.error("config_reload_refused", problems=e.problems,
                               detail="the running configuration stays in force")
                return False
            except Exception as e:  # noqa: BLE001 - a failed reload must not stop the service
                self._reloaded("refused")
                self.log.error("config_reload_refused", error=repr(e),
                               detail="the running configuration stays in force")
                return False
            self._reloaded("applied")
            return True

    def _reloaded(self, result: str) -> None:
        reloads = getattr(getattr(self, "metrics", None), "reloads", None)
        if reloads is not None:
            reloads.labels(result).inc()

    def _mtime(self) -> float | None:
        try:
            return self.config_path.stat().st_mtime if self.config_path else None
        except OSError:
            return None

    async def _watch_config(self) -> None:
        while True:
            await asyncio.sleep(self.config_poll_ms / 1000)
            mtime = self._mtime()
            if mtime is not None and mtime != self._config_mtime:
                await self.reload()


async def serve(make: Callable[[KafkaSettings], Service], kafka: KafkaSettings) -> int:
    """A service's command: its cluster (or an embedded broker), signals, run, stop.

    Signal handlers are installed before start: a SIGTERM during start-up
    must not kill the process with the default action (a stop then returns
    right after start). SIGHUP reloads the configuration.
    """
    async with kafka_endpoint(kafka) as bootstrap:
        kafka = msgspec.structs.replace(kafka, bootstrap=bootstrap)
        service = make(kafka)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.request_stop)
        loop.add_signal_handler(signal.SIGHUP, service.request_reload)
        async with service:
            settle()  # started: what start-up made is never walked again
            await service.run()
    return 0

"""The whole pipeline in one process: admission, scheduler, workers and the HTTP gateway.

For local use (``serving-fairness stack``), the demo, ``replay --embedded``
and the integration tests. Each service is the same class that runs alone
in production, with its own metrics registry; they only share the event
loop (and, where two workers of one endpoint run here, the loaded model).

``serving-fairness stack`` with no ``--bootstrap`` starts the embedded
broker and prints its address, so ``kcat`` or any Kafka client can send to
the ingress topic right away; with ``--gateway-port P`` the HTTP gateway
listens on P too. A SIGHUP re-reads the configuration file and reloads
every service in it (the gateway's keys included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from typing import Any, Self

import msgspec

from gateway.service import GatewayService
from plumbing.bounded import cancel_within, within
from plumbing.heap import settle
from plumbing.kafka import KafkaSettings, add_kafka_arguments, kafka_endpoint, settings_from_args
from plumbing.service import Service
from plumbing.service_settings import GatewaySettings
from plumbing.settings import SettingsError
from plumbing.settings import from_args as settings_from_env_args
from producer.service import AdmissionService, AdmissionSettings
from scheduler.service import SchedulerService, SchedulerSettings
from schemas.config import Config, ConfigError, Policy, load_config
from schemas.topics import Topics
from worker.service import WorkerService, WorkerSettings, load_model

__all__ = ["Stack", "add_arguments", "run"]


class Stack:
    """Admission, scheduler and ``workers`` workers per endpoint, as asyncio tasks.

    ``model`` overrides every endpoint's model spec (``fake`` for tests).
    ``metrics_port``: None serves no HTTP; 0 gives each service a free port;
    N gives admission N, the scheduler N+1, workers N+2, N+3...
    """

    def __init__(self, config: Config, kafka: KafkaSettings, *, policy: Policy = "drr",
                 model: str | None = None, workers: int = 1, endpoints: list[str] | None = None,
                 metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
                 token_counter: str | None = None, worker_slots: int | None = None,
                 gateway_port: int | None = None, gateway: GatewaySettings | None = None):
        self.config = config
        self.kafka = kafka
        self.policy = policy
        self.model = model
        self.workers_per_endpoint = workers
        self.endpoints = endpoints or list(config.endpoints)
        self.metrics_host = metrics_host
        self.metrics_port = metrics_port
        self.token_counter = token_counter or ("fake" if model and model.startswith("fake") else None)
        self.worker_slots = worker_slots
        #: The gateway's settings; None: no gateway (``gateway_port`` given: one on it).
        self.gateway_settings = gateway
        if gateway is None and gateway_port is not None:
            self.gateway_settings = GatewaySettings(port=gateway_port)
        self.gateway: GatewayService | None = None
        self.topics = Topics.of(config)
        self.admission: AdmissionService | None = None
        self.scheduler: SchedulerService | None = None
        self.workers: list[WorkerService] = []
        self._tasks: list[asyncio.Task] = []

    def _port(self, i: int) -> int | None:
        if self.metrics_port is None:
            return None
        return 0 if self.metrics_port == 0 else self.metrics_port + i

    async def _models(self) -> dict[str, Any]:
        """Load each endpoint's model once; workers of one endpoint share it."""
        models = {}
        for ep in self.endpoints:
            models[ep] = await asyncio.to_thread(load_model, self.config, ep, self.model)
        return models

    async def start(self) -> Self:
        models = await self._models()
        self.scheduler = SchedulerService(
            self.config, self.kafka,
            settings=SchedulerSettings(policy=self.policy, metrics_port=self._port(1),
                                       metrics_host=self.metrics_host))
        self.admission = AdmissionService(
            self.config, self.kafka,
            settings=AdmissionSettings(metrics_port=self._port(0), metrics_host=self.metrics_host,
                                       token_counter=self.token_counter))
        i = 2
        for ep in self.endpoints:
            for _ in range(self.workers_per_endpoint):
                self.workers.append(WorkerService(
                    self.config, self.kafka,
                    WorkerSettings(endpoint=ep, slots=self.worker_slots,
                                   metrics_port=self._port(i), metrics_host=self.metrics_host),
                    model=models[ep]))
                i += 1
        if self.gateway_settings is not None:
            self.gateway = GatewayService(self.config, self.kafka, self.gateway_settings)
        # The scheduler first: it creates the topics and must be in its group
        # before workers announce themselves.
        await self.scheduler.start()
        await asyncio.gather(self.admission.start(), *(w.start() for w in self.workers))
        if self.gateway is not None:
            await self.gateway.start()
        self._tasks = [asyncio.create_task(s.run(), name=type(s).__name__)
                       for s in self.services]
        await self.wait_ready()
        return self

    @property
    def services(self) -> list[Any]:
        return [s for s in (self.admission, self.scheduler, *self.workers, self.gateway)
                if s is not None]

    async def reload(self, config: Config) -> dict[str, bool]:
        """Install ``config`` in every service that reloads; which applied it, by service."""
        self.config = config
        out = {}
        for s in self.services:
            out[s.name] = await s.reload(config) if type(s).apply is not Service.apply else False
        return out

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until every service is ready and the scheduler knows a worker per endpoint."""
        deadline = time.monotonic() + timeout_s
        while True:
            waiting = [f"{type(s).__name__}: {why}" for s in self.services
                       if not (r := s.readiness())[0] for why in [r[1]]]
            flow = self.scheduler.flow if self.scheduler else None
            for ep in self.endpoints:
                if flow is not None and not flow.endpoint_workers(ep):
                    waiting.append(f"scheduler: no worker announced for {ep!r}")
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("pipeline not ready: " + "; ".join(waiting))
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for s in self.services:
            s.request_stop()
        # The gateway first (it drains: answers what waits, refuses the rest), then the
        # workers (finish batches in hand), then the scheduler, admission last.
        for s in [self.gateway, *self.workers, self.scheduler, self.admission]:
            if s is not None:
                with contextlib.suppress(Exception):
                    await s.stop()
        await cancel_within(self._tasks, 5.0, "the stack's tasks to end")

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def failed(self) -> BaseException | None:
        """The first exception a service's run loop died of, if any."""
        for t in self._tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                return t.exception()
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    parser.add_argument("--policy", choices=["drr", "fifo"], default="drr")
    parser.add_argument("--model", default=None,
                        help="model spec for every worker (default: each endpoint's; 'fake' for tests)")
    parser.add_argument("--workers", type=int, default=1, help="workers per endpoint")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="admission on N, scheduler N+1, workers N+2...; 0: free ports")
    parser.add_argument("--gateway-port", type=int, default=None,
                        help="run the HTTP gateway on this port (0: a free one); its other "
                             "settings from SF_GATEWAY_* variables")
    add_kafka_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from plumbing.logs import configure_logging

    configure_logging()
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"serving-fairness stack: {e}", file=sys.stderr)
        return 2
    gateway = None
    if args.gateway_port is not None:
        try:
            # --gateway-port as a flag: it wins over SF_GATEWAY_PORT, like any flag.
            gateway = settings_from_env_args(GatewaySettings,
                                             argparse.Namespace(port=args.gateway_port),
                                             env_prefix="SF_GATEWAY_")
        except SettingsError as e:
            print(f"serving-fairness stack: {e}", file=sys.stderr)
            return 2
    return asyncio.run(_main(config, settings_from_args(args), args, gateway))


async def _main(config: Config, kafka: KafkaSettings, args: argparse.Namespace,
                gateway: GatewaySettings | None = None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task] = set()
    async with kafka_endpoint(kafka) as bootstrap:
        kafka = msgspec.structs.replace(kafka, bootstrap=bootstrap)
        async with Stack(config, kafka, policy=args.policy, model=args.model,
                         workers=args.workers, metrics_port=args.metrics_port,
                         gateway=gateway) as stack:
            loop.add_signal_handler(signal.SIGHUP, lambda: _reload(stack, args.config, reloads))
            settle()  # as a service command does once started (plumbing.heap)
            topics = Topics.of(config)
            print(f"pipeline ready: bootstrap {bootstrap}, send requests to {topics.ingress!r}, "
                  f"results on {topics.results!r}", file=sys.stderr, flush=True)
            for s in stack.services:
                tel = getattr(s, "_telemetry", None)
                if tel is not None:
                    print(f"  {type(s).__name__}: {tel.url}/metrics", file=sys.stderr)
            if stack.gateway is not None:
                print(f"gateway: {stack.gateway.url} (OpenAI /v1/embeddings, Cohere /v2/embed "
                      f"and /v2/rerank, TEI /embed and /rerank)", file=sys.stderr, flush=True)
            while not stop.is_set():
                if (err := stack.failed()) is not None:
                    print(f"a service failed: {err!r}", file=sys.stderr)
                    return 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await within(stop.wait(), 0.5)
    return 0


def _reload(stack: Stack, path: str, tasks: set[asyncio.Task]) -> None:
    """SIGHUP: re-read ``path`` and install it in every service (a bad file changes nothing)."""
    from plumbing.logs import get_logger

    log = get_logger("stack")
    try:
        config = load_config(path)
    except ConfigError as e:
        log.error("config_reload_refused", problems=e.problems,
                  detail="the running configuration stays in force")
        return
    task = asyncio.get_running_loop().create_task(stack.reload(config))
    tasks.add(task)
    task.add_done_callback(tasks.discard)

"""The gateway service: HTTP in front of the pipeline, tenants proven by API keys.

``serving-fairness gateway --config C --bootstrap B --port P`` serves the
OpenAI (``/v1/embeddings``, ``/v1/models``), Cohere v2 (``/v2/embed``,
``/v2/rerank``) and text-embeddings-inference (``/embed``, ``/rerank``,
``/info``, ``/health``) routes and ``/openapi.json`` on ``--port``, with
``/metrics``, ``/healthz`` and ``/readyz`` on ``--metrics-port`` like every
service. Each request is sent to the ingress topic as the org its key
proves (:mod:`gateway.server` says what happens to it on the way); its
result comes back on this replica's own reply topic,
``<prefix>replies.gateway-<id>``, so replicas behind a load balancer share
nothing.

It is built on the client library (:class:`producer.client.FairnessClient`)
and the service base; it imports no other service. A SIGHUP (or a changed
configuration file) reloads the registry: keys added and revoked take
effect on the next request. SIGTERM drains (:meth:`GatewayServer.drain`).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import uuid
from typing import Any

from prometheus_client import CollectorRegistry

from gateway import cohere_api, openai_api, tei_api
from gateway.catalog import Catalog
from gateway.metrics import GatewayMetrics
from gateway.openapi import OpenApiRoute
from gateway.route import Route
from gateway.server import GatewayServer
from plumbing.kafka import KafkaSettings, add_kafka_arguments
from plumbing.kafka import settings_from_args as kafka_settings_from_args
from plumbing.logs import configure_logging
from plumbing.service import Service, serve
from plumbing.service_settings import GatewaySettings
from plumbing.settings import SettingsError
from plumbing.settings import add_arguments as add_settings_arguments
from plumbing.settings import from_args as settings_from_args
from producer.client import FairnessClient
from schemas.config import Config, ConfigError, load_config
from schemas.topics import Topics

__all__ = ["ENV_PREFIX", "GatewayService", "add_arguments", "routes", "run"]

#: Environment variables of the gateway settings: SF_GATEWAY_<FIELD>.
ENV_PREFIX = "SF_GATEWAY_"
_ILLEGAL = re.compile(r"[^A-Za-z0-9._\-]")


def routes(max_waiting: int = 0) -> list[Route]:
    """Every route of the gateway, ``/openapi.json`` last (it describes the others)."""
    api: list[Route] = [
        openai_api.EmbeddingsRoute(), openai_api.ModelsRoute(),
        cohere_api.EmbedRoute(), cohere_api.RerankRoute(),
        tei_api.EmbedRoute(), tei_api.RerankRoute(), tei_api.InfoRoute(max_waiting),
        tei_api.HealthRoute(),
    ]
    return [*api, OpenApiRoute(api)]


class GatewayService(Service):
    """The HTTP gateway; see the module docstring.

    Fixed at construction: its settings, its reply topic. ``catalog`` (keys,
    endpoints) changes only through :meth:`apply`, swapped in whole.
    """

    name = "gateway"

    def __init__(self, config: Config, kafka: KafkaSettings,
                 settings: GatewaySettings | None = None, *,
                 registry: CollectorRegistry | None = None, config_path: str | None = None):
        settings = settings or GatewaySettings()
        super().__init__(config, kafka, settings, registry=registry,
                         config_path=config_path or settings.config_path,
                         config_poll_ms=settings.config_poll_ms,
                         stop_grace_s=settings.drain_s + 5.0)
        self.settings: GatewaySettings = settings
        self.metrics = GatewayMetrics(self.registry)
        self.catalog = self._catalog(config)
        self.metrics.keys.set(len(self.catalog.keys))
        topics = Topics.of(config)
        gateway_id = _ILLEGAL.sub("-", settings.gateway_id or uuid.uuid4().hex[:12])
        self.reply_topic = f"{topics.reply_prefix(config)}gateway-{gateway_id}"
        self.client = FairnessClient(kafka, config, self.reply_topic, wire_format="msgpack",
                                     client_id=f"gateway-{gateway_id}", keep_unclaimed=False)
        self.server = GatewayServer(
            routes(settings.max_waiting_requests), lambda: self.catalog, self.client,
            self.metrics, max_body_bytes=settings.max_body_bytes,
            max_waiting=settings.max_waiting_requests,
            max_waiting_per_org=max(1, int(settings.org_waiting_share
                                           * settings.max_waiting_requests)),
            max_wait_ms=settings.max_wait_ms,
            result_grace_ms=settings.result_grace_ms, log_lines_per_s=settings.log_lines_per_s,
            ready=self.readiness)

    def _catalog(self, config: Config) -> Catalog:
        try:
            return Catalog(config, tei_embed=self.settings.tei_embed_endpoint,
                           tei_rerank=self.settings.tei_rerank_endpoint)
        except ValueError as e:
            raise ConfigError([str(e)]) from None

    @property
    def url(self) -> str | None:
        """Where the HTTP API listens, once started."""
        return self.server.url

    async def open(self) -> None:
        await self.client.start()
        self.watch_broker(self.client.kafka_client(), self.client.topics.ingress,
                          self.metrics.broker_up)
        await self.server.start(self.settings.host, self.settings.port)
        self.log.info("gateway_started", url=self.server.url, reply_topic=self.reply_topic,
                      keys=len(self.catalog.keys))

    async def main(self) -> None:
        """Serve until a stop is requested, then drain the requests waiting."""
        await self._stopping.wait()
        cut = await self.server.drain(self.settings.drain_s)
        if cut:
            self.log.warning("gateway_drain_cut", requests=cut,
                             detail=f"still waiting after {self.settings.drain_s:g} s: "
                                    "answered 503")
        # The cut requests' handlers answer as soon as they run again.
        await asyncio.sleep(0)

    async def close(self) -> None:
        await self.server.stop()
        await self.client.stop()

    async def apply(self, config: Config) -> None:
        """A new registry: keys added and revoked, endpoints, caps; the topics must stay."""
        if config.service.topic_prefix != self.config.service.topic_prefix:
            raise ConfigError(["service.topic_prefix cannot change without a restart"])
        catalog = self._catalog(config)
        self.config, self.catalog = config, catalog
        self.metrics.keys.set(len(catalog.keys))
        self.log.info("gateway_config_applied", keys=len(catalog.keys),
                      endpoints=len(config.endpoints))

    def ready(self) -> tuple[bool, str]:
        if self.server.draining:
            return False, "draining"
        if self.server.url is None:
            return False, "the HTTP listener is not up yet"
        return True, "ok"

    def totals_fields(self) -> dict[str, Any]:
        return {"answered": self.server.answered, "waiting": self.server.waiting,
                "unclaimed_results": self.client.unclaimed,
                "duplicate_results": self.client.duplicates}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``serving-fairness gateway``: the settings' own, then Kafka's."""
    parser.add_argument("--config", required=True, help="the deployment's TOML configuration")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING...")
    add_settings_arguments(parser.add_argument_group(
        "gateway", "flags override the SF_GATEWAY_* environment"), GatewaySettings,
        env_prefix=ENV_PREFIX)
    add_kafka_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the gateway until SIGTERM or SIGINT; SIGHUP reloads the configuration (keys)."""
    configure_logging(args.log_level)
    try:
        config = load_config(args.config)
        settings = settings_from_args(GatewaySettings, args, env_prefix=ENV_PREFIX)
        Catalog(config, tei_embed=settings.tei_embed_endpoint,
                tei_rerank=settings.tei_rerank_endpoint)
    except (ConfigError, SettingsError, ValueError) as e:
        print(f"serving-fairness gateway: {e}", file=sys.stderr)
        return 2
    kafka = kafka_settings_from_args(args)
    return asyncio.run(serve(lambda k: GatewayService(config, k, settings,
                                                      config_path=args.config), kafka))

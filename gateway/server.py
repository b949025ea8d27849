"""The HTTP side of the gateway: one handler for every route, on aiohttp.

What every route shares happens here, in this order, before the route's
own code sees anything:

1. **The key.** ``Authorization: Bearer <key>`` is looked up in the
   current :class:`~gateway.keys.KeyRing`; a missing, malformed, unknown or
   revoked key gets 401, one answer whatever was wrong, and the route is
   never called. The key is never logged, counted or echoed.
2. **The size.** A body over ``max_body_bytes`` gets 413: by its
   ``Content-Length`` before a byte of it is read, or, without one, as soon
   as the bytes read pass the limit (aiohttp's ``client_max_size``).
3. **The body.** It decodes with the route's msgspec type; what does not
   gets 400 naming the field. An ``org`` the body names (or OpenAI's
   ``OpenAI-Organization`` header) that is not the key's gets 403.
4. **The room.** At most ``max_waiting_requests`` wait for a result at
   once; one more gets 503 at once, so memory stays bounded. Of those, at
   most ``max_waiting_per_org`` of one org's: its next gets 429
   (``org_waiting_limit``, ``Retry-After``), and the others still get in.
5. **The wait.** The request goes to the pipeline with the org from the
   key and a deadline: the client's own timeout when it sends one
   (``x-stainless-read-timeout``, as OpenAI's SDK does, or
   ``X-Request-Timeout``, seconds), else ``max_wait_ms``; work nobody waits
   for is not served. The wait for its one result is bounded by the
   deadline plus ``result_grace_ms``. A client that disconnects cancels its
   wait; its result is dropped when it arrives.
6. **The answer.** An ok result goes to the route; any other outcome is a
   :class:`~gateway.call.Failure` (:func:`gateway.call.failure_of`), in the
   route's error shape, 429 with ``Retry-After``.

A stop drains: new requests get 503 while those waiting are answered, for
up to ``drain_s``; any still waiting then get 503. None is dropped silently.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from aiokafka.errors import KafkaError

from gateway.call import Call, Failure, failure_of, field_at, retry_after_s
from gateway.catalog import Catalog
from gateway.metrics import GatewayMetrics
from gateway.route import Route
from plumbing.bounded import within
from plumbing.logs import LogSampler, get_logger
from producer.client import FairnessClient
from schemas.messages import Request

__all__ = ["Draining", "GatewayServer"]

log = get_logger("gateway")

_JSON = "application/json"
_encoder = msgspec.json.Encoder()


class Draining(Exception):
    """The gateway is stopping: a request still waiting when the drain ended."""


class GatewayServer:
    """The aiohttp application and its listener.

    ``catalog`` is called once per request: a reload swaps what it returns,
    and a request keeps the one it got. Fixed at construction: the routes,
    the client, the limits.
    """

    def __init__(self, routes: list[Route], catalog: Callable[[], Catalog],
                 client: FairnessClient, metrics: GatewayMetrics, *,
                 max_body_bytes: int, max_waiting: int, max_wait_ms: int,
                 max_waiting_per_org: int | None = None,
                 result_grace_ms: int, log_lines_per_s: int = 20,
                 ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok")):
        self.routes = routes
        self.catalog = catalog
        self.client = client
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_waiting = max_waiting
        self.max_waiting_per_org = max_waiting if max_waiting_per_org is None \
            else max_waiting_per_org
        self.max_wait_ms = max_wait_ms
        self.result_grace_ms = result_grace_ms
        self.ready = ready
        self.waiting = 0
        #: Waiting requests per org (an org with none has no entry).
        self.waiting_by_org: dict[str, int] = {}
        # Read at scrape time: nothing per request.
        metrics.waiting.set_function(lambda: self.waiting)
        #: Request ids: random per process (no two gateways, or starts, share one),
        #: then a counter: unique without a uuid4 per request.
        self._id_prefix = uuid.uuid4().hex[:16] + "-"
        self._ids = itertools.count(1)
        self.draining = False
        self.answered = 0
        self._sampler = LogSampler(log_lines_per_s)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.url: str | None = None
        self.app = web.Application(client_max_size=max_body_bytes)
        for route in routes:
            self.app.router.add_route(route.method, route.path, self._handler(route))

    # -- lifecycle -------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        # handler_cancellation: a client that goes away cancels its handler,
        # and with it the wait for a result nobody will read.
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, backlog=1024)
        await self._site.start()
        sockets = self._runner.addresses
        bound = sockets[0][1] if sockets else port
        self.port = bound
        self.url = f"http://{host}:{bound}"

    async def drain(self, seconds: float) -> int:
        """Refuse new requests, answer those waiting within ``seconds``; how many were cut."""
        self.draining = True
        try:
            await within(self._idle.wait(), seconds)
            return 0
        except TimeoutError:
            return self.client.fail_waiting(Draining(
                f"the gateway stopped before a result came (drain of {seconds:g} s)"))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- one request -------------------------------------------------------------

    def _handler(self, route: Route):
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                response = await self._handle(route, request)
            except asyncio.CancelledError:
                self.metrics.answered(route.name, 499, time.perf_counter() - started)
                raise
            except Exception as e:  # noqa: BLE001 - a bug answers 500, never a dropped request
                log.error("gateway_request_failed", route=route.name, error=repr(e))
                response = self._error(route, Failure(500, "internal_error",
                                                      "the gateway failed to answer"))
            self.metrics.answered(route.name, response.status, time.perf_counter() - started)
            self.answered += 1
            return response
        handle.__name__ = route.name
        return handle

    async def _handle(self, route: Route, request: web.Request) -> web.Response:
        catalog = self.catalog()
        org = None
        if route.auth:
            org = catalog.keys.org_of(request.headers.get("Authorization"))
            if org is None:
                self.metrics.unauthenticated.inc()
                return self._error(route, Failure(
                    401, "unauthorized", "invalid or missing API key: send "
                    "'Authorization: Bearer <key>' with a key of this deployment"))
        if route.request_type is None:
            if route.path == "/health":
                ok, why = self.ready()
                return web.Response(status=200 if ok else 503, text="" if ok else why)
            return self._json(200, route.get(catalog, org))
        if org is None:  # a route with a body always acts for a proven org
            return self._error(route, Failure(401, "unauthorized", "an API key is needed"))
        if self.draining:
            return self._error(route, Failure(503, "shutting_down",
                                              "the gateway is stopping; retry another replica"),
                               close=True)
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            return self._error(route, self._too_large(), close=True)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._error(route, self._too_large(), close=True)
        try:
            body = msgspec.json.decode(raw, type=route.request_type)
        except msgspec.ValidationError as e:
            return self._error(route, Failure(400, "invalid_body", str(e), field_at(str(e))))
        except msgspec.DecodeError as e:
            return self._error(route, Failure(400, "invalid_json", f"the body is not JSON: {e}"))
        claimed = route.named_org(body) or request.headers.get("OpenAI-Organization")
        if claimed is not None and claimed != org:
            return self._error(route, Failure(
                403, "forbidden", "this API key does not act for the org the request names"))
        made = route.call(body, org, catalog)
        if isinstance(made, Failure):
            return self._error(route, made)
        return await self._serve(route, request, made, org, catalog)

    async def _serve(self, route: Route, request: web.Request, call: Call, org: str,
                     catalog: Catalog) -> web.Response:
        if self.waiting >= self.max_waiting:
            self.metrics.refused_full.inc()
            return self._error(route, Failure(
                503, "gateway_full", f"{self.waiting} requests are waiting at this gateway "
                "(max_waiting_requests); retry shortly", retry_after_ms=1000))
        mine = self.waiting_by_org.get(org, 0)
        if mine >= self.max_waiting_per_org:
            self.metrics.refused_org_full.inc()
            return self._error(route, Failure(
                429, "org_waiting_limit", f"{mine} requests of this org are waiting at this "
                "gateway (its share of max_waiting_requests); retry shortly",
                retry_after_ms=1000))
        deadline_ms = self._deadline_ms(request)
        rid = f"{self._id_prefix}{next(self._ids):x}"
        req = Request(id=rid, org=org, endpoint=call.endpoint, input=call.input,
                      priority=call.priority, deadline_ms=deadline_ms,
                      created_ms=int(time.time() * 1000), reply_to=self.client.reply_topic)
        self.waiting += 1
        self.waiting_by_org[org] = mine + 1
        self._idle.clear()
        answered = False
        try:
            await self.client.submit(req)
            result = await self.client.result(rid, (deadline_ms + self.result_grace_ms) / 1000)
            answered = True
        except Draining as e:
            return self._error(route, Failure(503, "shutting_down", str(e)), rid=rid)
        except KafkaError as e:
            self._sampler.log(log, "warning", "gateway_submit_failed", time.time() * 1000,
                              route=route.name, org=org, request_id=rid, error=repr(e))
            return self._error(route, Failure(503, "pipeline_unavailable",
                                              "the pipeline could not take the request; retry",
                                              retry_after_ms=1000), rid=rid)
        except TimeoutError:
            return self._error(route, Failure(
                504, "no_result", f"no result within {deadline_ms / 1000:g} s"), rid=rid)
        finally:
            if not answered:
                self.client.abandon(rid)
            self.waiting -= 1
            if (left := self.waiting_by_org[org] - 1) > 0:
                self.waiting_by_org[org] = left
            else:
                del self.waiting_by_org[org]
            if self.waiting == 0:
                self._idle.set()
        failure = failure_of(result)
        if failure is not None:
            if failure.status >= 500 or self._sampler.allow(time.time() * 1000):
                log.info("request_refused", route=route.name, org=org, request_id=rid,
                         status=result.status, reason=result.reason)
            return self._error(route, failure, rid=rid)
        return self._json(200, route.answer(result, call, catalog), rid=rid)

    def _deadline_ms(self, request: web.Request) -> int:
        """The client's timeout (seconds, from its SDK's header) or ``max_wait_ms``, the lower."""
        limit = self.max_wait_ms
        for header in ("x-stainless-read-timeout", "X-Request-Timeout"):
            given = request.headers.get(header)
            if given is None:
                continue
            try:
                seconds = float(given)
            except ValueError:
                continue
            if math.isfinite(seconds) and seconds > 0:
                limit = min(limit, max(1, int(min(seconds * 1000, limit))))
        return limit

    # -- answers -------------------------------------------------------------

    def _too_large(self) -> Failure:
        return Failure(413, "body_too_large",
                       f"the body is larger than {self.max_body_bytes} bytes (max_body_bytes)")

    def _json(self, status: int, body: Any, *, rid: str | None = None) -> web.Response:
        headers = {"x-request-id": rid} if rid else None
        return web.Response(status=status, body=_encoder.encode(body), content_type=_JSON,
                            headers=headers)

    def _error(self, route: Route, failure: Failure, *, rid: str | None = None,
               close: bool = False) -> web.Response:
        headers: dict[str, str] = {}
        if failure.retry_after_ms is not None:
            headers["Retry-After"] = retry_after_s(failure.retry_after_ms)
            headers["retry-after-ms"] = str(failure.retry_after_ms)
        if failure.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if rid:
            headers["x-request-id"] = rid
        if close:
            headers["Connection"] = "close"
        return web.Response(status=route.status(failure),
                            body=_encoder.encode(route.error(failure)),
                            content_type=_JSON, headers=headers)


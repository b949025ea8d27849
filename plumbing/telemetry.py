"""One small HTTP endpoint per service: ``/metrics``, ``/healthz`` and ``/readyz``.

``/healthz`` answers 200 while the event loop runs (alive). ``/readyz``
answers 200 only when the service says it is ready (connected to the broker,
partitions assigned, model loaded), else 503 with the reason, so an
orchestrator stops routing to it. ``/metrics`` renders the service's own
prometheus registry (created per service and passed in, never the global
default, so several services in one process stay apart).

A tiny asyncio HTTP/1.1 server: no framework, one request per connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Self

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from plumbing.bounded import within

__all__ = ["Readiness", "TelemetryServer"]

#: Returns (ready, reason). Called on every /readyz request: keep it cheap.
Readiness = Callable[[], tuple[bool, str]]


class TelemetryServer:
    """Serves a registry and health checks on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, registry: CollectorRegistry, ready: Readiness | None = None, *,
                 host: str = "127.0.0.1", port: int = 0):
        self.registry = registry
        self.ready = ready or (lambda: (True, "ok"))
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await within(reader.readline(), 5)
            while await within(reader.readline(), 5) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            status, ctype, body = self._route(path)
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            try:
                ok, reason = self.ready()
            except Exception as e:  # noqa: BLE001 - a broken probe means not ready, never a crash
                ok, reason = False, f"readiness check failed: {e!r}"
            return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", f"{reason}\n".encode()
        return "404 Not Found", "text/plain", b"not found\n"

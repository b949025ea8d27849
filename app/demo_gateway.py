"""The demo's quiet orgs, as HTTP clients of the gateway with API keys of their own.

A team that calls Serving Fairness calls it over HTTP with its key, as it
calls any embedding service: the demo's paced orgs do the same. Each gets
a fresh key at the demo's start (:func:`demo_keys`), held in the demo's
memory only and sent in ``Authorization: Bearer``; the services read a copy
of the configuration that lists the keys' hashes (:func:`config_with_keys`),
written for the run and removed after it. The embed orgs call OpenAI's
``POST /v1/embeddings``, the rerank org Cohere's ``POST /v2/rerank``, over
one keep-alive ``aiohttp`` session per phase. The bursting org stands for a
bulk job and keeps producing to Kafka directly (:mod:`app.demo_burst`).

A request's latency is the HTTP client's: from before the request is
written to its response read, the HTTP hops included. Its stage stamps
(:mod:`traffic.stages`) come from the pipeline's :class:`Result` itself,
read beside the gateway on its reply topic (the gateway runs with a fixed
``--gateway-id``, so the topic is known) by a consumer of the demo's own
that takes no part in the gateway's reading; the response's
``x-request-id`` names it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Self

import aiohttp
import msgspec

from gateway.keys import hash_key, new_key
from schemas.build import build_config
from schemas.config import Config
from schemas.messages import Result, Status
from schemas.topics import Topics

if TYPE_CHECKING:
    from producer.client import FairnessClient

__all__ = ["GATEWAY_ID", "Answer", "GatewayTraffic", "config_with_keys", "demo_keys",
           "gateway_args", "reply_topic"]

#: The demo gateway's ``--gateway-id``: its reply topic is ``<prefix>replies.gateway-demo``.
GATEWAY_ID = "demo"
#: How long, after its HTTP answer, a request's result may take to reach the
#: demo's reader of the reply topic (it is there already, as a rule).
STAMPS_WAIT_S = 30.0
#: HTTP statuses that may carry a result of the pipeline (the others are the
#: gateway's own answers: 401, 403, 404, 413, 503).
_FROM_PIPELINE = frozenset({200, 400, 422, 429, 500, 504})


def demo_keys(orgs: Iterable[str]) -> dict[str, str]:
    """A fresh API key per org, for this run only: never written, printed or logged."""
    return {org: new_key() for org in orgs}


def config_with_keys(config_path: str | Path, keys: Mapping[str, str]) -> str:
    """The configuration at ``config_path`` as TOML, each org of ``keys`` listing its key's hash."""
    return build_config(base=Path(config_path).read_text(),
                        orgs={org: {"api_keys": [hash_key(key)]}
                              for org, key in keys.items()}).text


def reply_topic(config: Config) -> str:
    """The demo gateway's reply topic."""
    return f"{Topics.of(config).reply_prefix(config)}gateway-{GATEWAY_ID}"


def gateway_args(timeout_s: float) -> list[str]:
    """Flags of the demo's gateway: its id, and the phase's timeout as the longest wait."""
    return ["--gateway-id", GATEWAY_ID, "--max-wait-ms", str(max(1, int(timeout_s * 1000)))]


@dataclass
class Answer:
    """One HTTP call: its status, the gateway's request id, and the pipeline's result."""

    status: int
    request_id: str | None
    #: The pipeline's result as read on the reply topic (its stamps), or, for
    #: an answer the gateway gave itself (401, 503, 504...), one made of the
    #: HTTP answer with no stamps; None when no HTTP answer came.
    result: Result | None
    done_s: float
    done_ms: float


@dataclass(eq=False)
class GatewayTraffic:
    """The paced orgs' HTTP calls to the gateway at ``url``, and what they got."""

    url: str
    keys: Mapping[str, str]
    #: Reads the gateway's reply topic.
    observer: FairnessClient
    timeout_s: float
    session: aiohttp.ClientSession | None = None
    #: HTTP statuses of the answers, and calls that got none (``"none"``).
    statuses: Counter = field(default_factory=Counter)
    #: ok answers whose result the reply topic did not yield (no stamps for them).
    unstamped: int = 0

    async def __aenter__(self) -> Self:
        self.session = aiohttp.ClientSession(
            base_url=self.url, timeout=aiohttp.ClientTimeout(total=self.timeout_s + 30),
            connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *exc) -> None:
        if self.session is not None:
            await self.session.close()

    @property
    def calls(self) -> int:
        return sum(self.statuses.values())

    def line(self, orgs: Iterable[str]) -> str:
        """``through the gateway: N HTTP requests (orgs), status 200 x N`` and what else."""
        shown = ", ".join(f"{k} x {v}" for k, v in sorted(self.statuses.items(),
                                                          key=lambda kv: str(kv[0])))
        extra = (f"; {self.unstamped} ok without the result's stamps (not read on the "
                 "reply topic)" if self.unstamped else "")
        return (f"through the gateway: {self.calls} HTTP requests with the orgs' keys "
                f"({', '.join(orgs)}): status {shown or 'none'}{extra}")

    async def call(self, org: str, endpoint: str, kind: str, inp: dict) -> Answer:
        """One request as its SDK sends it: OpenAI's embeddings, or Cohere's rerank."""
        if kind == "rerank":
            path = "/v2/rerank"
            body = {"model": endpoint, "query": inp["query"], "documents": inp["documents"]}
        else:
            path = "/v1/embeddings"
            body = {"model": endpoint, "input": inp["texts"]}
        headers = {"Authorization": f"Bearer {self.keys[org]}",
                   "X-Request-Timeout": f"{self.timeout_s:g}"}
        if self.session is None:
            raise RuntimeError("GatewayTraffic is not open (use `async with`)")
        try:
            async with self.session.post(path, json=body, headers=headers) as resp:
                payload = await resp.read()
                status, rid = resp.status, resp.headers.get("x-request-id")
        except (aiohttp.ClientError, TimeoutError):
            self.statuses["none"] += 1
            return Answer(0, None, None, time.monotonic(), time.time() * 1000)
        done_s, done_ms = time.monotonic(), time.time() * 1000
        self.statuses[status] += 1
        result = None
        if rid is not None and status in _FROM_PIPELINE:
            try:
                result = await self.observer.result(rid, timeout=STAMPS_WAIT_S)
            except TimeoutError:
                result = None
        if result is None:
            if status == 200:
                self.unstamped += 1
            result = Result(id=rid or "", status=_status(status), org=org, endpoint=endpoint,
                            reason=None if status == 200 else f"http_{status}",
                            message=_message(payload))
        return Answer(status, rid, result, done_s, done_ms)


def _status(http: int) -> Status:
    """The pipeline status an HTTP answer stands for (the gateway's mapping, reversed)."""
    if http == 200:
        return "ok"
    if http in (429, 503):
        return "rejected"
    if http == 504:
        return "expired"
    if http in (400, 404, 413, 422):
        return "invalid"
    return "failed"


def _message(payload: bytes) -> str | None:
    try:
        return str(msgspec.json.decode(payload))[:200]
    except msgspec.DecodeError:
        return payload[:200].decode(errors="replace") or None

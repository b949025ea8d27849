"""A small registry and request builders shared by the admission tests.

Limits are tiny and round so that expected retry-afters can be worked out by
hand: the free tier's embed window of 3 requests per 60 s refills one request
every 20,000 ms.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.build import Built, build_config
from schemas.config import Config

__all__ = ["NOW_MS", "REGISTRY", "make_config", "registry", "request_dict", "request_json"]

#: A fixed "now" for pure tests, in epoch milliseconds.
NOW_MS = 1_700_000_000_000

_SMALL = {"model": "fake", "quantum": 64, "max_batch_tokens": 64, "max_request_tokens": 20,
          "max_texts": 4, "max_text_chars": 50, "latency_target_ms": 1000}

#: The test registry: tiers enterprise > standard > free; free orgs are limited on embed
#: (3 requests and 40 tokens a minute, 5 requests a day) and refused rerank, but for
#: vip-trial's own 1000 a second.
REGISTRY = build_config(
    prefix="sf.", reply_prefix="replies.", max_held_requests=100, max_message_bytes=2000,
    tiers=["enterprise", "standard", "free"],
    endpoints={"embed": {**_SMALL, "priority_cap": {"enterprise": 9, "standard": 5, "free": 2}},
               "rerank": _SMALL},
    orgs={"acme": {"tier": "enterprise", "weight": 2.0}, "bulk": "standard", "quiet": "standard",
          "trial": "free",
          "vip-trial": {"tier": "free", "limits": {"embed": [{"window_s": 1, "requests": 1000}]}}},
    limits={"free": {"embed": [{"window_s": 60, "requests": 3, "tokens": 40},
                               {"window_s": 86400, "requests": 5}],
                     "rerank": [{"window_s": 60, "requests": 0}]}})


def registry(**changes: Any) -> Built:
    """The test registry with ``changes`` merged in (the arguments of ``build_config``)."""
    return build_config(base=REGISTRY.data, **changes)


def make_config(**service: Any) -> Config:
    """The test registry, with ``[service]`` keys overridden."""
    return registry(**service).config


def request_dict(**fields: Any) -> dict[str, Any]:
    """A valid embed request of org ``trial`` (2 tokens), with ``fields`` overriding."""
    base: dict[str, Any] = {
        "id": "r-1",
        "org": "trial",
        "endpoint": "embed",
        "input": {"type": "embed", "texts": ["hello world"]},
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def request_json(**fields: Any) -> bytes:
    """:func:`request_dict` as the JSON bytes a plain Kafka client would send."""
    return msgspec.json.encode(request_dict(**fields))

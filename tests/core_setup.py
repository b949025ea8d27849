"""Small, checked configurations and drivers for the scheduler core's tests.

Every configuration goes through :func:`schemas.config.parse_config`, so the
tests only ever run the core under settings the service would accept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduler import Entry, Scheduler
from schemas.build import Built, build_config
from schemas.config import Config

__all__ = ["ENDPOINT", "config_dict", "config_for", "flat", "ids", "run_until_empty", "served_by"]

#: The endpoint name used by single-endpoint tests.
ENDPOINT = "e"


def _built(
    *,
    tiers: Iterable[str] = ("t0",),
    min_share: Mapping[str, float] | None = None,
    orgs: Mapping[str, str | tuple[str, float]] | None = None,
    endpoints: Iterable[str] = (ENDPOINT,),
    cost_model: str = "tokens",
    quantum: float = 100,
    max_batch_tokens: int = 1000,
    max_batch_size: int = 64,
    max_request_tokens: int = 100,
    ema_alpha: float = 0.2,
) -> Built:
    """One tier ``t0`` and one endpoint by default; ``orgs`` maps org -> tier or (tier, weight)."""
    shares = dict(min_share or {})
    endpoint = {
        "model": None,  # the loader's default: the core never loads a model
        "cost_model": cost_model,
        "quantum": quantum,
        "max_batch_tokens": max_batch_tokens,
        "max_batch_size": max_batch_size,
        "max_request_tokens": max_request_tokens,
        "ema_alpha": ema_alpha,
    }
    return build_config(
        tiers=[{"name": t, "min_share": shares.get(t)} for t in tiers],
        endpoints=dict.fromkeys(endpoints, endpoint),
        orgs={name: {"tier": spec, "weight": 1.0} if isinstance(spec, str)
              else {"tier": spec[0], "weight": spec[1]} for name, spec in (orgs or {}).items()},
    )


def config_dict(**kwargs) -> dict:
    """The raw (TOML-shaped) dict of a configuration, to change and parse; keyword arguments
    as for :func:`_built`."""
    return _built(**kwargs).data


def config_for(**kwargs) -> Config:
    """A checked :class:`Config`; keyword arguments as for :func:`_built`."""
    return _built(**kwargs).config


def run_until_empty(
    sched: Scheduler, now: float, endpoint: str = ENDPOINT, limit: int = 100_000
) -> list[list[Entry]]:
    """Take batches at ``now`` until one comes back empty; return the non-empty ones."""
    batches = []
    for _ in range(limit):
        batch = sched.next_batch(endpoint, now).batch
        if not batch:
            return batches
        batches.append(batch)
    raise AssertionError(f"{endpoint} still serving after {limit} batches")


def flat(batches: Iterable[list[Entry]]) -> list[Entry]:
    """Batches concatenated, in the order they left."""
    return [e for batch in batches for e in batch]


def ids(entries: Iterable[Entry]) -> list[str]:
    return [e.id for e in entries]


def served_by(entries: Iterable[Entry], key=lambda e: e.tokens) -> dict[str, float]:
    """Sum of ``key`` (tokens by default) per org."""
    out: dict[str, float] = {}
    for e in entries:
        out[e.org] = out.get(e.org, 0) + key(e)
    return out

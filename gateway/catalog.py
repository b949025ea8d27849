"""What the routes need to know of the deployment: endpoints as models, tiers' caps, keys.

Built from the configuration at start and on every reload, then swapped in
whole (a request sees one configuration, old or new). A model name on the
HTTP side is an endpoint name of the configuration: ``model="embed"`` on
OpenAI's route is ``[endpoints.embed]``.

What a model folder says (its maximum input length and vector size, for
TEI's ``/info`` and Cohere's ``max_tokens``) is read from its files without
loading it (:mod:`tokens.specs`); where the folder is not installed (a slim
gateway image without the model wheel) it is unknown, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.keys import KeyRing
from schemas.config import Config, Endpoint
from tokens.specs import (
    FAKE_DIM,
    ModelSpecError,
    is_fake_spec,
    model_dimension,
    model_max_seq_length,
    parse_fake_spec,
    resolve_model_path,
)

__all__ = ["Catalog", "ModelFacts"]


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What an endpoint's model folder declares; None where it does not say."""

    max_input_tokens: int | None = None
    dimensions: int | None = None


class Catalog:
    """The endpoints, the orgs' tiers and caps, and the key ring of one configuration.

    Immutable: a reload builds a new one. ``tei_embed`` and ``tei_rerank``
    name the endpoints TEI's routes (which carry no model) serve.
    """

    def __init__(self, config: Config, *, tei_embed: str | None = None,
                 tei_rerank: str | None = None):
        self.config = config
        self.keys = KeyRing.of(config)
        self.tei_embed = tei_embed or self._first("embed")
        self.tei_rerank = tei_rerank or self._first("rerank")
        for name, kind in ((self.tei_embed, "embed"), (self.tei_rerank, "rerank")):
            if name is not None and self.kind_of(name) != kind:
                raise ValueError(f"TEI's {kind} endpoint {name!r} is not an {kind} endpoint "
                                 "of the configuration")
        self._facts: dict[str, ModelFacts] = {}

    def _first(self, kind: str) -> str | None:
        return next((n for n, e in self.config.endpoints.items() if e.kind == kind), None)

    def endpoint(self, name: str) -> Endpoint | None:
        return self.config.endpoints.get(name)

    def kind_of(self, name: str) -> str | None:
        ep = self.config.endpoints.get(name)
        return ep.kind if ep is not None else None

    def models(self) -> list[tuple[str, str]]:
        """``(endpoint, kind)`` of every endpoint, in the configuration's order."""
        return [(n, e.kind) for n, e in self.config.endpoints.items()]

    def priority_cap(self, org: str, endpoint: str) -> int:
        """The highest pipeline priority ``org`` may ask for on ``endpoint`` (its tier's cap)."""
        tier = self.config.orgs[org].tier
        return self.config.priority_cap(tier, endpoint)

    def facts(self, endpoint: str) -> ModelFacts:
        """The endpoint's model's declared limits, read once per catalog."""
        got = self._facts.get(endpoint)
        if got is None:
            got = self._facts[endpoint] = _read_facts(self.config.endpoints[endpoint].model)
        return got


def _read_facts(spec: str) -> ModelFacts:
    if is_fake_spec(spec):
        try:
            fake = parse_fake_spec(spec)
        except ValueError:
            return ModelFacts()
        length, dim = fake.get("max_seq_length"), fake.get("dim", FAKE_DIM)
        return ModelFacts(int(length) if length else None, int(dim))
    try:
        folder = resolve_model_path(spec)
    except ModelSpecError:
        return ModelFacts()
    try:
        return ModelFacts(model_max_seq_length(folder), model_dimension(folder))
    except (OSError, ValueError):
        return ModelFacts()

"""text-embeddings-inference's API: ``POST /embed``, ``POST /rerank``, ``GET /info``, ``GET /health``.

TEI serves one model per server, so its bodies name none: ``/embed`` is
served by the gateway's ``tei_embed_endpoint`` (default: the first embed
endpoint of the configuration), ``/rerank`` by ``tei_rerank_endpoint``.

``/embed``

=========================  ==================================================
TEI field                  pipeline
=========================  ==================================================
``inputs``                 ``texts``: a string or a list of strings
``normalize``              ``normalize`` (TEI's default ``true``: length 1)
``truncate``               ``false``: ``truncate: none`` (too long is refused,
                           422); ``true`` or absent: the model cuts
``truncation_direction``   ``Right`` (default): ``end``; ``Left``: ``start``
``dimensions``             ``dimensions``
``prompt_name``            ``prompt_name``
=========================  ==================================================

The answer is the list of vectors. ``/rerank``: ``query``, ``texts``,
``truncate``/``truncation_direction`` as above, ``return_text`` (the texts
come back with their ranks); the answer is ``[{index, score, text?}]``,
best first. ``raw_scores`` is accepted and changes nothing: the scores are
what the endpoint's method gives (cosine similarity, or the cross-encoder's
score after its activation). Errors are ``{error, error_type}``; an invalid
request is 422 (``validation``), as TEI's tokenizer errors are.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import numpy as np
from msgspec import Meta

from gateway.call import Call, Failure
from gateway.catalog import Catalog
from gateway.route import Route
from schemas.messages import EmbedInput, RerankInput, Result
from schemas.options import Dimensions, PromptName, Truncate

__all__ = ["EmbedRoute", "HealthRoute", "InfoRoute", "RerankRoute"]

Direction = Literal["Left", "Right", "left", "right"]
Texts = str | Annotated[list[str], Meta(min_length=1)]


class EmbedRequest(msgspec.Struct, kw_only=True):
    """The body of ``POST /embed``."""

    inputs: Texts
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Direction = "Right"
    dimensions: Dimensions | None = None
    prompt_name: PromptName | None = None
    org: str | None = None


class RerankRequest(msgspec.Struct, kw_only=True):
    """The body of ``POST /rerank``."""

    query: str
    texts: Annotated[list[str], Meta(min_length=1)]
    truncate: bool | None = None
    truncation_direction: Direction = "Right"
    raw_scores: bool = False
    return_text: bool = False
    org: str | None = None


class Rank(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


class EmbeddingModel(msgspec.Struct, kw_only=True):
    pooling: str = "mean"


class ModelType(msgspec.Struct, kw_only=True, omit_defaults=True):
    embedding: EmbeddingModel | None = None
    reranker: dict[str, str] | None = None


class Info(msgspec.Struct, kw_only=True):
    """``GET /info``: the model ``/embed`` serves, and the gateway's limits."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str = "float32"
    model_type: ModelType
    max_concurrent_requests: int
    max_input_length: int | None
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool = True
    tokenization_workers: int = 1
    version: str = "serving-fairness"


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: str
    error_type: str


_ERROR_TYPES = {400: "validation", 401: "unauthorized", 403: "unauthorized",
                404: "validation", 413: "validation", 422: "validation", 429: "overloaded",
                503: "unhealthy"}


class _Tei(Route):
    api = "tei"
    error_type = ErrorResponse

    def error(self, failure: Failure) -> ErrorResponse:
        return ErrorResponse(error=failure.message,
                             error_type=_ERROR_TYPES.get(self.status(failure), "backend"))

    def status(self, failure: Failure) -> int:
        return 422 if failure.status == 400 else failure.status


def _truncate(truncate: bool | None, direction: str) -> Truncate:
    if truncate is False:
        return "none"
    return "start" if direction.lower() == "left" else "end"


def _no_endpoint(kind: str) -> Failure:
    return Failure(404, "model_not_found", f"this deployment has no {kind} endpoint")


class EmbedRoute(_Tei):
    name = "tei_embed"
    path = "/embed"
    summary = "Embed texts (text-embeddings-inference's API)"
    request_type = EmbedRequest
    response_type = list[list[float]]

    def call(self, body: EmbedRequest, org: str, catalog: Catalog) -> Call | Failure:
        if catalog.tei_embed is None:
            return _no_endpoint("embed")
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        inp = EmbedInput(texts=tuple(texts), normalize=body.normalize, dimensions=body.dimensions,
                         prompt_name=body.prompt_name, embedding_types=["float"],
                         encoding="base64",
                         truncate=_truncate(body.truncate, body.truncation_direction))
        return Call(catalog.tei_embed, inp)

    def answer(self, result: Result, call: Call, catalog: Catalog) -> list[list[float]]:
        rows = (result.embeddings_packed or {}).get("float", [])
        return [np.frombuffer(r, dtype="<f4").tolist() for r in rows]


class RerankRoute(_Tei):
    name = "tei_rerank"
    path = "/rerank"
    summary = "Rerank texts against a query (text-embeddings-inference's API)"
    request_type = RerankRequest
    response_type = list[Rank]

    def call(self, body: RerankRequest, org: str, catalog: Catalog) -> Call | Failure:
        if catalog.tei_rerank is None:
            return _no_endpoint("rerank")
        inp = RerankInput(query=body.query, documents=tuple(body.texts),
                          truncate=_truncate(body.truncate, body.truncation_direction))
        return Call(catalog.tei_rerank, inp, 0, {"texts": body.texts if body.return_text
                                                 else None})

    def answer(self, result: Result, call: Call, catalog: Catalog) -> list[Rank]:
        scores = result.scores or []
        texts = call.extra["texts"]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [Rank(index=i, score=float(scores[i]), text=texts[i] if texts else None)
                for i in order]


class InfoRoute(_Tei):
    name = "tei_info"
    method = "GET"
    path = "/info"
    summary = "The model /embed serves (text-embeddings-inference's info)"
    auth = False
    response_type = Info

    def __init__(self, max_waiting: int = 0):
        self.max_waiting = max_waiting

    def get(self, catalog: Catalog, org: str | None) -> Info:
        name = catalog.tei_embed or catalog.tei_rerank or ""
        ep = catalog.endpoint(name)
        facts = catalog.facts(name) if ep is not None else None
        kind = (ModelType(embedding=EmbeddingModel()) if ep is None or ep.kind == "embed"
                else ModelType(reranker={}))
        return Info(model_id=ep.model if ep is not None else "", model_type=kind,
                    max_concurrent_requests=self.max_waiting,
                    max_input_length=facts.max_input_tokens if facts else None,
                    max_batch_tokens=ep.max_batch_tokens if ep is not None else 0,
                    max_batch_requests=ep.max_batch_size if ep is not None else None,
                    max_client_batch_size=ep.max_texts if ep is not None else 0)


class HealthRoute(_Tei):
    name = "tei_health"
    method = "GET"
    path = "/health"
    summary = "200 while the gateway can reach the pipeline (text-embeddings-inference's health)"
    auth = False
    response_type = None

    def get(self, catalog: Catalog, org: str | None) -> None:
        return None

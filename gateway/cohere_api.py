"""Cohere's v2 API: ``POST /v2/embed`` and ``POST /v2/rerank``.

As the ``cohere`` SDK's ``ClientV2`` sends and parses them:

``/v2/embed``

========================  ===================================================
Cohere field              pipeline
========================  ===================================================
``model``                 the embed endpoint of that name (404 otherwise)
``texts``                 ``texts``
``inputs``                ``texts``: each input's text parts, joined by a
                          space (image parts are refused, 400)
``images``                refused (400): the endpoints embed text
``input_type``            ``input_type``: the endpoint's prompt of that name;
                          an endpoint that lists no prompts ignores it (its
                          model needs none)
``embedding_types``       ``embedding_types`` (default ``["float"]``);
                          ``base64`` is the float vector's float32 bytes
``output_dimension``      ``dimensions``
``truncate``              ``truncate`` (``NONE``/``START``/``END``)
``max_tokens``            accepted when at least the model's own maximum
                          input length (where it cuts nothing); below it, 400
``priority``              0-999, lower first: see :func:`gateway.route.cohere_priority`
========================  ===================================================

The answer is ``{id, embeddings: {float | int8 | uint8 | binary | ubinary |
base64: [...]}, texts, meta: {api_version, billed_units: {input_tokens}},
response_type: "embeddings_by_type"}``.

``/v2/rerank``: ``model`` (a rerank endpoint), ``query``, ``documents``,
``top_n``, ``max_tokens_per_doc``, ``priority`` as above; the answer is
``{id, results: [{index, relevance_score}], meta}``, best first, cut to
``top_n``. Errors are ``{id, message}``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from gateway.call import Call, Failure
from gateway.catalog import Catalog
from gateway.route import Route, cohere_priority
from schemas.messages import EmbedInput, RerankInput, Result
from schemas.options import Dimensions, EmbeddingType, MaxTokensPerDoc
from schemas.vectors import decode_embeddings

__all__ = ["EmbedRoute", "RerankRoute"]

CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
CoherePriority = Annotated[int, Meta(ge=0, le=999)]
ModelName = Annotated[str, Meta(min_length=1, max_length=256)]


class TextContent(msgspec.Struct, kw_only=True, tag="text", tag_field="type"):
    text: str


class ImageContent(msgspec.Struct, kw_only=True, tag="image_url", tag_field="type"):
    image_url: dict[str, str]


class EmbedInputItem(msgspec.Struct, kw_only=True):
    content: Annotated[list[TextContent | ImageContent], Meta(min_length=1)]


class EmbedRequest(msgspec.Struct, kw_only=True):
    """The body of ``POST /v2/embed``."""

    model: ModelName
    input_type: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[EmbedInputItem] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    output_dimension: Dimensions | None = None
    embedding_types: Annotated[list[CohereType], Meta(min_length=1, max_length=6)] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None
    priority: CoherePriority | None = None
    #: Not Cohere's: an org the caller claims to be; refused (403) unless it is the key's.
    org: str | None = None


class RerankRequest(msgspec.Struct, kw_only=True):
    """The body of ``POST /v2/rerank``."""

    model: ModelName
    query: str
    documents: Annotated[list[str], Meta(min_length=1)]
    top_n: Annotated[int, Meta(ge=1)] | None = None
    max_tokens_per_doc: MaxTokensPerDoc | None = None
    priority: CoherePriority | None = None
    #: Accepted for the SDK's sake; spans are not computed.
    relevant_spans: bool | dict[str, Any] | None = None
    org: str | None = None


class ApiVersion(msgspec.Struct, kw_only=True):
    version: str = "2"


class BilledUnits(msgspec.Struct, kw_only=True, omit_defaults=True):
    input_tokens: int | None = None
    search_units: int | None = None


class ApiMeta(msgspec.Struct, kw_only=True):
    api_version: ApiVersion = msgspec.field(default_factory=ApiVersion)
    billed_units: BilledUnits = msgspec.field(default_factory=BilledUnits)


class Embeddings(msgspec.Struct, kw_only=True, omit_defaults=True, rename={"float_": "float"}):
    float_: list[list[float]] | None = None
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class EmbedResponse(msgspec.Struct, kw_only=True):
    id: str
    embeddings: Embeddings
    texts: list[str]
    meta: ApiMeta
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"


class RerankResult(msgspec.Struct, kw_only=True):
    index: int
    relevance_score: float


class RerankResponse(msgspec.Struct, kw_only=True):
    id: str
    results: list[RerankResult]
    meta: ApiMeta


class ErrorResponse(msgspec.Struct, kw_only=True):
    id: str
    message: str


#: Cohere's embedding type -> the pipeline's: ``base64`` is the float vector's bytes.
_PIPELINE_TYPE: dict[str, EmbeddingType] = {
    "float": "float", "int8": "int8", "uint8": "uint8", "binary": "binary",
    "ubinary": "ubinary", "base64": "float"}


class _Cohere(Route):
    api = "cohere"
    error_type = ErrorResponse

    def error(self, failure: Failure) -> ErrorResponse:
        return ErrorResponse(id=failure.code, message=failure.message)


def _wrong_model(model: str, kind: str) -> Failure:
    return Failure(404, "model_not_found",
                   f"model {model!r} not found: it is not a {kind} endpoint of this "
                   "deployment (GET /v1/models lists them)", "model")


class EmbedRoute(_Cohere):
    name = "cohere_embed"
    path = "/v2/embed"
    summary = "Embed texts (Cohere's v2 embed API)"
    request_type = EmbedRequest
    response_type = EmbedResponse

    def call(self, body: EmbedRequest, org: str, catalog: Catalog) -> Call | Failure:
        ep = catalog.endpoint(body.model)
        if ep is None or ep.kind != "embed":
            return _wrong_model(body.model, "embed")
        if body.images:
            return Failure(400, "invalid_input", "images are not supported: the endpoints "
                           "embed text", "images")
        if (body.texts is None) == (body.inputs is None):
            return Failure(400, "invalid_input", "give texts or inputs, one of them", "texts")
        if body.inputs is not None:
            texts = []
            for i, item in enumerate(body.inputs):
                if any(isinstance(c, ImageContent) for c in item.content):
                    return Failure(400, "invalid_input", "image content is not supported: "
                                   "the endpoints embed text", f"inputs[{i}].content")
                texts.append(" ".join(c.text for c in item.content
                                      if isinstance(c, TextContent)))
        else:
            texts = list(body.texts or [])
        if not texts:
            return Failure(400, "invalid_input", "texts must not be empty", "texts")
        if body.max_tokens is not None:
            limit = catalog.facts(body.model).max_input_tokens
            if limit is None or body.max_tokens < limit:
                return Failure(400, "invalid_option",
                               f"max_tokens below the model's own maximum input length "
                               f"({limit if limit else 'unknown'}) is not supported; leave it "
                               "out, or truncate the texts", "max_tokens")
        asked = list(dict.fromkeys(body.embedding_types or ["float"]))
        types = list(dict.fromkeys(_PIPELINE_TYPE[t] for t in asked))
        input_type = body.input_type if ep.prompts else None
        inp = EmbedInput(texts=tuple(texts), input_type=input_type, dimensions=body.output_dimension,
                         embedding_types=types, encoding="base64",
                         truncate=body.truncate or "end")
        priority = cohere_priority(body.priority, catalog.priority_cap(org, body.model))
        return Call(body.model, inp, priority, {"types": asked, "texts": texts})

    def answer(self, result: Result, call: Call, catalog: Catalog) -> EmbedResponse:
        arrays = decode_embeddings(result)
        emb = Embeddings()
        for t in call.extra["types"]:
            if t == "base64":
                emb.base64 = [base64.b64encode(r).decode()
                              for r in (result.embeddings_packed or {}).get("float", [])]
            elif t == "float":
                emb.float_ = arrays[t].tolist()
            else:
                setattr(emb, t, arrays[t].tolist())
        return EmbedResponse(id=result.id, embeddings=emb,
                             texts=call.extra["texts"],
                             meta=ApiMeta(billed_units=BilledUnits(input_tokens=result.tokens)))


class RerankRoute(_Cohere):
    name = "cohere_rerank"
    path = "/v2/rerank"
    summary = "Rerank documents against a query (Cohere's v2 rerank API)"
    request_type = RerankRequest
    response_type = RerankResponse

    def call(self, body: RerankRequest, org: str, catalog: Catalog) -> Call | Failure:
        if catalog.kind_of(body.model) != "rerank":
            return _wrong_model(body.model, "rerank")
        inp = RerankInput(query=body.query, documents=tuple(body.documents), top_n=body.top_n,
                          max_tokens_per_doc=body.max_tokens_per_doc)
        priority = cohere_priority(body.priority, catalog.priority_cap(org, body.model))
        return Call(body.model, inp, priority)

    def answer(self, result: Result, call: Call, catalog: Catalog) -> RerankResponse:
        scores = result.scores or []
        results = [RerankResult(index=int(i), relevance_score=float(scores[i]))
                   for i in (result.ranking or [])]
        return RerankResponse(id=result.id, results=results,
                              meta=ApiMeta(billed_units=BilledUnits(search_units=1)))


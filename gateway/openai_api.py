"""OpenAI's embeddings API: ``POST /v1/embeddings`` and ``GET /v1/models``.

As the ``openai`` SDK sends and parses it (``client.embeddings.create``):

========================  ===================================================
OpenAI field              pipeline
========================  ===================================================
``model``                 the endpoint of that name (an embed endpoint; 404
                          otherwise)
``input``                 ``texts``: one string or a list of strings; token-id
                          lists are refused (400, ``param: input``)
``encoding_format``       ``float`` (numbers) or ``base64`` (float32
                          little-endian bytes); the SDK asks for base64 when
                          the caller names none, and decodes it
``dimensions``            ``dimensions`` (Matryoshka truncation)
(always)                  ``normalize: true``: OpenAI's vectors have length 1,
                          with ``dimensions`` too (cut, then scaled)
``user``                  accepted, not used (the org comes from the key)
========================  ===================================================

The answer is ``{object: "list", data: [{object: "embedding", index,
embedding}], model, usage: {prompt_tokens, total_tokens}}``, the tokens
being those admission counted (what the org's limits were charged).
Errors are ``{error: {message, type, param, code}}``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import msgspec
import numpy as np
from msgspec import Meta

from gateway.call import Call, Failure
from gateway.catalog import Catalog
from gateway.route import Route
from schemas.messages import EmbedInput, Result
from schemas.options import Dimensions

__all__ = ["EmbeddingsRoute", "ModelsRoute"]


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    """The body of ``POST /v1/embeddings``."""

    model: Annotated[str, Meta(min_length=1, max_length=256)]
    #: A string or a list of strings; token ids (integers, lists of them) are refused.
    input: str | Annotated[list[str | int | list[int]], Meta(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None
    #: Not OpenAI's: an org the caller claims to be; refused (403) unless it is the key's.
    org: str | None = None


class Embedding(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    #: Numbers, or with ``encoding_format: base64`` the float32 bytes as base64.
    embedding: list[float] | str


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "serving-fairness"


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorDetail


_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
          404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          503: "server_error", 504: "server_error"}


class _OpenAI(Route):
    api = "openai"
    error_type = ErrorResponse

    def error(self, failure: Failure) -> ErrorResponse:
        kind = _TYPES.get(failure.status, "server_error")
        return ErrorResponse(error=ErrorDetail(message=failure.message, type=kind,
                                               param=failure.param, code=failure.code))


class EmbeddingsRoute(_OpenAI):
    name = "openai_embeddings"
    path = "/v1/embeddings"
    summary = "Embed texts (OpenAI's embeddings API)"
    request_type = EmbeddingsRequest
    response_type = EmbeddingsResponse

    def call(self, body: EmbeddingsRequest, org: str, catalog: Catalog) -> Call | Failure:
        if catalog.kind_of(body.model) != "embed":
            return Failure(404, "model_not_found",
                           f"The model {body.model!r} does not exist or is not an embedding "
                           "model; GET /v1/models lists them", "model")
        given = [body.input] if isinstance(body.input, str) else body.input
        texts = [t for t in given if isinstance(t, str)]
        if len(texts) != len(given):
            return Failure(400, "invalid_input",
                           "input must be a string or a list of strings: token ids are not "
                           "accepted, send the text", "input")
        inp = EmbedInput(texts=tuple(texts), dimensions=body.dimensions, normalize=True,
                         embedding_types=["float"], encoding="base64")
        return Call(body.model, inp, 0, {"base64": body.encoding_format == "base64"})

    def answer(self, result: Result, call: Call, catalog: Catalog) -> EmbeddingsResponse:
        rows = (result.embeddings_packed or {}).get("float", [])
        if call.extra["base64"]:
            data = [Embedding(index=i, embedding=base64.b64encode(r).decode())
                    for i, r in enumerate(rows)]
        else:
            data = [Embedding(index=i, embedding=_floats(r)) for i, r in enumerate(rows)]
        tokens = result.tokens or 0
        return EmbeddingsResponse(data=data, model=call.endpoint,
                                  usage=Usage(prompt_tokens=tokens, total_tokens=tokens))


class ModelsRoute(_OpenAI):
    name = "openai_models"
    method = "GET"
    path = "/v1/models"
    summary = "List the endpoints as models (OpenAI's models API)"
    response_type = ModelList

    def get(self, catalog: Catalog, org: str | None) -> ModelList:
        return ModelList(data=[Model(id=name) for name, _kind in catalog.models()])


def _floats(packed: bytes) -> list[float]:
    floats: list[float] = np.frombuffer(packed, dtype="<f4").tolist()
    return floats

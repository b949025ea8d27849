"""``GET /openapi.json``: the OpenAPI document, generated from the routes' own types.

Each :class:`~gateway.route.Route` names the msgspec types that decode its
body and encode its answers; msgspec writes their JSON Schema
(``msgspec.json.schema_components``), and this module places them under
their paths. Nothing here is written by hand, so the document cannot drift
from what the gateway accepts: a field added to a request type is in the
schema at once.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.call import Failure
from gateway.catalog import Catalog
from gateway.route import Route

__all__ = ["OpenApiRoute", "openapi_document"]

_REF = "#/components/schemas/{name}"
_ERRORS = {
    "400": "The body does not decode, or a field is invalid (the message names it)",
    "401": "No API key, or one this deployment does not know",
    "403": "The body names an org other than the key's",
    "404": "No such model (endpoint) for this route",
    "413": "The body is larger than max_body_bytes",
    "429": "Rate limited, throttled, overloaded, or the org's share of the gateway's waiting "
           "requests taken: retry after Retry-After seconds",
    "500": "The request failed in the pipeline",
    "503": "The gateway is full (max_waiting_requests) or stopping",
    "504": "The deadline (the client's timeout, or max_wait_ms) passed first",
}


def openapi_document(routes: list[Route], version: str = "0.1.0") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``."""
    types: list[Any] = []
    for r in routes:
        for t in (r.request_type, r.response_type, r.error_type):
            if t is not None:
                types.append(t)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    schema_of = dict(zip(map(id, types), schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        op: dict[str, Any] = {"operationId": r.name, "summary": r.summary, "tags": [r.api]}
        if r.request_type is not None:
            op["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": schema_of[id(r.request_type)]}}}
        ok: dict[str, Any] = {"description": "OK"}
        if r.response_type is not None:
            ok["content"] = {"application/json": {"schema": schema_of[id(r.response_type)]}}
        responses: dict[str, Any] = {"200": ok}
        if r.error_type is not None and (r.auth or r.request_type is not None):
            error = {"application/json": {"schema": schema_of[id(r.error_type)]}}
            for code, text in _ERRORS.items():
                if code == "401" and not r.auth:
                    continue
                status = str(r.status(Failure(int(code), "probe", "")))
                responses.setdefault(status, {"description": text, "content": error})
        op["responses"] = responses
        if r.auth:
            op["security"] = [{"bearer": []}]
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Serving Fairness gateway", "version": version,
                 "description": "Embedding and rerank APIs (OpenAI, Cohere v2, "
                                "text-embeddings-inference) in front of a fair pipeline."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


class OpenApiRoute(Route):
    """``GET /openapi.json``, built once from the other routes."""

    name = "openapi"
    method = "GET"
    path = "/openapi.json"
    summary = "This document"
    auth = False

    def __init__(self, routes: list[Route]):
        self.document = openapi_document(routes)

    def get(self, catalog: Catalog, org: str | None) -> dict[str, Any]:
        return self.document

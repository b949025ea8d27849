"""A route: its path, the types that decode and answer it, and its mapping to the pipeline.

Every HTTP route of the gateway is a :class:`Route`. The server
(:mod:`gateway.server`) does what is the same for all of them (the key, the
body's size, decoding with :attr:`Route.request_type`, the wait for the
result, the status of an outcome); a route says only what is its API's own:
how a decoded body becomes a :class:`~gateway.call.Call`, how a result
becomes its answer, and the shape of its errors. :mod:`gateway.openapi`
builds the OpenAPI document from the same attributes, so the schema is the
decoder's, never written by hand.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gateway.call import Call, Failure
from gateway.catalog import Catalog
from schemas.messages import Result

__all__ = ["Route", "cohere_priority"]


class Route:
    """One HTTP route; subclasses set the class attributes and override the hooks."""

    #: ``openai``, ``cohere``, ``tei`` or ``gateway``: the API, and the metric label.
    api: ClassVar[str] = "gateway"
    #: A short name, unique among routes: the metric label and the OpenAPI operationId.
    name: ClassVar[str] = ""
    method: ClassVar[str] = "POST"
    path: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: Whether the route needs ``Authorization: Bearer <key>`` (every API route does).
    auth: ClassVar[bool] = True
    #: The msgspec type the body decodes into; None for a route without a body.
    request_type: ClassVar[Any] = None
    #: The type of a 200 answer.
    response_type: ClassVar[Any] = None
    #: The type of an error answer.
    error_type: ClassVar[Any] = None

    def call(self, body: Any, org: str, catalog: Catalog) -> Call | Failure:
        """The pipeline request for a decoded body of the authenticated ``org``."""
        raise NotImplementedError

    def answer(self, result: Result, call: Call, catalog: Catalog) -> Any:
        """The 200 answer (an instance of :attr:`response_type`) for an ok result."""
        raise NotImplementedError

    def get(self, catalog: Catalog, org: str | None) -> Any:
        """The answer of a route without a body (``GET``)."""
        raise NotImplementedError

    def error(self, failure: Failure) -> Any:
        """The error body (an instance of :attr:`error_type`)."""
        raise NotImplementedError

    def status(self, failure: Failure) -> int:
        """The HTTP status of ``failure`` on this API (most use the failure's own)."""
        return failure.status

    def named_org(self, body: Any) -> str | None:
        """An org the body names itself (the ``org`` extension field), checked against the key's."""
        return getattr(body, "org", None)


def cohere_priority(priority: int | None, cap: int) -> int:
    """Cohere's ``priority`` (0-999, lower first) as the pipeline's (0..cap, higher first).

    Absent: the pipeline's default, 0. Given: 0 is the tier's cap (the most a
    tenant of that tier may ask for), 999 is 0, linearly between; so a
    Cohere priority can never be refused for being above the cap, and it
    orders only the org's own requests (DRR decides between orgs).
    """
    if priority is None:
        return 0
    return round((999 - priority) * cap / 999)

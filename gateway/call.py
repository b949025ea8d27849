"""What every route shares: a call into the pipeline, and an answer that is not ok.

A route decodes its API's body, and from it makes a :class:`Call` (the
endpoint, the pipeline's input and priority) or a :class:`Failure`; the
server submits the call, awaits its one :class:`~schemas.messages.Result`
and hands it back to the route, which answers in its API's shape.
:func:`failure_of` says, once for every API, which HTTP status each
pipeline outcome is.

Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from schemas.messages import EmbedInput, RerankInput, Result

__all__ = ["Call", "Failure", "failure_of", "field_at", "retry_after_s"]


@dataclass(slots=True)
class Call:
    """One request for the pipeline, made from an HTTP body.

    ``extra`` is the route's own: what it needs to answer (the types asked
    for, the texts to echo), opaque to the server.
    """

    endpoint: str
    input: EmbedInput | RerankInput
    priority: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failure:
    """An answer that is not ok: its HTTP status and what it says.

    ``code`` is a stable machine-readable reason (the pipeline's, or the
    gateway's own: ``unauthorized``, ``forbidden``, ``model_not_found``...),
    ``param`` the body field at fault when one is.
    """

    status: int
    code: str
    message: str
    param: str | None = None
    retry_after_ms: int | None = None


#: A pipeline outcome that is not ok, and the HTTP status it is everywhere.
_STATUS = {"rejected": 429, "invalid": 400, "expired": 504, "failed": 500}


def failure_of(result: Result) -> Failure | None:
    """None for an ok result, else the :class:`Failure` it is.

    ``rejected`` (rate limited, throttled, overloaded) is 429 with the
    pipeline's ``retry_after_ms``; ``invalid`` 400, its message naming the
    field; ``expired`` 504 (its deadline, the client's timeout, passed before
    a worker was free); ``failed`` 500.
    """
    if result.status == "ok":
        return None
    status = _STATUS.get(result.status, 500)
    reason = result.reason or result.status
    message = result.message or f"the request was {result.status} ({reason})"
    retry = result.retry_after_ms if result.status == "rejected" else None
    if status == 429 and retry is None:
        retry = 1000
    return Failure(status, reason, message, _param_of(message), retry)


def field_at(message: str) -> str | None:
    """The field a msgspec error names (``... - at `$.input.dimensions``` -> ``input.dimensions``)."""
    at = message.rfind("$.")
    if at < 0:
        return None
    return message[at + 2:].rstrip("`'\". ") or None


def _param_of(message: str) -> str | None:
    """The request option a pipeline result's message names (its ``input.`` dropped)."""
    path = field_at(message)
    return path.removeprefix("input.") or None if path else None


def retry_after_s(ms: int) -> str:
    """``Retry-After``'s whole seconds for ``ms``, never 0 (which some clients read as now)."""
    return str(max(1, math.ceil(ms / 1000)))

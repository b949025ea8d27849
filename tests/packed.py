"""Reading topics that may hold packs (``schemas/packs.py``) in tests: one message per item.

A tier topic holds single admitted requests and packs of them; a reply topic
whose sender asked holds results and packs of them. Tests that count or
order what a topic holds count the messages, never the records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from schemas.codec import codec_for, format_from_headers
from schemas.messages import AdmittedRequest, Result
from schemas.packs import is_pack, unpack_requests, unpack_results

__all__ = ["admitted_in", "messages_in"]


def messages_in(typ: type, value: bytes | None, headers: Any) -> list[Any]:
    """The messages of one record: its one message, or each item of its pack (an item
    that does not decode raises, as a single record that does not decode does)."""
    if not is_pack(headers):
        return [codec_for(typ).decode_record(value, headers)]
    fmt = format_from_headers(headers)
    unpack = unpack_requests if typ is AdmittedRequest else unpack_results
    assert typ in (AdmittedRequest, Result), typ
    items = unpack(value, fmt)
    for item in items:
        if item.error is not None:
            raise item.error
    return [item.value for item in items]


def admitted_in(records: Iterable[Any]) -> list[AdmittedRequest]:
    """Every admitted request of tier ``records``, in record order, packs expanded."""
    return [a for r in records for a in messages_in(AdmittedRequest, r.value, r.headers)]

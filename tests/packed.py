"""Reading topics that may hold packs (``schemas/packs.py``) in tests: one message per item.

A tier topic holds single admitted requests and packs of them; a reply topic
whose sender asked holds results and packs of them. Tests that count or
order what a topic holds count the messages, never the records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from schemas import packs
from schemas.codec import DecodeError
from schemas.messages import AdmittedRequest

__all__ = ["admitted_in", "messages_in"]


def messages_in(typ: type, value: bytes | None, headers: Any) -> list[Any]:
    """The messages of one record: its one message, or each item of its pack
    (:func:`schemas.packs.messages_in`); one that does not decode raises, as a single
    record that does not decode does."""
    out = packs.messages_in(typ, value, headers)
    for m in out:
        if isinstance(m, DecodeError):
            raise m
    return out


def admitted_in(records: Iterable[Any]) -> list[AdmittedRequest]:
    """Every admitted request of tier ``records``, in record order, packs expanded."""
    return [a for r in records for a in messages_in(AdmittedRequest, r.value, r.headers)]

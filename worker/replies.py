"""The records a worker writes for one micro-batch's results: one each, or packed.

A result goes to its request's ``reply_to`` in its ``reply_format``, as one
record keyed by the request id. A sender that reads a reply topic of its
own may ask for its results several to a record (``reply_packed``, which
admission carries only for such a topic): then the results of one
micro-batch for one (reply topic, format) go out as
:class:`~schemas.messages.ResultPack` records (header ``sf-pack: 1``,
:mod:`schemas.packs`), each at most ``max_bytes``, so a reader that reads
records up to ``service.max_message_bytes`` reads every pack. A group
larger than that is split; a result left alone stays a plain record (one is
not worth a pack), as does one too large for any pack. Results of requests
that did not ask keep one record each, exactly as before packs.

Each :class:`Reply` names the results it carries (``members``): the
broker's answer for its record is the answer for each of them, which is
what the service counts, logs and commits by.

Pure: served results in, record values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.codec import Format, codec_for, content_type
from schemas.messages import Result
from schemas.packs import PACK_HEADER, encode_packed, split
from worker.execute import Served

__all__ = ["Reply", "replies"]

_result_codec = codec_for(Result)
Headers = list[tuple[str, bytes]]
_CONTENT_TYPE: dict[Format, Headers] = {
    fmt: [("content-type", content_type(fmt).encode())] for fmt in ("json", "msgpack")}
_PACK_HEADERS: dict[Format, Headers] = {fmt: [*h, PACK_HEADER] for fmt, h in _CONTENT_TYPE.items()}


@dataclass(slots=True)
class Reply:
    """One record to write, and the results it carries (in order)."""

    topic: str
    value: bytes
    key: bytes | None
    headers: Headers
    members: list[Served]

    @property
    def packed(self) -> bool:
        return len(self.members) > 1


def replies(done: Sequence[Served], max_bytes: int) -> list[Reply]:
    """The records for ``done`` (one micro-batch): plain ones in order, then the packs.

    Every result of ``done`` is in exactly one :class:`Reply`.
    """
    out: list[Reply] = []
    groups: dict[tuple[str, Format], list[tuple[Served, bytes]]] = {}
    for s in done:
        fmt: Format = s.request.reply_format
        value = _result_codec.encode(s.result, fmt)
        if s.request.reply_packed:
            groups.setdefault((s.request.reply_to, fmt), []).append((s, value))
        else:
            out.append(_plain(s, value, fmt))
    for (topic, fmt), group in groups.items():
        for cut in split([len(v) for _, v in group], max_bytes):
            part = group[cut.start:cut.stop]
            if len(part) == 1:
                out.append(_plain(part[0][0], part[0][1], fmt))
            else:
                out.append(_pack(topic, fmt, part))
    return out


def _plain(s: Served, value: bytes, fmt: Format) -> Reply:
    return Reply(s.request.reply_to, value, s.result.id.encode(), _CONTENT_TYPE[fmt], [s])


def _pack(topic: str, fmt: Format, part: list[tuple[Served, bytes]]) -> Reply:
    # The items' bytes copied in as they are, in either format.
    value = encode_packed([v for _, v in part], field="results", fmt=fmt)
    # No key: a pack answers several requests, and a key is read as one request's id.
    return Reply(topic, value, None, _PACK_HEADERS[fmt], [s for s, _ in part])

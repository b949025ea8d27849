"""Packs: several messages in one Kafka record, each read on its own.

A record of ``requests.<tier>`` (or of a reply topic) holds either one
message, as it always did, or a pack of them: a record with the header
``sf-pack: 1`` beside its ``content-type``, whose value is an
:class:`~schemas.messages.AdmittedPack` (``{"requests": [...]}``) or a
:class:`~schemas.messages.ResultPack` (``{"results": [...]}``). The header
names the form, so a reader tells them apart without parsing and reads
both during a rolling upgrade; a version it does not know is an error,
never a guess.

Reading a pack never loses its good items for a bad one: the outer shape
is decoded with each item left as raw bytes, then each item on its own.
One item that fails validation is one :class:`DecodeError` (with its own
bytes, for its dead letter) among the items that decoded.

Pure: bytes and headers in, messages out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import msgspec

from schemas.codec import Codec, DecodeError, Format, codec_for, format_from_headers
from schemas.messages import AdmittedPack, AdmittedRequest, Result, ResultPack
from schemas.names import LoosePack, names_ok

__all__ = [
    "PACK_HEADER",
    "Item",
    "encode_packed",
    "encode_requests",
    "encode_results",
    "is_pack",
    "messages_in",
    "pack_frame_bytes",
    "split",
    "unpack_requests",
    "unpack_results",
]

#: The header that marks a pack, and the one version this code writes and reads.
PACK_KEY = "sf-pack"
PACK_VERSION = b"1"
PACK_HEADER = (PACK_KEY, PACK_VERSION)

T = TypeVar("T")


class _RawRequests(msgspec.Struct):
    requests: list[msgspec.Raw]


class _RawResults(msgspec.Struct):
    results: list[msgspec.Raw]


_outer: dict[tuple[type, str], msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any]] = {
    (_RawRequests, "json"): msgspec.json.Decoder(_RawRequests),
    (_RawRequests, "msgpack"): msgspec.msgpack.Decoder(_RawRequests),
    (_RawResults, "json"): msgspec.json.Decoder(_RawResults),
    (_RawResults, "msgpack"): msgspec.msgpack.Decoder(_RawResults),
}
_typed: dict[tuple[type, str], msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any]] = {
    (_RawRequests, "msgpack"): msgspec.msgpack.Decoder(LoosePack),
    (_RawResults, "msgpack"): msgspec.msgpack.Decoder(ResultPack),
    (_RawRequests, "json"): msgspec.json.Decoder(LoosePack),
    (_RawResults, "json"): msgspec.json.Decoder(ResultPack),
}
#: What the whole-pack decode must still check of its values (requests: their names).
_after: dict[type, Any] = {_RawRequests: names_ok, _RawResults: lambda values: True}
#: A pack's bytes around its items (see :func:`pack_frame_bytes`), rounded up.
_FRAME = 16
_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()


class Item(msgspec.Struct, Generic[T]):
    """One item of a pack: the message, or why it could not be read and its own bytes
    (``raw``, for its dead letter; empty when the whole pack decoded at once)."""

    raw: bytes
    value: T | None = None
    error: DecodeError | None = None


def is_pack(headers: Sequence[tuple[str, bytes]] | None) -> bool:
    """True when ``headers`` mark a pack of the version this code reads.

    A pack of another version raises :class:`DecodeError` (``unsupported_pack``):
    read as one message it would fail with a misleading error.
    """
    for key, value in headers or ():
        if key == PACK_KEY:
            if value == PACK_VERSION:
                return True
            raise DecodeError("unsupported_pack",
                              f"pack version {value!r} is not supported (this reader knows "
                              f"{PACK_VERSION!r}): upgrade the reader first")
    return False


def encode_requests(requests: list[AdmittedRequest], fmt: Format = "msgpack") -> bytes:
    """One :class:`AdmittedPack` record value; at least one request."""
    pack = AdmittedPack(requests=requests)
    return _json.encode(pack) if fmt == "json" else _msgpack.encode(pack)


def encode_results(results: list[Result], fmt: Format = "msgpack") -> bytes:
    """One :class:`ResultPack` record value; at least one result."""
    pack = ResultPack(results=results)
    return _json.encode(pack) if fmt == "json" else _msgpack.encode(pack)


def encode_packed(values: list[bytes], field: str = "requests",
                  fmt: Format = "msgpack") -> bytes:
    """A pack's value from its items already encoded in ``fmt`` (each one message):
    the bytes are copied in, not encoded again."""
    if fmt == "json":
        return b'{"%s":[%s]}' % (field.encode(), b",".join(values))
    raws = [msgspec.Raw(v) for v in values]
    return _msgpack.encode(_RawRequests(raws) if field == "requests" else _RawResults(raws))


def pack_frame_bytes(items: int) -> int:
    """The most a pack of ``items`` adds to its items' own bytes: its map, key and array
    header (msgpack, at most 15 bytes; JSON ``{"requests":[`` and ``]}``, 15), and a
    comma between items in JSON."""
    return _FRAME + items


def split(sizes: Sequence[int], max_bytes: int, max_items: int | None = None) -> list[range]:
    """Consecutive items, by their encoded ``sizes``, cut in order so that each part's
    pack (its items and its frame) is at most ``max_bytes``, and holds ``max_items`` at
    most; an item too large for any pack is a part alone. Every item is in exactly one
    part."""
    parts: list[range] = []
    start = size = 0
    most = len(sizes) if max_items is None else max(1, max_items)
    for i, n in enumerate(sizes):
        if i > start and (i - start >= most
                          or size + n + pack_frame_bytes(i - start + 1) > max_bytes):
            parts.append(range(start, i))
            start, size = i, 0
        size += n
    if sizes:
        parts.append(range(start, len(sizes)))
    return parts


def _unpack(data: bytes | None, fmt: Format, outer: type, field: str, codec: Codec[T],
            max_bytes: int | None) -> list[Item[T]]:
    if data is None:
        raise DecodeError("empty", "record has no value")
    if max_bytes is not None and len(data) > max_bytes:
        raise DecodeError("too_large", f"pack is {len(data)} bytes, the limit is {max_bytes}")
    # The common case first: the whole pack in one typed decode (about half the
    # cost of an item at a time), requests' names checked after it
    # (schemas.names). Items keep no bytes then: none is rejected.
    typed = _typed.get((outer, fmt))
    if typed is not None:
        try:
            values = getattr(typed.decode(data), field)
            if _after[outer](values):
                return [Item(b"", v) for v in values]
        except (msgspec.DecodeError, RecursionError, MemoryError, UnicodeDecodeError,
                ValueError):
            pass
        # Read item by item below, strictly: the good told from the bad, each
        # bad one with the error the strict decoder gives.
    try:
        raws: list[msgspec.Raw] = getattr(_outer[outer, fmt].decode(data), field)
    except msgspec.ValidationError as e:
        raise DecodeError("invalid", f"pack: {e}") from None
    except (msgspec.DecodeError, RecursionError, MemoryError, UnicodeDecodeError,
            ValueError) as e:
        raise DecodeError("malformed", f"pack: not valid {fmt}: {e}") from None
    if not raws:
        raise DecodeError("invalid", f"pack: Expected `array` of length >= 1 - at `$.{field}`")
    items: list[Item[T]] = []
    for i, raw in enumerate(raws):
        one = bytes(raw)
        try:
            items.append(Item(one, codec.decode(one, fmt)))
        except DecodeError as e:
            items.append(Item(one, error=DecodeError(e.reason, f"{field}[{i}]: {e}")))
    return items


_FIELDS: dict[type, tuple[type, str]] = {
    AdmittedRequest: (_RawRequests, "requests"),
    Result: (_RawResults, "results"),
}


def messages_in(typ: type[T], value: bytes | None, headers: Sequence[tuple[str, bytes]] | None,
                *, max_bytes: int | None = None) -> list[T | DecodeError]:
    """The ``typ`` messages (``AdmittedRequest`` or ``Result``) one record carries, in
    order: its one message, or each item of its pack; one that does not decode (or a
    pack that cannot be read at all) as its :class:`DecodeError`, in its place. Never
    raises one: a reader goes on past it."""
    try:
        fmt = format_from_headers(headers)
        if not is_pack(headers):
            return [codec_for(typ).decode(value, fmt, max_bytes=max_bytes)]
        outer, field = _FIELDS[typ]
        items = _unpack(value, fmt, outer, field, codec_for(typ), max_bytes)
    except DecodeError as e:
        return [e]
    out: list[T | DecodeError] = []
    for item in items:
        if item.error is not None:
            out.append(item.error)
        else:
            assert item.value is not None, "an item holds its message or its error"
            out.append(item.value)
    return out


def unpack_requests(data: bytes | None, fmt: Format = "msgpack", *,
                    max_bytes: int | None = None) -> list[Item[AdmittedRequest]]:
    """The items of an :class:`AdmittedPack`, each decoded on its own.

    Raises :class:`DecodeError` only when the pack itself cannot be read
    (then no item can be told apart from another).
    """
    return _unpack(data, fmt, _RawRequests, "requests", codec_for(AdmittedRequest), max_bytes)


def unpack_results(data: bytes | None, fmt: Format = "msgpack", *,
                   max_bytes: int | None = None) -> list[Item[Result]]:
    """The items of a :class:`ResultPack`, each decoded on its own."""
    return _unpack(data, fmt, _RawResults, "results", codec_for(Result), max_bytes)

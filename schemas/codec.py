"""Encoding and decoding, built once per message type.

JSON at the edges, so any Kafka client can talk to the pipeline; msgpack
inside, where both ends are ours. The encoding of a record is named by its
``content-type`` header (``application/json`` or ``application/msgpack``); a
record without one is JSON, the documented default.

Decoding never raises anything but :class:`DecodeError`, whose message names
the field at fault (msgspec reports a path such as ``$.input.texts[3]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Literal, TypeVar

import msgspec

from schemas.messages import (
    AdmittedRequest,
    Batch,
    DeadLetter,
    LeaderClaim,
    Request,
    Result,
    SchedulerState,
    WorkerEvent,
)

__all__ = [
    "CONTENT_TYPE_HEADER",
    "JSON",
    "MSGPACK",
    "Codec",
    "DecodeError",
    "Format",
    "codec_for",
    "content_type",
    "format_from_headers",
]

Format = Literal["json", "msgpack"]
CONTENT_TYPE_HEADER = "content-type"
JSON = "application/json"
MSGPACK = "application/msgpack"
_FORMATS: dict[str, Format] = {
    JSON: "json",
    "json": "json",
    MSGPACK: "msgpack",
    "application/x-msgpack": "msgpack",
    "msgpack": "msgpack",
}

T = TypeVar("T")


class DecodeError(ValueError):
    """A record could not be decoded into its message type.

    ``reason`` is a stable code for dead letters and metrics; the message
    says what is wrong and where.
    """

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


def content_type(fmt: Format) -> str:
    return JSON if fmt == "json" else MSGPACK


#: The headers our own services write, answered without parsing (every record has one).
_KNOWN_HEADERS: dict[tuple[object, ...], Format] = {
    (CONTENT_TYPE_HEADER, JSON.encode()): "json",
    (CONTENT_TYPE_HEADER, MSGPACK.encode()): "msgpack",
}


def format_from_headers(headers: Sequence[tuple[str, bytes]] | None) -> Format:
    """The encoding a record's headers announce; JSON when none is given."""
    if headers and len(headers) == 1:
        known = _KNOWN_HEADERS.get(tuple(headers[0]))
        if known is not None:
            return known
    for key, value in headers or ():
        if key.lower() == CONTENT_TYPE_HEADER:
            try:
                name = (value or b"").decode("ascii").split(";")[0].strip().lower()
            except UnicodeDecodeError:
                raise DecodeError("bad_content_type", "content-type header is not ASCII") from None
            fmt = _FORMATS.get(name)
            if fmt is None:
                raise DecodeError(
                    "bad_content_type",
                    f"unsupported content-type {name!r} (use {JSON} or {MSGPACK})",
                )
            return fmt
    return "json"


class Codec(Generic[T]):
    """JSON and msgpack encoders and typed decoders for one message type."""

    def __init__(self, typ: type[T]):
        self.type = typ
        self._json_dec = msgspec.json.Decoder(typ)
        self._mp_dec = msgspec.msgpack.Decoder(typ)
        self._json_enc = msgspec.json.Encoder()
        self._mp_enc = msgspec.msgpack.Encoder()

    def encode(self, msg: T, fmt: Format = "msgpack") -> bytes:
        return self._json_enc.encode(msg) if fmt == "json" else self._mp_enc.encode(msg)

    def decode(self, data: bytes | None, fmt: Format = "msgpack", *, max_bytes: int | None = None) -> T:
        """Decode ``data``; any failure becomes a :class:`DecodeError` naming the cause."""
        if data is None:
            raise DecodeError("empty", "record has no value")
        if max_bytes is not None and len(data) > max_bytes:
            raise DecodeError(
                "too_large", f"message is {len(data)} bytes, the limit is {max_bytes}"
            )
        try:
            return (self._json_dec if fmt == "json" else self._mp_dec).decode(data)
        except msgspec.ValidationError as e:
            raise DecodeError("invalid", f"{self.type.__name__}: {e}") from None
        except msgspec.DecodeError as e:
            raise DecodeError("malformed", f"not valid {fmt}: {e}") from None
        except (RecursionError, MemoryError, UnicodeDecodeError, ValueError) as e:
            raise DecodeError("malformed", f"not valid {fmt}: {type(e).__name__}: {e}") from None

    def decode_record(self, data: bytes | None, headers: Sequence[tuple[str, bytes]] | None = None,
                      *, max_bytes: int | None = None) -> T:
        """Decode a Kafka record's value in the encoding its headers name."""
        return self.decode(data, format_from_headers(headers), max_bytes=max_bytes)


_CODECS: dict[type, Codec[Any]] = {
    t: Codec(t)
    for t in (Request, AdmittedRequest, Batch, Result, WorkerEvent, SchedulerState, DeadLetter,
              LeaderClaim)
}


def codec_for(typ: type[T]) -> Codec[T]:
    """The shared codec of a message type (built once at import)."""
    return _CODECS[typ]

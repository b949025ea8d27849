"""Embeddings in a result: as numbers, or packed as little-endian bytes.

A 384-value float vector as JSON numbers is ~8 KB of text; the same vector
packed is 1,536 bytes, which JSON carries as 2,048 characters of base64
and msgpack as a 1,539-byte binary. The worker packs (:func:`result_fields`),
the client unpacks (:func:`decode_embeddings`); ``bench/result_size.py``
measures what each costs end to end.

Where each type goes in a :class:`~schemas.messages.Result`:

===========  ===================================  ==============================
encoding     ``float`` vectors                    the other types
===========  ===================================  ==============================
``float``    ``embeddings`` (numbers)             ``embeddings_by_type[type]``
                                                  (integers)
``base64``   ``embeddings_packed["float"]``       ``embeddings_packed[type]``
===========  ===================================  ==============================

A packed vector is the row's bytes: float32 little-endian for ``float``,
one signed byte per value for ``int8``, one unsigned byte for ``uint8``,
and for ``binary``/``ubinary`` the bits packed eight to a byte (numpy's
``packbits``, first value in the high bit), as a signed (``binary``: the
unsigned byte minus 128) or unsigned byte. ``dimensions`` says how many
values a vector has, so a binary vector's padding bits can be told apart.

Any client can unpack these: in Python,
``numpy.frombuffer(base64.b64decode(s), "<f4")`` for a float vector.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["DTYPES", "decode_embeddings", "result_fields"]

#: The numpy dtype of each embedding type's values (little-endian).
DTYPES: dict[str, str] = {
    "float": "<f4",
    "int8": "i1",
    "uint8": "u1",
    "binary": "i1",
    "ubinary": "u1",
}


def result_fields(arrays: Mapping[str, np.ndarray], encoding: str) -> dict[str, Any]:
    """The Result fields that carry ``arrays`` (type -> (n, width) array) in ``encoding``."""
    if encoding == "base64":
        return {"embeddings_packed": {
            t: [row.tobytes() for row in np.ascontiguousarray(a, dtype=DTYPES[t])]
            for t, a in arrays.items()}}
    fields: dict[str, Any] = {}
    if "float" in arrays:
        fields["embeddings"] = np.asarray(arrays["float"], dtype=np.float32).tolist()
    ints = {t: np.asarray(a).astype(np.int64).tolist() for t, a in arrays.items() if t != "float"}
    if ints:
        fields["embeddings_by_type"] = ints
    return fields


def decode_embeddings(result: Any) -> dict[str, np.ndarray]:
    """Every embedding type a result carries, as numpy arrays of shape (n, width).

    ``float`` is float32 of width ``dimensions``; ``int8``/``uint8`` are int8
    and uint8 of the same width; ``binary``/``ubinary`` are int8/uint8 of
    width ``ceil(dimensions / 8)``. Numbers and packed bytes decode to the
    same arrays. A result with no embeddings gives ``{}``.
    """
    out: dict[str, np.ndarray] = {}
    if result.embeddings is not None:
        out["float"] = _matrix(np.asarray(result.embeddings, dtype=np.float32))
    for t, rows in (result.embeddings_by_type or {}).items():
        out[t] = _matrix(np.asarray(rows, dtype=np.int64).astype(DTYPES[t]))
    for t, rows in (result.embeddings_packed or {}).items():
        if t not in DTYPES:
            raise ValueError(f"unknown embedding type {t!r} in embeddings_packed")
        dtype = np.dtype(DTYPES[t])
        for i, raw in enumerate(rows):
            if len(raw) % dtype.itemsize:
                raise ValueError(f"embeddings_packed[{t!r}][{i}] has {len(raw)} bytes, "
                                 f"not a multiple of {dtype.itemsize}")
        vectors = [np.frombuffer(raw, dtype=dtype) for raw in rows]
        widths = {v.shape[0] for v in vectors}
        if len(widths) > 1:
            raise ValueError(f"embeddings_packed[{t!r}] vectors differ in length: {sorted(widths)}")
        out[t] = np.vstack(vectors) if vectors else np.zeros((0, 0), dtype=dtype)
    return out


def _matrix(a: np.ndarray) -> np.ndarray:
    return a.reshape(len(a), -1) if a.ndim != 2 else a

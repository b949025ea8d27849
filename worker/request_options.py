"""What a request's options mean to the worker: model-call options in, result fields out.

:mod:`worker.execute` runs the model; this module says, for one admitted
embed input, how the model is called (:func:`encode_options`: the
requests of a micro-batch that share these share a model call), whether
it needs int8/uint8 calibration (:func:`calibration_options`), and which
result fields its float vectors become (:func:`embedding_fields`:
quantised per :mod:`worker.quantize`, packed per :mod:`schemas.vectors`).
Pure apart from numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from schemas.messages import EmbedInput, RerankInput
from schemas.options import truncate_of
from schemas.vectors import result_fields
from worker.interface import DEFAULT_OPTIONS, EncodeOptions, TruncateSide
from worker.quantize import needs_ranges, quantize

__all__ = [
    "calibration_options",
    "embedding_fields",
    "embedding_types",
    "encode_options",
    "refuses_truncation",
    "truncate_side",
]


def refuses_truncation(inp: EmbedInput | RerankInput) -> bool:
    """``truncate = "none"``: an input the model would cut is refused, not cut."""
    return truncate_of(inp.truncate) == "none"


def truncate_side(inp: EmbedInput | RerankInput) -> TruncateSide:
    """The end the model cuts (``none`` never reaches a model: it is checked first)."""
    return "start" if truncate_of(inp.truncate) == "start" else "end"


def encode_options(inp: EmbedInput) -> EncodeOptions:
    """How the model embeds ``inp``'s texts."""
    if inp.prompt is None and inp.normalize is None and inp.dimensions is None \
            and inp.truncate == "end":
        return DEFAULT_OPTIONS  # most requests: no per-request object
    return EncodeOptions(prompt=inp.prompt, truncate=truncate_side(inp),
                         normalize=inp.normalize, dimensions=inp.dimensions)


def embedding_types(inp: EmbedInput) -> list[str]:
    """The types the result carries, in the order asked (default: float)."""
    if not inp.embedding_types:
        return ["float"]
    return list(dict.fromkeys(inp.embedding_types))


def calibration_options(inp: EmbedInput) -> EncodeOptions | None:
    """The options the calibration set is embedded with, when ``inp`` needs int8/uint8.

    Everything that moves the ranges (prompt, normalisation, dimensions),
    and not the truncation side: the calibration texts are short.
    """
    if not inp.embedding_types:
        return None
    if not any(needs_ranges(t) for t in embedding_types(inp)):
        return None
    return EncodeOptions(prompt=inp.prompt, normalize=inp.normalize, dimensions=inp.dimensions)


def embedding_fields(vectors: np.ndarray, inp: EmbedInput,
                     ranges: Callable[[], np.ndarray] | None = None) -> dict[str, Any]:
    """The Result fields for ``inp``'s float vectors (n, dim): every type asked, encoded.

    ``ranges()`` gives the int8/uint8 calibration ranges; called only when needed.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        vectors = vectors.reshape(len(vectors), -1)
    if not inp.embedding_types and inp.encoding == "float":
        # Most requests: float vectors as numbers, what the general path
        # below makes, without its per-type tables.
        return {"embeddings": vectors.tolist(), "dimensions": int(vectors.shape[1])}
    arrays = {}
    for t in embedding_types(inp):
        arrays[t] = quantize(vectors, t, ranges() if needs_ranges(t) and ranges else None)
    fields = result_fields(arrays, inp.encoding)
    fields["dimensions"] = int(vectors.shape[1])
    return fields

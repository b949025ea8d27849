"""Embedding types: float vectors to int8, uint8, binary and ubinary.

The semantics are those of sentence-transformers' ``quantize_embeddings``
(``sentence_transformers.util.quantization``, version 6.2), written again in
numpy so the fake models and the admission side need no torch; a test
checks that both give the same bytes.

``int8`` / ``uint8``
    Scalar quantisation per dimension: with ``ranges`` = (min, max) of each
    dimension, ``step = (max - min) / 255`` (1 where max = min), a value
    ``x`` becomes ``clip(floor((x - min) / step), 0, 255)``, minus 128 for
    ``int8``. Values outside the range are clipped to its ends.
``binary`` / ``ubinary``
    One bit per value, set when the value is > 0, packed eight to a byte
    (``numpy.packbits``, first value in the high bit); ``ubinary`` keeps the
    unsigned byte, ``binary`` subtracts 128 (a signed byte).

Calibration
-----------

``int8``/``uint8`` need ranges. ``SentenceTransformer.encode(precision=...)``
takes them from the embeddings of the same call, so a vector's bytes would
depend on the other texts it was sent with, and a request of one text would
have no range at all (sentence-transformers refuses that). A service needs
ranges fixed per endpoint, so the worker takes them from a **calibration
set** (:data:`worker.calibration.CALIBRATION_TEXTS`): the per-dimension min
and max of the calibration texts' embeddings, computed with the same
prompt, ``normalize`` and ``dimensions`` as the request (they move the
ranges), i.e. ``quantize_embeddings(vectors, precision,
calibration_embeddings=encode(CALIBRATION_TEXTS, same options))``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["QUANTIZED_TYPES", "needs_ranges", "quantize", "ranges_of"]

#: Types that need calibration ranges.
QUANTIZED_TYPES = ("int8", "uint8")


def needs_ranges(embedding_type: str) -> bool:
    return embedding_type in QUANTIZED_TYPES


def ranges_of(calibration: np.ndarray) -> np.ndarray:
    """(2, dim) array of each dimension's min and max over the calibration embeddings."""
    calibration = np.asarray(calibration)
    if calibration.ndim != 2 or calibration.shape[0] < 1:
        raise ValueError(f"calibration embeddings must be (n >= 1, dim), got {calibration.shape}")
    return np.vstack((np.min(calibration, axis=0), np.max(calibration, axis=0)))


def quantize(embeddings: np.ndarray, embedding_type: str,
             ranges: np.ndarray | None = None) -> np.ndarray:
    """``embeddings`` (n, dim) float as ``embedding_type`` (see the module docstring)."""
    embeddings = np.asarray(embeddings)
    if embedding_type == "float":
        return embeddings.astype(np.float32)
    if embedding_type in QUANTIZED_TYPES:
        if ranges is None:
            raise ValueError(f"{embedding_type} needs calibration ranges")
        ranges = np.asarray(ranges).astype(np.float32, copy=False)
        if ranges.shape != (2, embeddings.shape[-1]):
            raise ValueError(f"ranges of shape {ranges.shape} do not fit vectors of "
                             f"{embeddings.shape[-1]} values")
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        values = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        quantized: np.ndarray = (values.astype(np.uint8) if embedding_type == "uint8"
                                 else (values - 128).astype(np.int8))
        return quantized
    if embedding_type == "binary":
        return (np.packbits(embeddings > 0, axis=-1) - 128).astype(np.int8)
    if embedding_type == "ubinary":
        return np.packbits(embeddings > 0, axis=-1)
    raise ValueError(f"unknown embedding type {embedding_type!r}")

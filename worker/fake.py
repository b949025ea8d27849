"""Fake models: deterministic, torch-free stand-ins for tests and simulations.

Importing torch and sentence-transformers takes ~9 s on the CI machine; the
scheduler, admission and worker-service tests need a model that answers in
microseconds yet behaves like one where it matters:

- tokens are whitespace-separated words (no special tokens), truncated at
  ``max_seq_length``, and a longer text is reported as truncated;
- a text's vector is the normalized sum of per-word vectors drawn from a hash
  of the lower-cased word, so the same text always gives the same vector on
  any machine, and documents sharing words with a query score higher with
  :class:`FakeReranker`;
- the options behave as on a real model whose last module normalizes: a
  prompt is put before the text, ``truncate="start"`` keeps the last words,
  ``normalize=False`` returns the raw sum, ``dimensions`` keeps the first
  values (normalized again with ``normalize=True``);
- service time is simulated as ``ms_per_batch + ms_per_token * padded tokens``
  (batch size times its longest text), the shape of a real encoder's cost, so
  length-sorted micro-batching pays off with the fake as it does on a GPU.
  The vectors are made first and the call sleeps what is left of that
  time, so a call lasts its service time, not that plus the fake's own
  numpy work (about 0.5 ms a call of 8 texts of 45 words on this machine,
  which read as a slower model in every benchmark before 2026-12-07).
  ``sleep`` (and ``clock``, which times that work) is injectable: pass a
  fake clock's advance to keep tests instant.

A fake at zero service time says it is ``instant``: the worker then calls it on
the event loop rather than in a thread.

Spec strings: ``"fake"`` or ``"fake:dim=32,ms_per_token=0.05"`` (keys: ``dim``,
``max_seq_length``, ``ms_per_token``, ``ms_per_batch``).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from tokens.specs import (
    FAKE_DIM,
    FAKE_MAX_SEQ_LENGTH,
    FAKE_SPEC,
    is_fake_spec,
    parse_fake_spec,
    whitespace_token_count,
)
from worker.interface import (
    DEFAULT_OPTIONS,
    CosineReranker,
    Embedder,
    EncodeOptions,
    EncodeOutput,
    flag_truncated,
)

__all__ = [
    "FAKE_DIM",
    "FAKE_MAX_SEQ_LENGTH",
    "FAKE_SPEC",
    "FakeEmbedder",
    "FakeReranker",
    "cut_words",
    "is_fake_spec",
    "parse_fake_spec",
    "whitespace_token_count",
]

#: Words the fake's table holds before it starts afresh.
_TABLE_WORDS = 1 << 16

_WORD = re.compile(r"\S+")


def cut_words(text: str, max_tokens: int) -> str:
    """``text`` up to the end of its ``max_tokens``-th word (the fake models' tokens)."""
    for n, match in enumerate(_WORD.finditer(text), start=1):
        if n == max_tokens:
            return text[: match.end()]
    return text


@lru_cache(maxsize=1 << 16)
def _word_vector(word: str, dim: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
    vector = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    vector.flags.writeable = False
    return vector


class FakeEmbedder(Embedder):
    """Bag-of-hashed-words embeddings with a simulated service time."""

    def __init__(
        self,
        *,
        dim: int = FAKE_DIM,
        max_seq_length: int = FAKE_MAX_SEQ_LENGTH,
        ms_per_token: float = 0.0,
        ms_per_batch: float = 0.0,
        name: str = FAKE_SPEC,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if dim < 1 or max_seq_length < 1:
            raise ValueError("dim and max_seq_length must be >= 1")
        if ms_per_token < 0 or ms_per_batch < 0:
            raise ValueError("ms_per_token and ms_per_batch must be >= 0")
        self.name = name
        self.dimension = dim
        self._max_seq_length = max_seq_length
        self.ms_per_token = ms_per_token
        self.ms_per_batch = ms_per_batch
        self._sleep = sleep
        #: Times the vectors' work, which the sleep leaves out of the service
        #: time: by default the real clock with the real sleep, none with a fake one.
        self._clock: Callable[[], float] = clock or (
            time.perf_counter if sleep is time.sleep else lambda: 0.0)
        #: word -> its row of ``_table`` (see :meth:`_vectors`).
        self._index: dict[str, int] = {}
        self._table = np.zeros((0, dim), dtype=np.float32)
        # Total service time simulated so far: what a benchmark would have waited.
        self.simulated_seconds = 0.0

    @property
    def max_seq_length(self) -> int:
        return self._max_seq_length

    @property
    def instant(self) -> bool:
        """True at zero service time: nothing to wait for, so no thread to wait in."""
        return self.ms_per_token == 0 and self.ms_per_batch == 0

    def token_lengths(self, texts: Sequence[str], *, prompt: str | None = None) -> list[int]:
        head = prompt or ""
        return [whitespace_token_count(head + text) for text in texts]

    def cut_texts(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        return [cut_words(text, max_tokens) for text in texts]

    def service_seconds(self, lengths: Sequence[int]) -> float:
        """Simulated time of one call on texts of these token lengths."""
        if not lengths:
            return 0.0
        longest = min(max(lengths), self._max_seq_length)
        return (self.ms_per_batch + self.ms_per_token * len(lengths) * longest) / 1000.0

    def encode(self, texts: Sequence[str], *, lengths: Sequence[int] | None = None,
               options: EncodeOptions = DEFAULT_OPTIONS) -> EncodeOutput:
        if lengths is None:
            # No prompt, no keyword: a subclass written before options existed still works.
            lengths = self.token_lengths(texts) if options.prompt is None \
                else self.token_lengths(texts, prompt=options.prompt)
        t0 = self._clock()
        out = EncodeOutput(self._vectors(texts, options),
                           flag_truncated(lengths, self._max_seq_length))
        delay = self.service_seconds(lengths)
        if delay > 0:
            self.simulated_seconds += delay
            # The call lasts its service time, the vectors' own work within it.
            self._sleep(max(0.0, delay - (self._clock() - t0)))
        return out

    def _vectors(self, texts: Sequence[str], options: EncodeOptions = DEFAULT_OPTIONS
                 ) -> np.ndarray:
        """Every text's vector: one gather and one sum per text, in numpy.

        A benchmark's "model at zero time" must cost next to nothing: word by
        word in Python this was most of a zero-time worker's CPU. Word vectors
        are rows of a table that grows with the words seen (bounded by the
        word cache), looked up by index. The options as the module docstring
        says: prompt first, the last words kept with ``truncate="start"``,
        normalized unless ``normalize=False``, then cut to ``dimensions`` (and
        normalized again with ``normalize=True``).
        """
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        head, cap = options.prompt or "", self._max_seq_length
        split = [(head + text).lower().split() for text in texts]
        split = [w[-cap:] if options.truncate == "start" else w[:cap] for w in split]
        if len(self._index) + sum(map(len, split)) > _TABLE_WORDS:
            self._index.clear()  # start afresh before this call's words, never during
        index = self._index
        rows = [row for row, words in enumerate(split) if words]
        starts = list(itertools.accumulate((len(split[r]) for r in rows[:-1]), initial=0))
        flat = [w for r in rows for w in split[r]]
        try:
            ids = [index[w] for w in flat]
        except KeyError:  # words not seen yet: learn them, in order
            ids = [index[w] if w in index else self._learn(w) for w in flat]
        if ids:
            sums = np.add.reduceat(self._table[ids], starts, axis=0)
            vectors[rows] = sums if options.normalize is False else _unit_rows(sums)
        if options.dimensions is not None:
            vectors = vectors[:, : options.dimensions]
            if options.normalize:
                vectors = _unit_rows(vectors)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _learn(self, word: str) -> int:
        """A row of the word table for ``word``."""
        i = len(self._index)
        if i >= len(self._table):
            grown = np.zeros((max(2 * len(self._table), 256, i + 1), self.dimension),
                             dtype=np.float32)
            if i:
                grown[:i] = self._table[:i]
            self._table = grown
        self._table[i] = _word_vector(word, self.dimension)
        self._index[word] = i
        return i


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


class FakeReranker(CosineReranker):
    """Cosine reranker over a :class:`FakeEmbedder`: shared words score higher.

    Keyword options are those of :class:`FakeEmbedder` (``dim``, ``ms_per_token``...).
    """

    embedder: FakeEmbedder

    def __init__(self, *, name: str = FAKE_SPEC, **options: Any) -> None:
        super().__init__(FakeEmbedder(name=name, **options), name=name)

    @property
    def instant(self) -> bool:
        return self.embedder.instant

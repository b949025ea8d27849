"""The model interface the worker service programs against.

The worker service receives a batch chosen by the fairness scheduler, counts
its tokens, cuts it into micro-batches (:mod:`worker.microbatch`) and publishes
each micro-batch's results as soon as the model returns them. It needs only
what is declared here, so the same service runs on SentenceTransformer models
(:mod:`worker.models`) and on the torch-free fakes (:mod:`worker.fake`) used by
pipeline tests and the simulator.

Typical use::

    lengths = embedder.token_lengths(texts)
    groups = plan_microbatches(lengths, max_padded_tokens=4096, max_size=64,
                               max_seq_length=embedder.max_seq_length)
    for indices, out in embedder.encode_groups(texts, groups, lengths=lengths):
        publish(indices, out.vectors, out.truncated)

Token lengths include the model's special tokens and are NOT truncated, so a
text longer than ``max_seq_length`` is reported as truncated instead of being
silently cut. Passing the lengths back (``lengths=``) saves a second
tokenization.

This module imports numpy and the standard library only: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "CosineReranker",
    "Embedder",
    "EncodeOutput",
    "RerankMethod",
    "RerankOutput",
    "Reranker",
    "flag_truncated",
]

RerankMethod = Literal["cross-encoder", "cosine"]


@dataclass(frozen=True, slots=True)
class EncodeOutput:
    """Embeddings of one call, in the order of the texts given.

    ``vectors`` is float32 of shape (n, dimension), normalized exactly as the
    model does by default (all-MiniLM-L6-v2 normalizes; a model without a
    Normalize module does not, and nothing here adds it). ``truncated[i]`` says
    text i had more tokens than the model reads.
    """

    vectors: np.ndarray
    truncated: list[bool]


@dataclass(frozen=True, slots=True)
class RerankOutput:
    """Relevance scores of documents for one query, in the order given.

    Higher is more relevant. A cross-encoder's scores are its ``predict``
    output (after its activation, a sigmoid for one label); cosine scores lie
    in [-1, 1]. ``truncated[i]`` says the model did not read all of pair i.
    """

    scores: list[float]
    truncated: list[bool]


def flag_truncated(lengths: Sequence[int], max_seq_length: int) -> list[bool]:
    """Which token lengths exceed what the model reads."""
    return [length > max_seq_length for length in lengths]


def _pick(items: Sequence, indices: Sequence[int]) -> list:
    return [items[i] for i in indices]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors. Implementations: SentenceTransformerEmbedder, FakeEmbedder."""

    @property
    def name(self) -> str:
        """The spec the model was loaded from: a label for logs and metrics."""
        ...

    @property
    def dimension(self) -> int: ...

    @property
    def max_seq_length(self) -> int:
        """Tokens read per text (special tokens included); the rest is truncated."""
        ...

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text with special tokens, not truncated."""
        ...

    def encode(self, texts: Sequence[str], *, lengths: Sequence[int] | None = None) -> EncodeOutput:
        """Embed ``texts`` in one model call (``lengths``: from token_lengths, if known)."""
        ...

    def encode_groups(
        self,
        texts: Sequence[str],
        groups: Sequence[Sequence[int]],
        *,
        lengths: Sequence[int] | None = None,
    ) -> Iterator[tuple[list[int], EncodeOutput]]:
        """Embed each micro-batch of indices in turn, one model call each.

        A generator, so the caller can publish a micro-batch's results before
        the next one runs.
        """
        for group in groups:
            indices = list(group)
            sub_lengths = None if lengths is None else _pick(lengths, indices)
            yield indices, self.encode(_pick(texts, indices), lengths=sub_lengths)


@runtime_checkable
class Reranker(Protocol):
    """Scores documents against a query. Implementations: CrossEncoderReranker,
    CosineReranker, FakeReranker."""

    @property
    def name(self) -> str: ...

    @property
    def method(self) -> RerankMethod:
        """ "cross-encoder" reads query and document together; "cosine" compares
        embeddings. Reported with results, since the scores are not comparable."""
        ...

    @property
    def max_seq_length(self) -> int: ...

    def token_lengths(self, query: str, documents: Sequence[str]) -> list[int]:
        """Tokens the model reads per document (not truncated); what micro-batches cost."""
        ...

    def score(
        self, query: str, documents: Sequence[str], *, lengths: Sequence[int] | None = None
    ) -> RerankOutput:
        """Score all ``documents`` in one model call."""
        ...

    def score_groups(
        self,
        query: str,
        documents: Sequence[str],
        groups: Sequence[Sequence[int]],
        *,
        lengths: Sequence[int] | None = None,
    ) -> Iterator[tuple[list[int], RerankOutput]]:
        """Score each micro-batch of document indices in turn, one call each."""
        for group in groups:
            indices = list(group)
            sub_lengths = None if lengths is None else _pick(lengths, indices)
            yield indices, self.score(query, _pick(documents, indices), lengths=sub_lengths)


def _cosine(query: np.ndarray, docs: np.ndarray) -> np.ndarray:
    # Explicit norms: the embedder may or may not normalize, cosine is defined
    # either way; a zero vector scores 0 rather than NaN.
    q_norm = float(np.linalg.norm(query))
    d_norm = np.linalg.norm(docs, axis=1)
    denom = d_norm * q_norm
    dots = docs @ query
    return np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)


class CosineReranker(Reranker):
    """Rerank by cosine similarity of embeddings from any :class:`Embedder`.

    The fallback where no cross-encoder is available (none loads offline here):
    a real embedding model ranks relevant documents first, a cross-encoder
    built from scratch does not. The query is embedded once per call, so a
    micro-batch costs its documents' tokens only.
    """

    method: RerankMethod = "cosine"

    def __init__(self, embedder: Embedder, *, name: str | None = None) -> None:
        self.embedder = embedder
        self._name = name or embedder.name

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_seq_length(self) -> int:
        return self.embedder.max_seq_length

    def token_lengths(self, query: str, documents: Sequence[str]) -> list[int]:
        return self.embedder.token_lengths(documents)

    def score(
        self, query: str, documents: Sequence[str], *, lengths: Sequence[int] | None = None
    ) -> RerankOutput:
        groups = [range(len(documents))]
        _, output = next(self.score_groups(query, documents, groups, lengths=lengths))
        return output

    def score_groups(
        self,
        query: str,
        documents: Sequence[str],
        groups: Sequence[Sequence[int]],
        *,
        lengths: Sequence[int] | None = None,
    ) -> Iterator[tuple[list[int], RerankOutput]]:
        if not any(len(g) for g in groups):
            yield from ((list(g), RerankOutput([], [])) for g in groups)
            return
        q = self.embedder.encode([query])
        q_vec, q_cut = q.vectors[0], q.truncated[0]
        for indices, out in self.embedder.encode_groups(documents, groups, lengths=lengths):
            scores = _cosine(q_vec, out.vectors).tolist() if indices else []
            yield indices, RerankOutput(scores, [q_cut or cut for cut in out.truncated])

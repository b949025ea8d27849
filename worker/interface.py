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

Request options reach the model as :class:`EncodeOptions` (a prompt, which
end to truncate, normalisation, Matryoshka dimensions) and, for rerankers,
a ``truncate`` side and :meth:`Reranker.cut_documents`. Callers pass them
only when they differ from the defaults, so an implementation written
before options existed keeps working for requests that use none.

This module imports numpy and the standard library only: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np

__all__ = [
    "DEFAULT_OPTIONS",
    "CosineReranker",
    "Embedder",
    "EncodeOptions",
    "EncodeOutput",
    "RerankMethod",
    "RerankOutput",
    "Reranker",
    "flag_truncated",
]

RerankMethod = Literal["cross-encoder", "cosine"]
TruncateSide = Literal["end", "start"]


@dataclass(frozen=True, slots=True)
class EncodeOptions:
    """How one model call embeds its texts; equal options can share a call.

    ``prompt``: text put before each input (None: the model's default
    prompt, if it has one). ``truncate``: which end of a too-long input is
    cut. ``normalize``: None keeps the model's own behaviour, True scales
    each vector to length 1 (after ``dimensions``), False skips any
    normalisation, the model's own Normalize module included.
    ``dimensions``: keep the first N values (None: all).
    """

    prompt: str | None = None
    truncate: TruncateSide = "end"
    normalize: bool | None = None
    dimensions: int | None = None


DEFAULT_OPTIONS = EncodeOptions()


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


T = TypeVar("T")


def _pick(items: Sequence[T], indices: Sequence[int]) -> list[T]:
    return [items[i] for i in indices]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors. Implementations: SentenceTransformerEmbedder, FakeEmbedder."""

    #: The spec the model was loaded from: a label for logs and metrics.
    name: str
    #: Values per vector (before any ``dimensions`` cut), fixed at load.
    dimension: int

    @property
    def max_seq_length(self) -> int:
        """Tokens read per text (special tokens included); the rest is truncated."""
        ...

    def token_lengths(self, texts: Sequence[str], *, prompt: str | None = None) -> list[int]:
        """Tokens per text with special tokens (and ``prompt`` before it), not truncated."""
        ...

    def encode(self, texts: Sequence[str], *, lengths: Sequence[int] | None = None,
               options: EncodeOptions = DEFAULT_OPTIONS) -> EncodeOutput:
        """Embed ``texts`` in one model call (``lengths``: from token_lengths, if known)."""
        ...

    def cut_texts(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        """Each text cut after its first ``max_tokens`` tokens (special tokens not
        counted); shorter texts unchanged."""
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

    #: The spec the model was loaded from: a label for logs and metrics.
    name: str

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
        self, query: str, documents: Sequence[str], *, lengths: Sequence[int] | None = None,
        truncate: TruncateSide = "end",
    ) -> RerankOutput:
        """Score all ``documents`` in one model call, cutting ``truncate``'s end of a too-long input."""
        ...

    def score_groups(
        self,
        query: str,
        documents: Sequence[str],
        groups: Sequence[Sequence[int]],
        *,
        lengths: Sequence[int] | None = None,
        truncate: TruncateSide = "end",
    ) -> Iterator[tuple[list[int], RerankOutput]]:
        """Score each micro-batch of document indices in turn, one call each."""
        extra = {} if truncate == "end" else {"truncate": truncate}
        for group in groups:
            indices = list(group)
            sub_lengths = None if lengths is None else _pick(lengths, indices)
            yield indices, self.score(query, _pick(documents, indices), lengths=sub_lengths,
                                      **extra)

    def cut_documents(self, documents: Sequence[str], max_tokens: int) -> list[str]:
        """Each document cut after its first ``max_tokens`` tokens (``max_tokens_per_doc``)."""
        ...


def _cosine(query: np.ndarray, docs: np.ndarray) -> np.ndarray:
    # Explicit norms: the embedder may or may not normalize, cosine is defined
    # either way; a zero vector scores 0 rather than NaN.
    q_norm = float(np.linalg.norm(query))
    d_norm = np.linalg.norm(docs, axis=1)
    denom = d_norm * q_norm
    dots = docs @ query
    scores: np.ndarray = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
    return scores


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
        self.name = name or embedder.name

    @property
    def max_seq_length(self) -> int:
        return self.embedder.max_seq_length

    def token_lengths(self, query: str, documents: Sequence[str]) -> list[int]:
        return self.embedder.token_lengths(documents)

    def cut_documents(self, documents: Sequence[str], max_tokens: int) -> list[str]:
        return self.embedder.cut_texts(documents, max_tokens)

    def score(
        self, query: str, documents: Sequence[str], *, lengths: Sequence[int] | None = None,
        truncate: TruncateSide = "end",
    ) -> RerankOutput:
        groups = [range(len(documents))]
        _, output = next(self.score_groups(query, documents, groups, lengths=lengths,
                                           truncate=truncate))
        return output

    def score_groups(
        self,
        query: str,
        documents: Sequence[str],
        groups: Sequence[Sequence[int]],
        *,
        lengths: Sequence[int] | None = None,
        truncate: TruncateSide = "end",
    ) -> Iterator[tuple[list[int], RerankOutput]]:
        if not any(len(g) for g in groups):
            yield from ((list(g), RerankOutput([], [])) for g in groups)
            return
        # Options only when asked: an embedder written before options existed still works.
        extra: dict[str, Any] = {} if truncate == "end" else {
            "options": EncodeOptions(truncate=truncate)}
        q = self.embedder.encode([query], **extra)
        q_vec, q_cut = q.vectors[0], q.truncated[0]
        for group in groups:
            indices = list(group)
            sub = None if lengths is None else _pick(lengths, indices)
            out = self.embedder.encode(_pick(documents, indices), lengths=sub, **extra)
            scores = _cosine(q_vec, out.vectors).tolist() if indices else []
            yield indices, RerankOutput(scores, [q_cut or cut for cut in out.truncated])

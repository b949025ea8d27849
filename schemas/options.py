"""Request options: the types of every option an embed or rerank input may carry.

The options are those users of Cohere's Embed and Rerank APIs, HuggingFace
text-embeddings-inference and sentence-transformers already know. Their
types (and so their decode-time limits) are declared here once, used by the
wire messages (:mod:`schemas.messages`), by the traffic-log reader
(:mod:`traffic.trace`) and by the client; what depends on the endpoint
(which prompts it lists, the model's size and length limit) is checked by
admission (:mod:`producer.options`).

Embed options
-------------

``input_type`` / ``prompt_name``
    A prompt the endpoint lists (``[endpoints.NAME.prompts]``): its text is
    put before every text, as ``SentenceTransformer.encode(prompt=...)``
    does. ``input_type`` is Cohere's name for it, ``prompt_name`` that of
    sentence-transformers and TEI; both look up the same table, and naming
    two different prompts is an error. Admission writes the prompt's text
    into ``prompt`` (a sender may not set it), so the worker embeds exactly
    what admission counted.
``truncate``
    ``end`` (the default, and the behaviour before options existed): the
    tokens past what the model reads are dropped; ``start``: the first ones
    are (TEI's ``truncation_direction = "Left"``); ``none``: an input longer
    than the model reads is refused at admission with its token count and
    the limit. Cohere's upper-case spellings are accepted.
``normalize``
    Absent: the model's own behaviour (all-MiniLM-L6-v2 ends in a Normalize
    module, so its vectors have length 1; a model without one is left as
    it is). ``true``: every vector is scaled to length 1, after
    ``dimensions`` cut it. ``false``: no normalisation at all, the model's
    own Normalize module skipped.
``dimensions``
    Matryoshka truncation: keep the first N values (sentence-transformers'
    ``truncate_dim``). Refused above the model's size. It is not cheaper:
    the model computes the whole vector first.
``embedding_types``
    Any of ``float``, ``int8``, ``uint8``, ``binary``, ``ubinary``, several at
    once (Cohere's ``embedding_types``, sentence-transformers'
    ``precision``). Default ``["float"]``. See :mod:`worker.quantize` for the
    semantics and the calibration.
``encoding``
    ``float``: vectors as JSON numbers (or msgpack numbers). ``base64``: each
    vector as its little-endian bytes (float32, int8 or uint8), which JSON
    carries as base64 (as OpenAI's ``encoding_format``) and msgpack as a
    binary; see :mod:`schemas.vectors`.

Rerank options
--------------

``max_tokens_per_doc`` (Cohere): each document is cut to this many tokens
before it is scored. ``return_documents`` (Cohere; TEI's ``return_text``):
the result carries the documents, in ranking order. ``truncate`` as above,
for what the model reads of each (query, document).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "EMBEDDING_TYPES",
    "MAX_DIMENSIONS",
    "Dimensions",
    "EmbeddingType",
    "EmbeddingTypes",
    "Encoding",
    "MaxTokensPerDoc",
    "PromptName",
    "PromptText",
    "RequestOptions",
    "Truncate",
    "TruncateSide",
    "truncate_of",
]

#: Accepted spellings; :func:`truncate_of` folds Cohere's upper case to ours.
Truncate = Literal["none", "end", "start", "NONE", "END", "START"]
#: What the model is told: which end to cut (``none`` never reaches a model).
TruncateSide = Literal["end", "start"]
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = ("float", "int8", "uint8", "binary", "ubinary")
Encoding = Literal["float", "base64"]
#: Far above any model's size; the model's own size is checked by admission.
MAX_DIMENSIONS = 65_536
Dimensions = Annotated[int, Meta(ge=1, le=MAX_DIMENSIONS)]
EmbeddingTypes = Annotated[list[EmbeddingType], Meta(min_length=1, max_length=5)]
PromptName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._\-]+\Z")]
#: A prompt's text, as admission resolved it from the endpoint's table.
PromptText = Annotated[str, Meta(max_length=4096)]
MaxTokensPerDoc = Annotated[int, Meta(ge=1, le=2**31 - 1)]


_CANONICAL_TRUNCATE: dict[str, Literal["none", "end", "start"]] = {
    "none": "none", "end": "end", "start": "start"}


def truncate_of(value: str) -> Literal["none", "end", "start"]:
    """The canonical (lower-case) form of a ``truncate`` value."""
    canonical = _CANONICAL_TRUNCATE.get(value.lower())
    if canonical is None:
        raise ValueError(f"truncate must be none, end or start, not {value!r}")
    return canonical


class RequestOptions(msgspec.Struct, kw_only=True, omit_defaults=True,
                     forbid_unknown_fields=True):
    """Every option of either input kind, as one flat record.

    What a traffic-log line carries (``"options": {...}``) and what the
    client's option flags build; an unknown key is an error here (a typo in
    a log must not replay as a silent default). Which kind an option belongs
    to is in the module docstring; :meth:`embed_fields` and
    :meth:`rerank_fields` split them.
    """

    input_type: PromptName | None = None
    prompt_name: PromptName | None = None
    truncate: Truncate | None = None
    normalize: bool | None = None
    dimensions: Dimensions | None = None
    embedding_types: EmbeddingTypes | None = None
    encoding: Encoding | None = None
    max_tokens_per_doc: MaxTokensPerDoc | None = None
    return_documents: bool | None = None

    def _given(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def embed_fields(self) -> dict[str, Any]:
        """The embed options given, as ``EmbedInput`` keyword arguments."""
        return self._given(_EMBED)

    def rerank_fields(self) -> dict[str, Any]:
        """The rerank options given, as ``RerankInput`` keyword arguments."""
        return self._given(_RERANK)

    def foreign_to(self, kind: str) -> list[str]:
        """Options given that the other input kind owns (``kind``: embed or rerank)."""
        own = _EMBED if kind == "embed" else _RERANK
        return [n for n in self.__struct_fields__
                if getattr(self, n) is not None and n not in own]


_EMBED = ("input_type", "prompt_name", "truncate", "normalize", "dimensions", "embedding_types",
          "encoding")
_RERANK = ("truncate", "max_tokens_per_doc", "return_documents")

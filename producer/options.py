"""Admission's part of the request options: check them against the endpoint, count the cost.

Pure: no I/O, no clock; :func:`producer.admission.decide` calls
:func:`resolve_input` after the size checks and before the rate limits.
The option types (and the limits a type can say) are in
:mod:`schemas.options`; a value the type refuses never gets here (the
decoder answers it ``invalid``/``decode_error``, naming the field). What
needs the endpoint is checked here, each refusal naming its field:

====================  ==========================================================
reason                when
====================  ==========================================================
``invalid_option``    ``input.prompt`` sent (admission sets it);
                      ``input_type`` and ``prompt_name`` name different prompts;
                      ``embedding_types`` lists a type twice
``unknown_prompt``    ``input_type`` / ``prompt_name`` not in the endpoint's
                      ``prompts``
``dimensions_too_large``  ``dimensions`` above the model's size (when the
                      model folder says it; else the worker refuses it)
``input_too_long``    ``truncate = "none"`` and an input has more tokens than
                      the model reads: the message gives its count and the
                      limit
====================  ==========================================================

Cost: a request costs the tokens the model computes. Each input's count
includes its prompt and is capped at what the model reads
(``max_seq_length``) when the request lets it truncate; with ``truncate =
"none"`` nothing longer is admitted, so the full count is the cost. A rerank
request's documents are cut to ``max_tokens_per_doc`` first. ``dimensions``
does not lower the cost: the model computes the whole vector and the worker
drops the rest. The embedding types cost nothing extra.

The admitted input carries the resolved prompt text (``prompt``) and the
canonical ``truncate``, so the worker embeds exactly what was counted, even
if the configuration changes while the request waits.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from schemas.config import Endpoint
from schemas.messages import EmbedInput, Input, RerankInput
from schemas.options import truncate_of
from tokens.counting import TokenCounter

__all__ = ["Costed", "OptionRefusal", "resolve_input"]


class OptionRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """An ``invalid`` answer: ``reason`` as in the module docstring, ``message`` names the field."""

    reason: str
    message: str
    tokens: int | None = None


class Costed(msgspec.Struct, frozen=True, kw_only=True):
    """The input as admitted (prompt resolved) and its cost in tokens."""

    input: Input
    tokens: int


def resolve_input(inp: Input, endpoint: str, ep: Endpoint,
                  counter: TokenCounter) -> Costed | OptionRefusal:
    """Check ``inp``'s options against endpoint ``endpoint`` and count its cost."""
    if isinstance(inp, EmbedInput):
        return _embed(inp, endpoint, ep, counter)
    return _rerank(inp, counter, ep)


def _embed(inp: EmbedInput, endpoint: str, ep: Endpoint,
           counter: TokenCounter) -> Costed | OptionRefusal:
    if inp.prompt is not None:
        return OptionRefusal(reason="invalid_option", message=(
            "input.prompt must not be set: admission sets it from input.input_type or "
            "input.prompt_name and the endpoint's prompts"))
    if inp.input_type is not None and inp.prompt_name is not None \
            and inp.input_type != inp.prompt_name:
        return OptionRefusal(reason="invalid_option", message=(
            f"input.input_type ({inp.input_type!r}) and input.prompt_name "
            f"({inp.prompt_name!r}) name different prompts: give one"))
    name = inp.input_type if inp.input_type is not None else inp.prompt_name
    prompt: str | None = None
    if name is not None:
        field = "input.input_type" if inp.input_type is not None else "input.prompt_name"
        if name not in ep.prompts:
            listed = ", ".join(sorted(ep.prompts)) or "none: it takes no input_type or prompt_name"
            return OptionRefusal(reason="unknown_prompt", message=(
                f"{field} {name!r} is not a prompt of endpoint {endpoint!r} (prompts: {listed})"))
        prompt = ep.prompts[name]
    if inp.embedding_types is not None:
        seen: set[str] = set()
        for t in inp.embedding_types:
            if t in seen:
                return OptionRefusal(reason="invalid_option", message=(
                    f"input.embedding_types lists {t!r} twice"))
            seen.add(t)
    dimension = getattr(counter, "dimension", None)
    if inp.dimensions is not None and dimension is not None and inp.dimensions > dimension:
        return OptionRefusal(reason="dimensions_too_large", message=(
            f"input.dimensions = {inp.dimensions} is above the {dimension} dimensions of "
            f"endpoint {endpoint!r}'s model"))
    truncate = truncate_of(inp.truncate)
    texts = [prompt + t for t in inp.texts] if prompt else inp.texts
    counts = counter.count(texts)
    limit = counter.max_seq_length
    if truncate == "none" and limit is not None:
        for i, n in enumerate(counts):
            if n > limit:
                with_prompt = " (prompt included)" if prompt else ""
                return OptionRefusal(reason="input_too_long", tokens=max(1, sum(counts)),
                                     message=_too_long(f"input.texts[{i}]", n, with_prompt, limit))
    tokens = _computed(counts, limit if truncate != "none" else None)
    resolved = msgspec.structs.replace(inp, prompt=prompt, truncate=truncate)
    return Costed(input=resolved, tokens=tokens)


def _rerank(inp: RerankInput, counter: TokenCounter, ep: Endpoint) -> Costed | OptionRefusal:
    truncate = truncate_of(inp.truncate)
    pairs = counter.count_pairs(inp.query, inp.documents)
    cut = inp.max_tokens_per_doc
    if cut is not None:
        # A pair of the query and an empty document: the query and the special tokens.
        base = counter.count_pairs(inp.query, [""])[0]
        pairs = [min(p, base + cut) for p in pairs]
    limit = counter.max_seq_length
    if truncate == "none" and limit is not None:
        method = ep.rerank_method
        if method == "auto":
            kind = getattr(counter, "model_kind", None)
            method = ("cross-encoder" if kind == "cross-encoder"
                      else "cosine" if kind == "embedding" else "auto")
        refusal = _rerank_too_long(inp, counter, method, pairs, cut, limit)
        if refusal is not None:
            return refusal
    tokens = _computed(pairs, limit if truncate != "none" else None)
    return Costed(input=msgspec.structs.replace(inp, truncate=truncate), tokens=tokens)


def _rerank_too_long(inp: RerankInput, counter: TokenCounter, method: str, pairs: list[int],
                     cut: int | None, limit: int) -> OptionRefusal | None:
    """With ``truncate = "none"``: the first input the model would have to cut, if any.

    A cross-encoder reads each (query, document) pair; a cosine reranker
    embeds the query and each document on their own. When the method is
    unknown here (a hub model with ``rerank_method = "auto"``) the worker
    checks instead.
    """
    if method == "cross-encoder":
        for i, n in enumerate(pairs):
            if n > limit:
                return OptionRefusal(reason="input_too_long", tokens=sum(pairs), message=_too_long(
                    f"input.documents[{i}] with input.query", n, "", limit))
    elif method == "cosine":
        query = counter.count([inp.query])[0]
        if query > limit:
            return OptionRefusal(reason="input_too_long", tokens=sum(pairs),
                                 message=_too_long("input.query", query, "", limit))
        docs = counter.count(inp.documents)
        if cut is not None:
            specials = counter.count([""])[0]
            docs = [min(d, specials + cut) for d in docs]
        for i, n in enumerate(docs):
            if n > limit:
                return OptionRefusal(reason="input_too_long", tokens=sum(pairs),
                                     message=_too_long(f"input.documents[{i}]", n, "", limit))
    return None


def _too_long(what: str, n: int, note: str, limit: int) -> str:
    return (f"{what} has {n} tokens{note}, more than the {limit} the model reads, and "
            f"input.truncate is 'none' (use 'end' or 'start' to let the model cut it)")


def _computed(counts: Sequence[int], limit: int | None) -> int:
    """Tokens the model computes: each count capped at ``limit`` (None: as counted); >= 1."""
    if limit is not None:
        counts = [min(n, limit) for n in counts]
    # An empty text still occupies a slot in a batch: it is never free.
    return max(1, sum(counts))

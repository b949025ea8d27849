"""The worker's side of the request options, on the fake models: types, encodings, refusals.

The same options are checked against sentence-transformers with the real
MiniLM in ``tests/integration/test_options_minilm.py``; here they run in
microseconds, with the fake's hand-checkable vectors.
"""

from __future__ import annotations

import base64
import struct

import msgspec
import numpy as np
import pytest

from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, Batch, EmbedInput, RerankInput, Result
from schemas.vectors import decode_embeddings, result_fields
from worker.calibration import CALIBRATION_TEXTS
from worker.execute import BatchExecutor
from worker.fake import FakeEmbedder, FakeReranker
from worker.interface import DEFAULT_OPTIONS, EncodeOptions
from worker.quantize import quantize, ranges_of

_results = codec_for(Result)


def req(i: int, inp, org: str = "a") -> AdmittedRequest:
    return AdmittedRequest(id=f"r{i}", org=org, endpoint="e", tier="t", input=inp, tokens=3,
                           created_ms=1, admitted_ms=2, reply_to="sf.results")


async def serve(ex: BatchExecutor, *inputs) -> list[Result]:
    b = Batch(id="b", endpoint="e", requests=[req(i, inp) for i, inp in enumerate(inputs)],
              tokens=3, created_ms=3)
    out: dict[str, Result] = {}
    async for done in ex.serve(b):
        for s in done:
            assert s.result.id not in out
            out[s.result.id] = s.result
    return [out[f"r{i}"] for i in range(len(inputs))]


def embedder(**kw) -> tuple[FakeEmbedder, BatchExecutor]:
    model = FakeEmbedder(dim=kw.pop("dim", 16), max_seq_length=kw.pop("max_seq_length", 8), **kw)
    return model, BatchExecutor(model, "embed", worker="w", inline=True)


TEXTS = ["alpha beta", "gamma delta epsilon", "zeta"]


# -- quantisation semantics ----------------------------------------------------------


def test_quantize_int8_uint8_follow_the_ranges_and_clip():
    """int8/uint8: floor((x - min) / ((max - min) / 255)), clipped to 0..255, int8 minus 128."""
    ranges = np.array([[-1.0, 0.0], [1.0, 0.0]], dtype=np.float32)  # dim 1 has no range
    x = np.array([[-1.0, 0.0], [1.0, 5.0], [0.0, -5.0], [3.0, 0.0]], dtype=np.float32)
    u = quantize(x, "uint8", ranges)
    assert u.dtype == np.uint8
    # 0.0 -> floor(127.5); 3.0 clipped; the max itself lands in 254 by float32 rounding
    # (2 / (2 / 255) = 254.99998), as in sentence-transformers.
    assert u[:, 0].tolist() == [0, 254, 127, 255]
    assert u[:, 1].tolist() == [0, 5, 0, 0]  # step 1 where max == min, clipped at 0
    assert quantize(x, "int8", ranges).tolist() == (u.astype(int) - 128).tolist()
    with pytest.raises(ValueError, match="needs calibration"):
        quantize(x, "int8")


def test_quantize_binary_packs_signs_high_bit_first():
    """binary/ubinary: one bit per value > 0, eight to a byte; binary is the byte minus 128."""
    x = np.array([[1, -1, 0, 2, -3, 4, 5, -6, 7]], dtype=np.float32)
    assert quantize(x, "ubinary").tolist() == [[0b10010110, 0b10000000]]
    assert quantize(x, "binary").tolist() == [[0b10010110 - 128, 0]]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_every_type_round_trips_through_a_result(fmt, encoding):
    """Each type survives encode/decode of a Result in both formats and both encodings."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3, 20)).astype(np.float32)
    ranges = ranges_of(rng.standard_normal((50, 20)))
    arrays = {t: quantize(vectors, t, ranges) for t in ("float", "int8", "uint8", "binary",
                                                          "ubinary")}
    result = Result(id="x", status="ok", **result_fields(arrays, encoding))
    back = decode_embeddings(_results.decode(_results.encode(result, fmt), fmt))
    assert set(back) == set(arrays)
    for t, a in arrays.items():
        assert back[t].dtype == a.dtype and np.array_equal(back[t], a), t


def test_packed_json_is_base64_of_little_endian_bytes():
    """Any client can read a packed vector: base64 of float32 little-endian, int8 as bytes."""
    v = np.array([[1.5, -2.0, 0.25]], dtype=np.float32)
    r = Result(id="x", status="ok", **result_fields(
        {"float": v, "int8": np.array([[-1, 2, 127]], dtype=np.int8)}, "base64"))
    wire = msgspec.json.decode(_results.encode(r, "json"))
    raw = base64.b64decode(wire["embeddings_packed"]["float"][0])
    assert raw == struct.pack("<3f", 1.5, -2.0, 0.25)
    assert base64.b64decode(wire["embeddings_packed"]["int8"][0]) == bytes([255, 2, 127])
    mp = msgspec.msgpack.decode(_results.encode(r, "msgpack"))
    assert mp["embeddings_packed"]["float"][0] == raw  # msgpack: the same bytes, as a binary


def test_base64_json_is_smaller_than_numbers():
    """One 384-value float vector: base64 in JSON is about a quarter of the numbers' bytes."""
    v = np.random.default_rng(1).standard_normal((1, 384)).astype(np.float32)
    numbers = _results.encode(Result(id="x", status="ok", **result_fields({"float": v}, "float")),
                              "json")
    packed = _results.encode(Result(id="x", status="ok", **result_fields({"float": v}, "base64")),
                             "json")
    assert len(packed) < len(numbers) / 3


# -- the executor applies the options ---------------------------------------------------


async def test_default_request_is_served_as_before():
    """No options: float vectors as numbers, exactly the model's, with their dimensions."""
    model, ex = embedder()
    (r,) = await serve(ex, EmbedInput(texts=TEXTS))
    assert r.status == "ok" and r.embeddings == model.encode(TEXTS).vectors.tolist()
    assert r.dimensions == 16 and r.embeddings_by_type is None and r.embeddings_packed is None


async def test_each_option_reaches_the_model():
    """prompt, truncate=start, normalize, dimensions give what the model gives with them."""
    model, ex = embedder()
    long = " ".join(f"w{i}" for i in range(12))
    cases = [
        (EmbedInput(texts=TEXTS, prompt="find: "), EncodeOptions(prompt="find: ")),
        (EmbedInput(texts=(long,), truncate="start"), EncodeOptions(truncate="start")),
        (EmbedInput(texts=TEXTS, normalize=False), EncodeOptions(normalize=False)),
        (EmbedInput(texts=TEXTS, dimensions=4, normalize=True),
         EncodeOptions(dimensions=4, normalize=True)),
        (EmbedInput(texts=TEXTS, dimensions=4), EncodeOptions(dimensions=4)),
    ]
    results = await serve(ex, *[c[0] for c in cases])
    for (inp, options), r in zip(cases, results, strict=True):
        assert r.status == "ok", r
        want = model.encode(inp.texts, options=options).vectors
        assert np.array_equal(np.asarray(r.embeddings, dtype=np.float32), want), options
        assert r.dimensions == want.shape[1]
    plain = model.encode(TEXTS).vectors
    assert not np.allclose(results[0].embeddings, plain)  # the prompt changed the vectors
    assert results[1].truncated == [True]
    assert np.allclose(np.linalg.norm(results[3].embeddings, axis=1), 1.0)
    assert not np.allclose(np.linalg.norm(results[4].embeddings, axis=1), 1.0)


async def test_requests_with_different_options_share_no_model_call():
    """A micro-batch mixing option sets makes one model call per set; equal sets share one."""
    calls = []

    class Counting(FakeEmbedder):
        def encode(self, texts, *, lengths=None, options=DEFAULT_OPTIONS):
            calls.append((len(texts), options))
            return super().encode(texts, lengths=lengths, options=options)

    ex = BatchExecutor(Counting(dim=8), "embed", worker="w", inline=True)
    await serve(ex, EmbedInput(texts=("a", "b")), EmbedInput(texts=("c",), dimensions=2),
                EmbedInput(texts=("d",)))
    assert sorted(calls, key=lambda c: c[0]) == [(1, EncodeOptions(dimensions=2)),
                                                 (3, EncodeOptions())]


async def test_embedding_types_and_encodings():
    """Several types at once, as numbers or packed, each what quantize() gives on the floats."""
    model, ex = embedder()
    types = ["ubinary", "float", "int8", "uint8", "binary"]
    numbers, packed = await serve(ex, EmbedInput(texts=TEXTS, embedding_types=types),
                                  EmbedInput(texts=TEXTS, embedding_types=types,
                                             encoding="base64"))
    floats = model.encode(TEXTS).vectors
    ranges = ranges_of(model.encode(list(CALIBRATION_TEXTS)).vectors)
    assert numbers.embeddings == floats.tolist()
    assert set(numbers.embeddings_by_type) == {"int8", "uint8", "binary", "ubinary"}
    assert packed.embeddings is None and packed.embeddings_by_type is None
    assert set(packed.embeddings_packed) == set(types)
    for r in (numbers, packed):
        got = decode_embeddings(r)
        for t in types:
            assert np.array_equal(got[t], quantize(floats, t, ranges)), (t, r.embeddings_packed)
    assert ex.calibration.computed == 1  # both requests used the one calibration


async def test_calibration_follows_the_options_that_move_the_ranges():
    """int8 ranges are computed per (prompt, normalize, dimensions), each once."""
    model, ex = embedder()
    inp = EmbedInput(texts=TEXTS, embedding_types=["int8"], dimensions=4, normalize=True)
    (r,) = await serve(ex, inp)
    calib = model.encode(list(CALIBRATION_TEXTS),
                         options=EncodeOptions(dimensions=4, normalize=True)).vectors
    floats = model.encode(TEXTS, options=EncodeOptions(dimensions=4, normalize=True)).vectors
    assert r.embeddings_by_type["int8"] == quantize(floats, "int8", ranges_of(calib)).tolist()
    await serve(ex, inp, EmbedInput(texts=("x",), embedding_types=["uint8"], dimensions=4,
                                    normalize=True))
    assert ex.calibration.computed == 1
    await serve(ex, EmbedInput(texts=("x",), embedding_types=["uint8"]))
    assert ex.calibration.computed == 2


async def test_worker_refuses_what_admission_should_have():
    """dimensions above the model and truncate=none on a long text are invalid, alone."""
    _, ex = embedder()
    long = " ".join(["w"] * 9)
    too_big, too_long, fine = await serve(ex, EmbedInput(texts=("a",), dimensions=17),
                                          EmbedInput(texts=("a", long), truncate="none"),
                                          EmbedInput(texts=(long,)))
    assert (too_big.status, too_big.reason) == ("invalid", "dimensions_too_large")
    assert "input.dimensions = 17" in too_big.message and "16" in too_big.message
    assert (too_long.status, too_long.reason) == ("invalid", "input_too_long")
    assert "input.texts[1] has 9 tokens" in too_long.message and "8" in too_long.message
    assert fine.status == "ok" and fine.truncated == [True]


async def test_failed_calibration_fails_only_the_requests_that_need_it():
    """A model that breaks on the calibration set fails the int8 request, not its neighbours."""

    class NoCalibration(FakeEmbedder):
        def encode(self, texts, *, lengths=None, options=DEFAULT_OPTIONS):
            if len(texts) == len(CALIBRATION_TEXTS):
                raise RuntimeError("boom")
            return super().encode(texts, lengths=lengths, options=options)

    ex = BatchExecutor(NoCalibration(), "embed", worker="w", inline=True)
    bad, good = await serve(ex, EmbedInput(texts=("a",), embedding_types=["int8"]),
                            EmbedInput(texts=("a",), embedding_types=["binary"]))
    assert bad.status == "failed" and "calibration failed" in bad.message
    assert good.status == "ok" and good.embeddings_by_type["binary"]


# -- rerank ---------------------------------------------------------------------------------


def reranker(**kw) -> tuple[FakeReranker, BatchExecutor]:
    model = FakeReranker(max_seq_length=kw.pop("max_seq_length", 8), **kw)
    return model, BatchExecutor(model, "rerank", worker="w", inline=True)


async def test_rerank_options():
    """max_tokens_per_doc scores the cut documents; return_documents sends them in rank order."""
    model, ex = reranker()
    docs = ["cat dog fish bird", "fish", "river city"]
    cut, back = await serve(
        ex, RerankInput(query="fish", documents=docs, max_tokens_per_doc=1),
        RerankInput(query="fish", documents=docs, return_documents=True, top_n=2))
    assert cut.scores == model.score("fish", ["cat", "fish", "river"]).scores
    assert back.documents == [docs[i] for i in back.ranking] and len(back.documents) == 2
    assert cut.documents is None


async def test_rerank_truncate():
    """truncate=start keeps a document's last tokens; truncate=none refuses a long one."""
    model, ex = reranker(max_seq_length=3)
    long = "a b c fish"
    start, none, end = await serve(
        ex, RerankInput(query="fish", documents=(long,), truncate="start"),
        RerankInput(query="fish", documents=("fish", long), truncate="none"),
        RerankInput(query="fish", documents=(long,)))
    assert start.scores == model.score("fish", ["b c fish"]).scores
    assert end.scores == model.score("fish", ["a b c"]).scores != start.scores
    assert (none.status, none.reason) == ("invalid", "input_too_long")
    assert "input.documents[1] has 4 tokens" in none.message


async def test_rerank_truncate_none_refuses_a_long_query_after_the_fact():
    """A cosine reranker's query is not in its token lengths: its cut still refuses the request."""
    _, ex = reranker(max_seq_length=2)
    (r,) = await serve(ex, RerankInput(query="a b c", documents=("d",), truncate="none"))
    assert (r.status, r.reason) == ("invalid", "input_too_long")

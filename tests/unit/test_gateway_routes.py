"""The gateway's pure parts: keys as hashes, each API's field mapping, outcomes, OpenAPI."""

from __future__ import annotations

import base64

import msgspec
import numpy as np
import pytest

from gateway import cohere_api, openai_api, tei_api
from gateway.call import Call, Failure, failure_of, retry_after_s
from gateway.catalog import Catalog
from gateway.keys import KEY_PREFIX, KeyRing, hash_key, new_key
from gateway.openapi import openapi_document
from gateway.route import cohere_priority
from gateway.service import routes
from schemas.build import build_config
from schemas.config import ConfigError
from schemas.messages import EmbedInput, RerankInput, Result

KEY = new_key()


def catalog(**orgs) -> Catalog:
    cfg = build_config(
        endpoints={"embed": {"model": "fake:dim=16,max_seq_length=64",
                             "prompts": {"search_query": "q: "}, "priority_cap": {"gold": 9}},
                   "plain": {"kind": "embed", "model": "fake"},
                   "rerank": {"kind": "rerank", "model": "fake"}},
        orgs={"acme": {"tier": "gold", "api_keys": [hash_key(KEY)]}, **orgs}).config
    return Catalog(cfg)


# -- keys ----------------------------------------------------------------------


def test_keys_are_random_and_stored_as_their_hash():
    """A new key is sf- and 43 url-safe characters; the registry sees sha256 hex of it only."""
    a, b = new_key(), new_key()
    assert a != b and a.startswith(KEY_PREFIX) and len(a) == len(KEY_PREFIX) + 43
    h = hash_key(a)
    assert h.startswith("sha256:") and len(h) == 7 + 64 and a.removeprefix("sf-") not in h


def test_key_ring_answers_one_none_whatever_was_wrong():
    """Bearer of a listed key: its org; missing, other scheme, unknown, revoked, huge: None."""
    ring = catalog().keys
    assert ring.org_of(f"Bearer {KEY}") == "acme"
    assert ring.org_of(f"bearer   {KEY}  ") == "acme"
    for bad in (None, "", "Bearer", f"Basic {KEY}", f"Bearer {KEY}x", "Bearer " + "a" * 10_000,
                KEY, f"Bearer {new_key()}"):
        assert ring.org_of(bad) is None, bad
    revoked = KeyRing({"acme": []})
    assert revoked.org_of(f"Bearer {KEY}") is None and len(revoked) == 0


def test_config_refuses_a_hash_listed_for_two_orgs_and_malformed_hashes():
    """One key proves one org; a hash must be sha256:<64 hex>."""
    h = hash_key(KEY)
    with pytest.raises(ConfigError, match=r"already listed for org 'a'"):
        build_config(orgs={"a": {"tier": "gold", "api_keys": [h]},
                           "b": {"tier": "gold", "api_keys": [h]}})
    with pytest.raises(ConfigError, match=r"api_keys\[1\]: this hash is already listed"):
        build_config(orgs={"a": {"tier": "gold", "api_keys": [h, h]}})
    for bad in (KEY, "sha256:" + "0" * 63, "md5:" + "0" * 64, "sha256:" + "G" * 64):
        with pytest.raises(ConfigError, match="api_keys"):
            build_config(orgs={"a": {"tier": "gold", "api_keys": [bad]}})


# -- outcomes --------------------------------------------------------------------


@pytest.mark.parametrize(("status", "reason", "http"), [
    ("rejected", "rate_limited", 429), ("rejected", "throttled", 429),
    ("rejected", "overloaded", 429), ("invalid", "decode_error", 400),
    ("invalid", "unknown_prompt", 400), ("expired", "deadline_passed", 504),
    ("failed", "model_error", 500)])
def test_every_outcome_has_its_status(status, reason, http):
    """rejected 429, invalid 400, expired 504, failed 500; ok is no failure."""
    f = failure_of(Result(id="r", status=status, reason=reason, message="m",
                          retry_after_ms=2500 if status == "rejected" else None))
    assert f.status == http and f.code == reason
    assert (f.retry_after_ms == 2500) == (status == "rejected")
    assert failure_of(Result(id="r", status="ok")) is None


def test_retry_after_is_whole_seconds_never_zero_and_a_param_is_named():
    assert [retry_after_s(ms) for ms in (0, 1, 999, 1000, 1001, 2500)] == \
        ["1", "1", "1", "1", "2", "3"]
    f = failure_of(Result(id="r", status="invalid", reason="decode_error",
                          message="Expected `int`, got `str` - at `$.input.dimensions`"))
    assert f.param == "dimensions"


def test_cohere_priority_maps_lower_first_into_the_tier_cap():
    """0 is the cap, 999 is 0, absent is the default 0; never above the cap."""
    assert cohere_priority(None, 9) == 0
    assert cohere_priority(0, 9) == 9 and cohere_priority(999, 9) == 0
    assert cohere_priority(500, 9) == 4 and cohere_priority(0, 0) == 0
    mapped = [cohere_priority(p, 5) for p in range(1000)]
    assert mapped == sorted(mapped, reverse=True) and max(mapped) == 5


# -- OpenAI ----------------------------------------------------------------------


def _decode(route, body: dict):
    return msgspec.json.decode(msgspec.json.encode(body), type=route.request_type)


def test_openai_input_and_model_mapping():
    """A string or strings embed on the named endpoint; token ids 400; unknown or rerank 404."""
    route, cat = openai_api.EmbeddingsRoute(), catalog()
    call = route.call(_decode(route, {"model": "embed", "input": "hi", "dimensions": 8}),
                      "acme", cat)
    assert isinstance(call, Call) and call.endpoint == "embed"
    assert call.input == EmbedInput(texts=("hi",), dimensions=8, normalize=True,
                                    embedding_types=["float"], encoding="base64")
    for model, status in (("nope", 404), ("rerank", 404)):
        f = route.call(_decode(route, {"model": model, "input": "hi"}), "acme", cat)
        assert isinstance(f, Failure) and f.status == status and f.param == "model"
    for ids in ([1, 2], [[1, 2]], ["a", 3]):
        f = route.call(_decode(route, {"model": "embed", "input": ids}), "acme", cat)
        assert isinstance(f, Failure) and f.status == 400 and f.param == "input"
    with pytest.raises(msgspec.ValidationError):
        _decode(route, {"model": "embed", "input": []})


def test_openai_answer_in_float_or_base64():
    """Numbers, or the float32 bytes as base64 (what the SDK decodes); usage is the tokens."""
    route = openai_api.EmbeddingsRoute()
    vecs = np.array([[0.5, -1.25, 3.0], [1e-8, 2.0, -0.1]], dtype="<f4")
    result = Result(id="r", status="ok", tokens=7,
                    embeddings_packed={"float": [v.tobytes() for v in vecs]})
    for b64 in (False, True):
        out = route.answer(result, Call("embed", EmbedInput(texts=("a", "b")), 0,
                                        {"base64": b64}), catalog())
        got = [np.frombuffer(base64.b64decode(d.embedding), "<f4") if b64 else
               np.array(d.embedding, dtype="<f4") for d in out.data]
        np.testing.assert_array_equal(np.vstack(got), vecs)
        assert [d.index for d in out.data] == [0, 1]
        assert out.usage.prompt_tokens == out.usage.total_tokens == 7


# -- Cohere ----------------------------------------------------------------------


def test_cohere_embed_mapping():
    """texts or inputs; input_type only where the endpoint lists prompts; types and priority."""
    route, cat = cohere_api.EmbedRoute(), catalog()
    call = route.call(_decode(route, {
        "model": "embed", "texts": ["a"], "input_type": "search_query", "truncate": "NONE",
        "embedding_types": ["base64", "int8", "float"], "output_dimension": 8, "priority": 0}),
        "acme", cat)
    assert call.input.input_type == "search_query" and call.input.truncate == "NONE"
    assert call.input.embedding_types == ["float", "int8"] and call.input.dimensions == 8
    assert call.priority == 9 and call.extra["types"] == ["base64", "int8", "float"]
    call = route.call(_decode(route, {"model": "plain", "input_type": "search_query",
                                      "inputs": [{"content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}]}),
                      "acme", cat)
    assert call.input.texts == ("a b",) and call.input.input_type is None and call.priority == 0
    for body, param in (({"images": ["data:x"], "texts": ["a"]}, "images"),
                        ({"inputs": [{"content": [{"type": "image_url",
                                                   "image_url": {"url": "x"}}]}]},
                         "inputs[0].content"),
                        ({}, "texts"), ({"texts": ["a"], "inputs": []}, "texts"),
                        ({"texts": ["a"], "max_tokens": 10}, "max_tokens")):
        f = route.call(_decode(route, {"model": "embed", **body}), "acme", cat)
        assert isinstance(f, Failure) and f.status == 400 and f.param == param, body
    ok = route.call(_decode(route, {"model": "embed", "texts": ["a"], "max_tokens": 64}),
                    "acme", cat)
    assert isinstance(ok, Call)


def test_cohere_embed_answer_by_type():
    """Each asked type under its name; base64 is the float bytes; numbers for the rest."""
    route = cohere_api.EmbedRoute()
    vec = np.array([[0.5, -0.25, 0.0, 1.0, -1.0, 0.1, 0.2, -0.3]], dtype="<f4")
    int8 = np.array([[5, -3, 0, 127, -128, 1, 2, -4]], dtype="i1")
    ubinary = np.packbits(vec > 0, axis=1)
    result = Result(id="abc", status="ok", tokens=3, embeddings_packed={
        "float": [vec[0].tobytes()], "int8": [int8[0].tobytes()],
        "ubinary": [ubinary[0].tobytes()]})
    call = Call("embed", EmbedInput(texts=("t",)), 0,
                {"types": ["float", "int8", "ubinary", "base64"], "texts": ["t"]})
    out = msgspec.json.decode(msgspec.json.encode(route.answer(result, call, catalog())))
    assert out["id"] == "abc" and out["texts"] == ["t"]
    assert out["response_type"] == "embeddings_by_type"
    assert out["meta"]["billed_units"] == {"input_tokens": 3}
    emb = out["embeddings"]
    assert set(emb) == {"float", "int8", "ubinary", "base64"}
    np.testing.assert_array_equal(np.array(emb["float"], "<f4"), vec)
    assert emb["int8"] == int8.tolist() and emb["ubinary"] == ubinary.tolist()
    assert base64.b64decode(emb["base64"][0]) == vec[0].tobytes()


def test_cohere_rerank_mapping_and_answer():
    route, cat = cohere_api.RerankRoute(), catalog()
    call = route.call(_decode(route, {"model": "rerank", "query": "q", "documents": ["a", "b"],
                                      "top_n": 1, "max_tokens_per_doc": 5, "priority": 999}),
                      "acme", cat)
    assert call.input == RerankInput(query="q", documents=("a", "b"), top_n=1,
                                     max_tokens_per_doc=5)
    assert route.call(_decode(route, {"model": "embed", "query": "q", "documents": ["a"]}),
                      "acme", cat).status == 404
    out = route.answer(Result(id="x", status="ok", scores=[0.1, 0.9, 0.5], ranking=[1, 2]),
                       call, cat)
    assert [(r.index, r.relevance_score) for r in out.results] == [(1, 0.9), (2, 0.5)]


# -- TEI -------------------------------------------------------------------------


@pytest.mark.parametrize(("truncate", "direction", "want"), [
    (None, "Right", "end"), (True, "Right", "end"), (True, "Left", "start"),
    (None, "left", "start"), (False, "Left", "none")])
def test_tei_truncation(truncate, direction, want):
    route = tei_api.EmbedRoute()
    body = {"inputs": "x", "truncation_direction": direction}
    if truncate is not None:
        body["truncate"] = truncate
    call = route.call(_decode(route, body), "acme", catalog())
    assert call.endpoint == "embed" and call.input.truncate == want
    assert call.input.normalize is True


def test_tei_rerank_sorted_with_texts_and_errors_are_422():
    route, cat = tei_api.RerankRoute(), catalog()
    call = route.call(_decode(route, {"query": "q", "texts": ["a", "b", "c"],
                                      "return_text": True}), "acme", cat)
    out = route.answer(Result(id="x", status="ok", scores=[0.2, 0.9, 0.5]), call, cat)
    assert [(r.index, r.text) for r in out] == [(1, "b"), (2, "c"), (0, "a")]
    assert route.status(Failure(400, "invalid", "m")) == 422
    assert route.error(Failure(429, "throttled", "m")).error_type == "overloaded"


def test_tei_info_reads_the_model_without_loading_it():
    info = tei_api.InfoRoute(100).get(catalog(), None)
    assert info.max_input_length == 64 and info.max_batch_requests == 64
    assert info.max_concurrent_requests == 100


# -- OpenAPI ---------------------------------------------------------------------


def test_openapi_is_generated_from_the_decoding_types():
    """Every route under its path, bodies' schemas from the same Structs (a new field shows)."""
    doc = openapi_document(routes()[:-1])
    assert set(doc["paths"]) == {"/v1/embeddings", "/v1/models", "/v2/embed", "/v2/rerank",
                                 "/embed", "/rerank", "/info", "/health"}
    schemas = doc["components"]["schemas"]
    assert set(schemas["EmbeddingsRequest"]["properties"]) == \
        set(openai_api.EmbeddingsRequest.__struct_fields__)
    post = doc["paths"]["/v2/embed"]["post"]
    assert post["security"] == [{"bearer": []}] and {"200", "401", "429"} <= set(post["responses"])
    assert "422" in doc["paths"]["/embed"]["post"]["responses"]
    assert "security" not in doc["paths"]["/info"]["get"]

    class Extended(openai_api.EmbeddingsRequest, kw_only=True):
        brand_new_field: int = 0

    class R(openai_api.EmbeddingsRoute):
        request_type = Extended
    props = openapi_document([R()])["components"]["schemas"]["Extended"]["properties"]
    assert "brand_new_field" in props


# -- serving-fairness keys ---------------------------------------------------------


def test_keys_new_prints_the_key_once_and_its_hash_line(capsys, tmp_path):
    """`keys new --org X`: the key, and the api_keys line whose hash is that key's."""
    from app.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(build_config(orgs={"acme": "gold"}).text)
    assert main(["keys", "new", "--org", "acme", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out.splitlines()
    key = out[0].rsplit(" ", 1)[-1]
    assert key.startswith(KEY_PREFIX) and out[-1] == f'api_keys = ["{hash_key(key)}"]'
    assert sum(key in line for line in out) == 1
    assert main(["keys", "new", "--org", "nobody", "--config", str(cfg)]) == 2
    assert "nobody" in capsys.readouterr().err


def test_keys_hash_reads_standard_input(capsys, monkeypatch):
    import io

    from app.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(KEY + "\n"))
    assert main(["keys", "hash"]) == 0
    assert capsys.readouterr().out.strip() == hash_key(KEY)
